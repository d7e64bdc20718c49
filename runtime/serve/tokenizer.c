/* tokenizer.c - byte-level BPE as GPT-2 and Llama 3 use it, read from a Hugging Face
 * tokenizer.json or from GPT-2's vocab.json + merges.txt (serve.h).
 *
 * Pipeline position: runtime/serve/; server.c encodes prompts and decodes completions with it.
 *
 * Encoding, as Hugging Face's `tokenizers` does it for these models:
 *   1. added tokens (tokenizer.json's added_tokens, e.g. <|endoftext|>, <|eot_id|>) written in the
 *      text are matched first, longest first, and become their ids;
 *   2. the rest is split into pre-tokens by the model's regular expression, hand-written here:
 *      GPT-2's  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      and Llama 3's (chosen when the pre-tokenizer's pattern has \p{N}{1,3})
 *      (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   3. each pre-token's UTF-8 bytes become GPT-2's byte-to-unicode symbols, which the merges
 *      combine, lowest rank first (with ignore_merges, a pre-token that is itself in the vocabulary
 *      is taken whole, as Llama 3's tokenizer.json asks).
 * Letter and number classes: ASCII exactly; beyond it, glibc's C.UTF-8 classes (iswalpha for
 * \p{L}, iswspace for \s) stand in for Unicode's, and only ASCII digits count as \p{N} - so text
 * with non-ASCII digits or letter-like marks can split differently from `tokenizers`
 * (docs/serve.md, "Tokenizers"). Decoding maps each token's symbols back to bytes. */
#include <errno.h>
#include <jansson.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "serve.h"

struct SvTokenizer {
    int64_t nvocab; /* ids are below this */
    char **str;     /* id -> the token's text as tokenizer.json writes it (symbols), or NULL */
    char **bytes;   /* id -> its decoded bytes */
    size_t *nbytes;
    int32_t *smap; /* open addressing: token text -> id; -1 empty */
    uint64_t smask;
    uint64_t *pkey; /* merges: (left id << 32 | right id) + 1 -> rank, merged id; 0 empty */
    int32_t *prank, *pmerged;
    uint64_t pmask;
    int32_t byte_id[256]; /* the id of each byte's symbol */
    int32_t *added;       /* added tokens' ids, longest content first */
    int64_t nadded;
    int llama, ignore_merges;
    locale_t loc;
};

/* ---- maps --------------------------------------------------------------------------------------- */

static uint64_t hash_str(const char *s, size_t n) { return XXH3_64bits(s, n); }

static int32_t smap_find(const SvTokenizer *t, const char *s, size_t n) {
    for (uint64_t h = hash_str(s, n) & t->smask;; h = (h + 1) & t->smask) {
        int32_t id = t->smap[h];
        if (id < 0) return -1;
        if (strlen(t->str[id]) == n && memcmp(t->str[id], s, n) == 0) return id;
    }
}

static void smap_put(SvTokenizer *t, int32_t id) {
    const char *s = t->str[id];
    uint64_t h = hash_str(s, strlen(s)) & t->smask;
    while (t->smap[h] >= 0) h = (h + 1) & t->smask;
    t->smap[h] = id;
}

static void pmap_put(SvTokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint64_t h = XXH3_64bits(&key, sizeof key) & t->pmask;
    while (t->pkey[h] && t->pkey[h] != key) h = (h + 1) & t->pmask;
    if (t->pkey[h]) return; /* a repeated merge keeps its first (lowest) rank */
    t->pkey[h] = key, t->prank[h] = rank, t->pmerged[h] = merged;
}

static int pmap_get(const SvTokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (uint64_t h = XXH3_64bits(&key, sizeof key) & t->pmask; t->pkey[h]; h = (h + 1) & t->pmask)
        if (t->pkey[h] == key) {
            *merged = t->pmerged[h];
            return t->prank[h];
        }
    return -1;
}

/* ---- GPT-2's bytes-to-unicode ------------------------------------------------------------------- */

static uint32_t byte_symbol(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256u + (uint32_t)n;
}

static size_t utf8_put(uint32_t c, char *o) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 63)), 2;
    if (c < 0x10000) return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 63)), o[2] = (char)(0x80 | (c & 63)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 63)), o[2] = (char)(0x80 | (c >> 6 & 63));
    o[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* The next code point of s[*i, n) (invalid bytes are taken one at a time as U+FFFD's stand-in). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i) {
    unsigned c = s[*i];
    int k = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (k < 0 || *i + (size_t)k >= n) {
        (*i)++;
        return 0xFFFD;
    }
    uint32_t v = k == 0 ? c : c & (0x3Fu >> k);
    for (int j = 1; j <= k; j++) v = v << 6 | (s[*i + (size_t)j] & 63u);
    *i += (size_t)k + 1;
    return v;
}

/* ---- loading ------------------------------------------------------------------------------------ */

void sv_tokenizer_free(SvTokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; i < t->nvocab; i++) {
        free(t->str[i]);
        free(t->bytes[i]);
    }
    free(t->str), free(t->bytes), free(t->nbytes), free(t->smap);
    free(t->pkey), free(t->prank), free(t->pmerged), free(t->added);
    if (t->loc) freelocale(t->loc);
    free(t);
}

int64_t sv_tokenizer_vocab(const SvTokenizer *t) { return t->nvocab; }
int32_t sv_tokenizer_find(const SvTokenizer *t, const char *s) { return smap_find(t, s, strlen(s)); }

static char *read_file(const char *path, size_t *n, RtError *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        rt_fail_errno(err, errno, "cannot open the tokenizer '%s'", path);
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0;
    *n = 0;
    for (;;) {
        if (*n + 65536 + 1 > cap) {
            cap = (cap + 65536) * 2;
            char *q = realloc(buf, cap);
            if (!q) {
                free(buf);
                fclose(f);
                rt_fail_errno(err, ENOMEM, "cannot read the tokenizer '%s'", path);
                return NULL;
            }
            buf = q;
        }
        size_t k = fread(buf + *n, 1, 65536, f);
        *n += k;
        if (k < 65536) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        rt_fail(err, RT_ERR_IO, "cannot read the tokenizer '%s'", path);
        return NULL;
    }
    buf[*n] = 0;
    return buf;
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const SvTokenizer *t = ctx;
    size_t x = strlen(t->str[*(const int32_t *)a]), y = strlen(t->str[*(const int32_t *)b]);
    return x < y ? 1 : x > y ? -1 : 0;
}

RtStatus sv_tokenizer_load(SvTokenizer **out, const char *path, RtError *err) {
    *out = NULL;
    size_t n;
    char *text = read_file(path, &n, err);
    if (!text) return RT_ERR_IO;
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    free(text);
    if (!root) return rt_fail(err, RT_ERR_FORMAT, "the tokenizer '%s' is not valid JSON: %s (line %d)", path, je.text, je.line);
    SvTokenizer *t = calloc(1, sizeof *t);
    RtStatus st = RT_OK;
    char *merges_text = NULL;
    if (!t) {
        json_decref(root);
        return rt_fail_errno(err, ENOMEM, "cannot load the tokenizer '%s'", path);
    }
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = model ? json_object_get(model, "vocab") : root; /* vocab.json is the vocabulary alone */
    const json_t *merges = model ? json_object_get(model, "merges") : NULL;
    const json_t *added = json_object_get(root, "added_tokens");
    if (model) {
        const char *type = json_string_value(json_object_get(model, "type"));
        if (!type || strcmp(type, "BPE") != 0) {
            st = rt_fail(err, RT_ERR_FORMAT, "the tokenizer '%s' is a %s model; only byte-level BPE is supported", path,
                         type ? type : "(no type)");
            goto done;
        }
        t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
        char *pre = json_dumps(json_object_get(root, "pre_tokenizer"), JSON_COMPACT);
        t->llama = pre && strstr(pre, "\\\\p{N}{1,3}") != NULL;
        free(pre);
    }
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        st = rt_fail(err, RT_ERR_FORMAT, "the tokenizer '%s' has no vocabulary (model.vocab)", path);
        goto done;
    }
    /* the id range: the vocabulary's and the added tokens' */
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (1 << 24)) {
            st = rt_fail(err, RT_ERR_FORMAT, "the tokenizer '%s': token '%.40s' has no valid id", path, key);
            goto done;
        }
        if (json_integer_value(val) >= t->nvocab) t->nvocab = json_integer_value(val) + 1;
    }
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_int_t id = json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id >= t->nvocab && id < (1 << 24)) t->nvocab = id + 1;
    }
    t->str = calloc((size_t)t->nvocab, sizeof *t->str);
    t->bytes = calloc((size_t)t->nvocab, sizeof *t->bytes);
    t->nbytes = calloc((size_t)t->nvocab, sizeof *t->nbytes);
    t->smask = 1;
    while (t->smask < (uint64_t)t->nvocab * 2) t->smask *= 2;
    t->smap = malloc(t->smask * sizeof *t->smap);
    t->smask -= 1;
    if (!t->str || !t->bytes || !t->nbytes || !t->smap) {
        st = rt_fail_errno(err, ENOMEM, "cannot load the tokenizer '%s'", path);
        goto done;
    }
    memset(t->smap, 0xff, (t->smask + 1) * sizeof *t->smap);
    /* the inverse of bytes-to-unicode, for decoding */
    int32_t inv[512];
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[byte_symbol(b)] = b;
    json_object_foreach((json_t *)vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->str[id]) continue; /* two texts for one id: the first is kept */
        t->str[id] = strdup(key);
        size_t kl = strlen(key), i = 0, m = 0;
        t->bytes[id] = malloc(kl + 1);
        if (!t->str[id] || !t->bytes[id]) {
            st = rt_fail_errno(err, ENOMEM, "cannot load the tokenizer '%s'", path);
            goto done;
        }
        while (i < kl) {
            uint32_t c = utf8_next((const unsigned char *)key, kl, &i);
            if (c < 512 && inv[c] >= 0) t->bytes[id][m++] = (char)inv[c];
            else m += utf8_put(c, t->bytes[id] + m); /* not a byte symbol: as itself (cannot be longer than the text) */
        }
        t->nbytes[id] = m;
        smap_put(t, id);
    }
    t->added = calloc(json_is_array(added) ? json_array_size(added) + 1 : 1, sizeof *t->added);
    for (size_t i = 0; t->added && json_is_array(added) && i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const char *content = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!content || !*content || id < 0 || id >= t->nvocab) continue;
        if (!t->str[id]) {
            t->str[id] = strdup(content);
            t->bytes[id] = strdup(content);
            t->nbytes[id] = strlen(content);
            if (!t->str[id] || !t->bytes[id]) continue;
            smap_put(t, (int32_t)id);
        } else {
            free(t->bytes[id]); /* an added token decodes to its content, not through the byte symbols */
            t->bytes[id] = strdup(content);
            t->nbytes[id] = t->bytes[id] ? strlen(content) : 0;
        }
        t->added[t->nadded++] = (int32_t)id;
    }
    if (t->added) qsort_r(t->added, (size_t)t->nadded, sizeof *t->added, cmp_added, t);
    for (int b = 0; b < 256; b++) {
        char sym[5];
        size_t k = utf8_put(byte_symbol(b), sym);
        t->byte_id[b] = smap_find(t, sym, k);
    }
    /* merges: tokenizer.json's list ("a b" or ["a", "b"]), or merges.txt beside vocab.json */
    size_t nmerges = json_is_array(merges) ? json_array_size(merges) : 0;
    if (!model) {
        const char *slash = strrchr(path, '/');
        char mpath[4096];
        snprintf(mpath, sizeof mpath, "%.*smerges.txt", slash ? (int)(slash - path + 1) : 0, path);
        size_t mn;
        merges_text = read_file(mpath, &mn, err);
        if (!merges_text) {
            st = RT_ERR_IO;
            rt_error_context(err, "GPT-2's vocab.json needs merges.txt beside it");
            goto done;
        }
        for (size_t i = 0; i < mn; i++) nmerges += merges_text[i] == '\n';
        nmerges++;
    }
    t->pmask = 1;
    while (t->pmask < nmerges * 2 + 2) t->pmask *= 2;
    t->pkey = calloc(t->pmask, sizeof *t->pkey);
    t->prank = malloc(t->pmask * sizeof *t->prank);
    t->pmerged = malloc(t->pmask * sizeof *t->pmerged);
    t->pmask -= 1;
    if (!t->pkey || !t->prank || !t->pmerged) {
        st = rt_fail_errno(err, ENOMEM, "cannot load the tokenizer '%s'", path);
        goto done;
    }
    int32_t rank = 0;
    char *line = merges_text, *next;
    for (size_t i = 0;; i++) {
        const char *a, *b;
        char pair[1024];
        if (model) {
            if (i >= nmerges) break;
            const json_t *m = json_array_get(merges, i);
            if (json_is_string(m)) {
                snprintf(pair, sizeof pair, "%s", json_string_value(m));
                char *sp = strchr(pair, ' ');
                if (!sp) continue;
                *sp = 0, a = pair, b = sp + 1;
            } else if (json_is_array(m) && json_array_size(m) == 2) {
                a = json_string_value(json_array_get(m, 0)), b = json_string_value(json_array_get(m, 1));
                if (!a || !b) continue;
            } else {
                continue;
            }
        } else {
            if (!line || !*line) break;
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            if (line[0] == '#' && i == 0) { /* "#version: 0.2" */
                line = next;
                continue;
            }
            size_t ll = strlen(line);
            if (ll && line[ll - 1] == '\r') line[--ll] = 0;
            snprintf(pair, sizeof pair, "%s", line);
            line = next;
            char *sp = strchr(pair, ' ');
            if (!sp) continue;
            *sp = 0, a = pair, b = sp + 1;
        }
        char joined[1024];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        int32_t ia = smap_find(t, a, strlen(a)), ib = smap_find(t, b, strlen(b)), im = smap_find(t, joined, strlen(joined));
        if (ia >= 0 && ib >= 0 && im >= 0) pmap_put(t, ia, ib, rank, im);
        rank++;
    }
    t->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
done:
    free(merges_text);
    json_decref(root);
    if (st != RT_OK) {
        sv_tokenizer_free(t);
        return st;
    }
    *out = t;
    return RT_OK;
}

/* ---- encoding ----------------------------------------------------------------------------------- */

static int is_space(const SvTokenizer *t, uint32_t c) {
    if (c < 128) return c == ' ' || (c >= 9 && c <= 13);
    return t->loc ? iswspace_l((wint_t)c, t->loc) != 0 : 0;
}
static int is_letter(const SvTokenizer *t, uint32_t c) {
    if (c < 128) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return t->loc ? iswalpha_l((wint_t)c, t->loc) != 0 : 0;
}
static int is_number(uint32_t c) { return c >= '0' && c <= '9'; }
static int is_other(const SvTokenizer *t, uint32_t c) { return !is_space(t, c) && !is_letter(t, c) && !is_number(c); }
static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

static int lower(uint32_t c) { return c < 128 ? (int)(c | 32) : (int)c; }

/* The length (in code points) of the pre-token at cp[i]: GPT-2's or Llama 3's expression. */
static size_t pretoken(const SvTokenizer *t, const uint32_t *cp, size_t n, size_t i) {
    /* contractions ('s 't 're 've 'm 'll 'd), case-insensitive for Llama 3 */
    if (cp[i] == '\'' && i + 1 < n) {
        int c1 = t->llama ? lower(cp[i + 1]) : (int)cp[i + 1],
            c2 = i + 2 < n ? (t->llama ? lower(cp[i + 2]) : (int)cp[i + 2]) : 0;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    }
    size_t j = i;
    if (t->llama) {
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!is_nl(cp[j]) && !is_letter(t, cp[j]) && !is_number(cp[j]) && j + 1 < n && is_letter(t, cp[j + 1])) j++;
        if (is_letter(t, cp[j])) {
            while (j < n && is_letter(t, cp[j])) j++;
            return j - i;
        }
        j = i;
        /* \p{N}{1,3} */
        if (is_number(cp[j])) {
            while (j < n && j - i < 3 && is_number(cp[j])) j++;
            return j - i;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        if (cp[j] == ' ' && j + 1 < n && is_other(t, cp[j + 1])) j++;
        if (is_other(t, cp[j])) {
            while (j < n && is_other(t, cp[j])) j++;
            while (j < n && is_nl(cp[j])) j++;
            return j - i;
        }
        j = i;
        /* \s*[\r\n]+ : up to the last line break of the whitespace run */
        size_t k = i, last_nl = 0;
        int has_nl = 0;
        while (k < n && is_space(t, cp[k])) {
            if (is_nl(cp[k])) last_nl = k, has_nl = 1;
            k++;
        }
        if (has_nl) return last_nl + 1 - i;
    } else {
        /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ */
        if (cp[j] == ' ' && j + 1 < n && !is_space(t, cp[j + 1])) j++;
        if (is_letter(t, cp[j])) {
            while (j < n && is_letter(t, cp[j])) j++;
            return j - i;
        }
        if (is_number(cp[j])) {
            while (j < n && is_number(cp[j])) j++;
            return j - i;
        }
        if (is_other(t, cp[j])) {
            while (j < n && is_other(t, cp[j])) j++;
            return j - i;
        }
        j = i;
    }
    /* \s+(?!\S) | \s+ */
    size_t k = i;
    while (k < n && is_space(t, cp[k])) k++;
    if (k > i) {
        if (k == n || k - i == 1) return k - i;
        return k - i - 1; /* leave the last space to the word after it */
    }
    return 1; /* cannot happen: every code point is a space, letter, number or other */
}

typedef struct IdVec {
    int32_t *v;
    int64_t n, cap;
} IdVec;

static int idvec_push(IdVec *a, int32_t id) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 256;
        int32_t *q = realloc(a->v, (size_t)cap * sizeof *q);
        if (!q) return -1;
        a->v = q, a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* BPE over one pre-token's bytes. */
static int bpe(const SvTokenizer *t, const unsigned char *s, size_t n, IdVec *out, int32_t *work) {
    if (t->ignore_merges) { /* the pre-token whole, when it is a token */
        char sym[4 * 256 + 1];
        if (n <= 256) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++) m += utf8_put(byte_symbol(s[i]), sym + m);
            int32_t id = smap_find(t, sym, m);
            if (id >= 0) return idvec_push(out, id);
        }
    }
    size_t m = n;
    for (size_t i = 0; i < n; i++) {
        work[i] = t->byte_id[s[i]];
        if (work[i] < 0) return -2; /* a byte the vocabulary cannot write */
    }
    for (;;) {
        int best = -1;
        size_t at = 0;
        int32_t merged = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t mi;
            int r = pmap_get(t, work[i], work[i + 1], &mi);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i, merged = mi;
        }
        if (best < 0) break;
        work[at] = merged;
        memmove(work + at + 1, work + at + 2, (m - at - 2) * sizeof *work);
        m--;
    }
    for (size_t i = 0; i < m; i++)
        if (idvec_push(out, work[i]) != 0) return -1;
    return 0;
}

static RtStatus encode_plain(const SvTokenizer *t, const char *text, size_t len, IdVec *out, RtError *err) {
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    size_t *off = malloc((len + 1) * sizeof *off); /* byte offset of each code point */
    int32_t *work = malloc((len + 1) * sizeof *work);
    if (!cp || !off || !work) {
        free(cp), free(off), free(work);
        return rt_fail_errno(err, ENOMEM, "cannot tokenize %zu bytes", len);
    }
    size_t n = 0, i = 0;
    while (i < len) {
        off[n] = i;
        cp[n++] = utf8_next((const unsigned char *)text, len, &i);
    }
    off[n] = len;
    RtStatus st = RT_OK;
    for (size_t k = 0; k < n;) {
        size_t m = pretoken(t, cp, n, k);
        int rc = bpe(t, (const unsigned char *)text + off[k], off[k + m] - off[k], out, work);
        if (rc == -2) {
            st =
                rt_fail(err, RT_ERR_ARG, "the tokenizer cannot write byte 0x%02x (no token for it)", (unsigned char)text[off[k]]);
            break;
        }
        if (rc != 0) {
            st = rt_fail_errno(err, ENOMEM, "cannot tokenize %zu bytes", len);
            break;
        }
        k += m;
    }
    free(cp), free(off), free(work);
    return st;
}

RtStatus sv_tokenizer_encode(const SvTokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n, RtError *err) {
    IdVec out = {0};
    RtStatus st = RT_OK;
    size_t start = 0, i = 0;
    while (i < len && st == RT_OK) {
        int32_t hit = -1;
        for (int64_t a = 0; a < t->nadded; a++) {
            const char *c = t->bytes[t->added[a]];
            size_t cl = t->nbytes[t->added[a]];
            if (cl && c[0] == text[i] && cl <= len - i && memcmp(c, text + i, cl) == 0) {
                hit = t->added[a];
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        if (i > start) st = encode_plain(t, text + start, i - start, &out, err);
        if (st == RT_OK && idvec_push(&out, hit) != 0) st = rt_fail_errno(err, ENOMEM, "cannot tokenize %zu bytes", len);
        i += t->nbytes[hit];
        start = i;
    }
    if (st == RT_OK && len > start) st = encode_plain(t, text + start, len - start, &out, err);
    if (st != RT_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return RT_OK;
}

int sv_tokenizer_piece(const SvTokenizer *t, int32_t id, char **buf, size_t *len, size_t *cap) {
    if (!t || id < 0 || id >= t->nvocab || !t->bytes[id]) return -1;
    size_t k = t->nbytes[id];
    if (*len + k + 1 > *cap) {
        size_t c = (*len + k + 1) * 2;
        char *q = realloc(*buf, c);
        if (!q) return -1;
        *buf = q, *cap = c;
    }
    memcpy(*buf + *len, t->bytes[id], k);
    *len += k;
    (*buf)[*len] = 0;
    return 0;
}
