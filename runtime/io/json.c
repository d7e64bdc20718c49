/* json.c - a small JSON reader for the runtime's own files (a checkpoint's state.json; see rt.h).
 *
 * Pipeline position: under checkpoint.c, which reads state.json back when a run resumes. The
 * reader takes RFC 8259 JSON, whole: one value, optionally surrounded by white space. Strings are
 * decoded (escapes, \u surrogate pairs to UTF-8; invalid UTF-8 and unpaired surrogates are errors);
 * numbers are kept as their text, checked against the grammar, and converted on request, so a
 * 64-bit integer is read exactly. Nesting is limited to RT_JSON_MAX_DEPTH. Every error names the
 * file and the byte offset. All nodes and strings live in one block list freed by rt_json_free. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

#define RT_JSON_MAX_DEPTH 64

typedef struct RtJsonBlock {
    struct RtJsonBlock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} RtJsonBlock;

struct RtJsonDoc {
    RtJsonBlock *blocks;
    const RtJsonValue *root;
};

typedef struct RtJsonParser {
    RtJsonDoc *doc;
    const char *s;
    size_t n, i;
    const char *what;
    RtError *err;
} RtJsonParser;

static void *rt_json_alloc(RtJsonParser *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    RtJsonBlock *b = p->doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = p->doc->blocks;
        b->used = 0;
        b->cap = cap;
        p->doc->blocks = b;
    }
    void *r = b->data + b->used;
    b->used += n;
    return r;
}

static RtStatus rt_json_err(RtJsonParser *p, const char *msg) {
    return rt_fail(p->err, RT_ERR_FORMAT, "%s: byte %zu: %s", p->what, p->i, msg);
}

static RtStatus rt_json_nomem(RtJsonParser *p) { return rt_fail_errno(p->err, ENOMEM, "cannot read %s", p->what); }

static void rt_json_ws(RtJsonParser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int rt_hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 1;
}

/* The length of the valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t rt_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
    return len;
}

static RtStatus rt_json_string(RtJsonParser *p, const char **out) {
    p->i++; /* the opening quote */
    /* the decoded string is never longer than its source */
    size_t start = p->i, end = start;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) return rt_json_err(p, "unterminated string");
    char *d = rt_json_alloc(p, end - start + 1);
    if (!d) return rt_json_nomem(p);
    size_t k = 0;
    while (p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) return rt_json_err(p, "a control character in a string (write it as an escape)");
        if (c != '\\') {
            size_t len = rt_utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
            if (!len) return rt_json_err(p, "invalid UTF-8 in a string");
            memcpy(d + k, p->s + p->i, len);
            k += len;
            p->i += len;
            continue;
        }
        char e = p->s[p->i + 1], simple = 0;
        switch (e) {
        case '"': simple = '"'; break;
        case '\\': simple = '\\'; break;
        case '/': simple = '/'; break;
        case 'b': simple = '\b'; break;
        case 'f': simple = '\f'; break;
        case 'n': simple = '\n'; break;
        case 'r': simple = '\r'; break;
        case 't': simple = '\t'; break;
        case 'u': break;
        default: return rt_json_err(p, "an unknown escape in a string");
        }
        if (simple) {
            d[k++] = simple;
            p->i += 2;
            continue;
        }
        uint32_t cp, lo;
        if (p->i + 6 > p->n || !rt_hex4(p->s + p->i + 2, &cp)) return rt_json_err(p, "a \\u escape needs four hex digits");
        p->i += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff) return rt_json_err(p, "an unpaired low surrogate");
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' || !rt_hex4(p->s + p->i + 2, &lo) ||
                lo < 0xdc00 || lo > 0xdfff)
                return rt_json_err(p, "an unpaired high surrogate");
            p->i += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) return rt_json_err(p, "a NUL character in a string");
        if (cp < 0x80) d[k++] = (char)cp;
        else if (cp < 0x800) d[k++] = (char)(0xc0 | cp >> 6), d[k++] = (char)(0x80 | (cp & 0x3f));
        else if (cp < 0x10000)
            d[k++] = (char)(0xe0 | cp >> 12), d[k++] = (char)(0x80 | (cp >> 6 & 0x3f)), d[k++] = (char)(0x80 | (cp & 0x3f));
        else
            d[k++] = (char)(0xf0 | cp >> 18), d[k++] = (char)(0x80 | (cp >> 12 & 0x3f)), d[k++] = (char)(0x80 | (cp >> 6 & 0x3f)),
            d[k++] = (char)(0x80 | (cp & 0x3f));
    }
    d[k] = 0;
    p->i++; /* the closing quote */
    *out = d;
    return RT_OK;
}

static RtStatus rt_json_number(RtJsonParser *p, const char **out) {
    size_t b = p->i;
    const char *s = p->s;
#define DIGIT(j) ((j) < p->n && s[j] >= '0' && s[j] <= '9')
    if (p->i < p->n && s[p->i] == '-') p->i++;
    if (!DIGIT(p->i)) return rt_json_err(p, "a malformed number");
    if (s[p->i] == '0') p->i++;
    else
        while (DIGIT(p->i)) p->i++;
    if (p->i < p->n && s[p->i] == '.') {
        p->i++;
        if (!DIGIT(p->i)) return rt_json_err(p, "a malformed number (no digit after '.')");
        while (DIGIT(p->i)) p->i++;
    }
    if (p->i < p->n && (s[p->i] == 'e' || s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (s[p->i] == '+' || s[p->i] == '-')) p->i++;
        if (!DIGIT(p->i)) return rt_json_err(p, "a malformed number (no digit in the exponent)");
        while (DIGIT(p->i)) p->i++;
    }
#undef DIGIT
    char *d = rt_json_alloc(p, p->i - b + 1);
    if (!d) return rt_json_nomem(p);
    memcpy(d, s + b, p->i - b);
    d[p->i - b] = 0;
    *out = d;
    return RT_OK;
}

static RtStatus rt_json_value(RtJsonParser *p, int depth, const RtJsonValue **out);

/* The members of an object or the items of an array, into a node's arrays. */
static RtStatus rt_json_container(RtJsonParser *p, int depth, RtJsonValue *node) {
    int object = p->s[p->i] == '{';
    char close = object ? '}' : ']';
    p->i++;
    /* children are collected in a growing malloc'd list, then copied into the document */
    size_t cap = 8, n = 0;
    const RtJsonValue **items = malloc(cap * sizeof *items);
    const char **keys = malloc(cap * sizeof *keys);
    RtStatus st = items && keys ? RT_OK : rt_json_nomem(p);
    rt_json_ws(p);
    if (st == RT_OK && p->i < p->n && p->s[p->i] == close) p->i++;
    else
        while (st == RT_OK) {
            if (n == cap) {
                cap *= 2;
                const RtJsonValue **ni = realloc(items, cap * sizeof *items);
                if (ni) items = ni;
                const char **nk = realloc(keys, cap * sizeof *keys);
                if (nk) keys = nk;
                if (!ni || !nk) {
                    st = rt_json_nomem(p);
                    break;
                }
            }
            rt_json_ws(p);
            keys[n] = NULL;
            if (object) {
                if (p->i >= p->n || p->s[p->i] != '"') {
                    st = rt_json_err(p, "an object key must be a string");
                    break;
                }
                if ((st = rt_json_string(p, &keys[n])) != RT_OK) break;
                for (size_t j = 0; j < n; j++)
                    if (strcmp(keys[j], keys[n]) == 0) st = rt_json_err(p, "a key repeated in one object");
                if (st != RT_OK) break;
                rt_json_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') {
                    st = rt_json_err(p, "expected ':' after an object key");
                    break;
                }
                p->i++;
            }
            if ((st = rt_json_value(p, depth + 1, &items[n])) != RT_OK) break;
            n++;
            rt_json_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == close) {
                p->i++;
                break;
            }
            st = rt_json_err(p, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
        }
    if (st == RT_OK) {
        node->n = (int64_t)n;
        node->items = rt_json_alloc(p, (n ? n : 1) * sizeof *node->items);
        node->keys = object ? rt_json_alloc(p, (n ? n : 1) * sizeof *node->keys) : NULL;
        if (!node->items || (object && !node->keys)) st = rt_json_nomem(p);
        else {
            memcpy(node->items, items, n * sizeof *items);
            if (object) memcpy(node->keys, keys, n * sizeof *keys);
        }
    }
    free(items);
    free(keys);
    return st;
}

static RtStatus rt_json_value(RtJsonParser *p, int depth, const RtJsonValue **out) {
    if (depth > RT_JSON_MAX_DEPTH) return rt_json_err(p, "nested too deeply");
    rt_json_ws(p);
    if (p->i >= p->n) return rt_json_err(p, "unexpected end of the file (a value was expected)");
    RtJsonValue *v = rt_json_alloc(p, sizeof *v);
    if (!v) return rt_json_nomem(p);
    memset(v, 0, sizeof *v);
    *out = v;
    char c = p->s[p->i];
    static const struct {
        const char *word;
        RtJsonType type;
        int b;
    } words[] = {{"null", RT_JSON_NULL, 0}, {"true", RT_JSON_BOOL, 1}, {"false", RT_JSON_BOOL, 0}};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(words[k].word);
        if (c == words[k].word[0]) {
            if (p->n - p->i < len || memcmp(p->s + p->i, words[k].word, len) != 0) return rt_json_err(p, "an unknown word");
            p->i += len;
            v->type = words[k].type;
            v->boolean = words[k].b;
            return RT_OK;
        }
    }
    if (c == '"') {
        v->type = RT_JSON_STRING;
        return rt_json_string(p, &v->str);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        v->type = RT_JSON_NUMBER;
        return rt_json_number(p, &v->str);
    }
    if (c == '{' || c == '[') {
        v->type = c == '{' ? RT_JSON_OBJECT : RT_JSON_ARRAY;
        return rt_json_container(p, depth, v);
    }
    return rt_json_err(p, "unexpected character (a value was expected)");
}

RtStatus rt_json_parse(RtJsonDoc **out, const char *text, size_t n, const char *what, RtError *err) {
    *out = NULL;
    RtJsonDoc *doc = calloc(1, sizeof *doc);
    if (!doc) return rt_fail_errno(err, ENOMEM, "cannot read %s", what);
    RtJsonParser p = {doc, text, n, 0, what, err};
    RtStatus st = rt_json_value(&p, 0, &doc->root);
    if (st == RT_OK) {
        rt_json_ws(&p);
        if (p.i != n) st = rt_json_err(&p, "more after the JSON value");
    }
    if (st != RT_OK) {
        rt_json_free(doc);
        return st;
    }
    *out = doc;
    return RT_OK;
}

const RtJsonValue *rt_json_root(const RtJsonDoc *d) { return d ? d->root : NULL; }

void rt_json_free(RtJsonDoc *d) {
    if (!d) return;
    for (RtJsonBlock *b = d->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(d);
}

const RtJsonValue *rt_json_get(const RtJsonValue *obj, const char *key) {
    if (!obj || obj->type != RT_JSON_OBJECT) return NULL;
    for (int64_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

int rt_json_i64(const RtJsonValue *v, int64_t *out) {
    if (!v || v->type != RT_JSON_NUMBER || strpbrk(v->str, ".eE")) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v->str, &end, 10);
    if (errno || *end) return 0;
    *out = x;
    return 1;
}

int rt_json_u64(const RtJsonValue *v, uint64_t *out) {
    if (!v || v->type != RT_JSON_NUMBER || v->str[0] == '-' || strpbrk(v->str, ".eE")) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v->str, &end, 10);
    if (errno || *end) return 0;
    *out = x;
    return 1;
}

int rt_json_f64(const RtJsonValue *v, double *out) {
    if (!v || v->type != RT_JSON_NUMBER) return 0;
    *out = strtod(v->str, NULL);
    return 1;
}

const char *rt_json_str(const RtJsonValue *v) { return v && v->type == RT_JSON_STRING ? v->str : NULL; }
