/* data.c - token data for training: llm.c and nanoGPT token shards, batches of windows, seeded
 * shuffling and an exact, restorable position (see rt.h; docs/runtime.md for the user's view).
 *
 * Pipeline position: the train loop's input. `data = tokens(GLOB, seq = T, shuffle, val = GLOB)`
 * in a program becomes an RtDataSpec; every micro-batch calls rt_data_next for data.x and data.y.
 *
 * Model of the data: each file (a "shard") is a sequence of tokens, read with pread window by window
 * (never mapped: a shard truncated while a run reads it is then a message, not a SIGBUS; one shard
 * is open at a time, checked on each opening to be the file, of the size, that was validated at
 * the start). Shard s is cut
 * into windows of T+1 tokens starting at multiples of T (window k covers tokens [kT, kT+T]), so
 * consecutive windows share one token, as llm.c's loader does: x is a window's first T tokens
 * and y its last T. An epoch visits every window once: in file order, or - shuffled - with the
 * shards in a permutation keyed by (seed, epoch) and each shard's windows in a permutation keyed
 * by (seed, epoch, shard). The permutations are RtPerm (rng.c): computed, never stored, so the
 * position is just three counters (epoch, shard, window) and restoring it is exact.
 *
 * A held-out split is either its own glob or, without one, the last N windows of the training
 * files (taken from the last file backwards), which the training split then never visits.
 *
 * Several data sets (`tokens([GLOB_A, GLOB_B], ...)`, one per adapter of nn.MultiLoRALinear):
 * a pattern of several lines is one source a line, each a source as above with the spec's seed
 * (so that source n visits its windows in the order it would alone) and 1/N of the held-out
 * windows. A batch of B rows is B/N rows from each source in turn: rows n*B/N .. (n+1)*B/N - 1
 * are source n's. Skipping n rows skips n/N windows of each. The position of a composite is the
 * windows each source has given (`window`, the others zero), restored by replaying that many
 * advances of each source (rt_advance: no file is read). */
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

/* ---- representation ---------------------------------------------------------------------------- */

typedef struct RtShard {
    char *path;
    int64_t size; /* bytes, when validated */
    dev_t dev;    /* the file validated, which every later opening must find again */
    ino_t ino;
    int64_t off; /* the first token's byte offset */
    int64_t ntok;
    int width; /* bytes per token: 2 or 4 */
} RtShard;

/* A run of windows [first, first + count) of one shard: what one split visits of it. */
typedef struct RtSeg {
    int64_t shard;
    int64_t first;
    int64_t count;
} RtSeg;

struct RtData {
    RtShard *shards;
    int64_t nshards;
    RtSeg *segs; /* count > 0 each, in file order */
    int64_t nsegs;
    int64_t T, vocab;
    int shuffle;
    uint64_t seed;
    int64_t windows; /* per epoch */
    uint64_t fingerprint;
    RtDataPos pos;
    int fd;             /* the open shard's descriptor, -1 */
    int64_t fd_shard;   /* which shard it is, -1 */
    unsigned char *buf; /* one window's bytes: (T + 1) x 4 */
    int64_t nleft_out;  /* held-out files the training glob matched and this source left out */
    char *left_out;     /* the first of them (its path), or NULL */
    RtData **parts;     /* a composite of several sources (a pattern of several lines); else NULL */
    int64_t nparts;
    uint64_t taken; /* a composite's position: windows each part has given */
};

#define RT_SHARD_ORDER_TWEAK UINT32_C(0xFFFFFFFF) /* the permutation of shards, not of one shard's windows */

static uint32_t rt_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t rt_bswap32(uint32_t x) { return (x >> 24) | ((x >> 8) & 0xFF00) | ((x << 8) & 0xFF0000) | (x << 24); }

static uint32_t rt_token(const unsigned char *buf, int width, int64_t i) {
    const unsigned char *p = buf + i * width;
    return width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : rt_le32(p);
}

/* ---- validating one file ------------------------------------------------------------------------ */

/* Reads path's header and works out its format and token count; every inconsistency is an error
 * here, so that a bad file stops the run when it starts, not hours in. */
static RtStatus rt_shard_check(RtShard *s, const char *path, RtError *err);

static RtStatus rt_shard_open(RtShard *s, const char *path, RtError *err) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return rt_fail_errno(err, ENOMEM, "cannot open data shard '%s'", path);
    return rt_shard_check(s, path, err);
}

static RtStatus rt_shard_check(RtShard *s, const char *path, RtError *err) {
    int fd;
    RtStatus st = rt_open_regular(path, "data shard", &fd, &s->size, err);
    if (st != RT_OK) return st;
    struct stat sb;
    unsigned char b[RT_LLMC_HEADER_BYTES];
    size_t size = (size_t)s->size;
    int64_t want = s->size < RT_LLMC_HEADER_BYTES ? s->size : RT_LLMC_HEADER_BYTES;
    int64_t got = fstat(fd, &sb) == 0 ? rt_pread_all(fd, b, want, 0) : -1;
    int e = errno;
    close(fd);
    if (got < 0) return rt_fail_errno(err, e, "cannot read data shard '%s'", path);
    if (got < want) return rt_fail(err, RT_ERR_IO, "data shard '%s' shrank while its header was read", path);
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    if (size == 0) return rt_fail(err, RT_ERR_FORMAT, "data shard '%s' is empty", path);
    uint32_t magic = size >= 4 ? rt_le32(b) : 0;
    if (magic == RT_LLMC_MAGIC || magic == RT_LLMC_MAGIC_U32) {
        if (size < RT_LLMC_HEADER_BYTES)
            return rt_fail(err, RT_ERR_FORMAT,
                           "data shard '%s' is truncated: it starts with the llm.c magic number %u but has only %zu "
                           "bytes, less than the %d-byte header",
                           path, magic, size, RT_LLMC_HEADER_BYTES);
        uint32_t version = rt_le32(b + 4);
        if (version != RT_LLMC_VERSION)
            return rt_fail(err, RT_ERR_FORMAT, "data shard '%s': unsupported llm.c shard version %u (expected %d)", path, version,
                           RT_LLMC_VERSION);
        int32_t count = (int32_t)rt_le32(b + 8);
        if (count < 0)
            return rt_fail(err, RT_ERR_FORMAT, "data shard '%s': negative token count %d in its header", path, (int)count);
        s->width = magic == RT_LLMC_MAGIC ? 2 : 4;
        uint64_t body = (uint64_t)count * (uint64_t)s->width;
        uint64_t have = size - RT_LLMC_HEADER_BYTES;
        if (body > have)
            return rt_fail(err, RT_ERR_FORMAT,
                           "data shard '%s' is truncated: its header says %d tokens (%llu bytes after the %d-byte "
                           "header) but the file has %zu bytes",
                           path, (int)count, (unsigned long long)body, RT_LLMC_HEADER_BYTES, size);
        if (body < have)
            return rt_fail(err, RT_ERR_FORMAT, "data shard '%s' has %llu bytes more than the %d tokens its header declares", path,
                           (unsigned long long)(have - body), (int)count);
        s->off = RT_LLMC_HEADER_BYTES;
        s->ntok = count;
        return RT_OK;
    }
    /* No magic: a raw uint16 file - unless it has an llm.c header with a damaged magic number,
     * which would otherwise be read as 512 tokens of garbage. */
    if (size >= RT_LLMC_HEADER_BYTES) {
        if (magic == rt_bswap32(RT_LLMC_MAGIC) || magic == rt_bswap32(RT_LLMC_MAGIC_U32))
            return rt_fail(err, RT_ERR_FORMAT,
                           "data shard '%s' starts with a byte-swapped llm.c magic number (written big-endian?)", path);
        uint32_t version = rt_le32(b + 4);
        int32_t count = (int32_t)rt_le32(b + 8);
        if (version == RT_LLMC_VERSION && count >= 0 &&
            (RT_LLMC_HEADER_BYTES + 2 * (uint64_t)count == size || RT_LLMC_HEADER_BYTES + 4 * (uint64_t)count == size))
            return rt_fail(err, RT_ERR_FORMAT,
                           "data shard '%s' has a bad magic number %u in an llm.c header (version 1, %d tokens, "
                           "matching the file's size); llm.c shards start with %d (uint16 tokens) or %d (uint32 tokens)",
                           path, magic, (int)count, RT_LLMC_MAGIC, RT_LLMC_MAGIC_U32);
    }
    if (size % 2)
        return rt_fail(err, RT_ERR_FORMAT,
                       "data shard '%s' has an odd number of bytes (%zu): a file without an llm.c header holds uint16 tokens",
                       path, size);
    s->width = 2;
    s->off = 0;
    s->ntok = (int64_t)(size / 2);
    return RT_OK;
}

static void rt_shard_close(RtShard *s) {
    free(s->path);
    s->path = NULL;
}

/* ---- finding the files -------------------------------------------------------------------------- */

static int rt_cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int rt_has_glob_chars(const char *p) { return strpbrk(p, "*?[\\") != NULL; }

/* The files of a pattern, sorted byte-wise (glob's own order follows the locale). A pattern
 * without wildcards names one file, whose absence is reported by opening it. */
static RtStatus rt_find_files(const char *pattern, char ***out, int64_t *n, RtError *err) {
    *out = NULL;
    *n = 0;
    if (!rt_has_glob_chars(pattern)) {
        char **v = malloc(sizeof *v);
        if (v) v[0] = strdup(pattern);
        if (!v || !v[0]) {
            free(v);
            return rt_fail_errno(err, ENOMEM, "cannot list data files '%s'", pattern);
        }
        *out = v;
        *n = 1;
        return RT_OK;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return rt_fail(err, RT_ERR_NOTFOUND, "no data files match '%s'", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        if (rc == GLOB_NOSPACE) return rt_fail_errno(err, ENOMEM, "cannot list data files matching '%s'", pattern);
        return rt_fail(err, RT_ERR_IO, "cannot list data files matching '%s': a directory could not be read", pattern);
    }
    char **v = calloc(g.gl_pathc, sizeof *v);
    if (!v) {
        globfree(&g);
        return rt_fail_errno(err, ENOMEM, "cannot list data files matching '%s'", pattern);
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        v[i] = strdup(g.gl_pathv[i]);
        if (!v[i]) {
            for (size_t j = 0; j < i; j++) free(v[j]);
            free(v);
            globfree(&g);
            return rt_fail_errno(err, ENOMEM, "cannot list data files matching '%s'", pattern);
        }
    }
    *n = (int64_t)g.gl_pathc;
    globfree(&g);
    qsort(v, (size_t)*n, sizeof *v, rt_cmp_str);
    *out = v;
    return RT_OK;
}

/* Whether a file's name marks it as a held-out split: a word of its base name (words split at
 * '_', '.' and '-') is val, valid or validation - tiny_val.bin, fineweb_val_000000.bin, val.bin;
 * not interval.bin. */
static int rt_is_val_name(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (const char *w = base; *w;) {
        size_t n = strcspn(w, "_.-");
        if ((n == 3 && strncmp(w, "val", 3) == 0) || (n == 5 && strncmp(w, "valid", 5) == 0) ||
            (n == 10 && strncmp(w, "validation", 10) == 0))
            return 1;
        w += n + (w[n] ? 1 : 0);
    }
    return 0;
}

/* A training glob that matches held-out files (by name, rt_is_val_name) as well as others - the
 * natural --data glob of every shard in data/, next to data/tiny_val.bin - would train on the validation split
 * without a word. The held-out files are left out of paths (freed), counted in d and named by
 * the first, for the run's `data:` line; a glob that matches held-out files alone is taken as
 * meant, and so is a path without wildcards. */
static void rt_leave_out_val(RtData *d, char **paths, int64_t *npaths) {
    int64_t nval = 0;
    for (int64_t i = 0; i < *npaths; i++) nval += rt_is_val_name(paths[i]);
    if (nval == 0 || nval == *npaths) return;
    int64_t k = 0;
    for (int64_t i = 0; i < *npaths; i++) {
        if (!rt_is_val_name(paths[i])) paths[k++] = paths[i];
        else if (!d->left_out) d->left_out = paths[i];
        else free(paths[i]);
    }
    d->nleft_out = nval;
    *npaths = k;
}

int64_t rt_data_left_out(const RtData *d, const char **first) {
    if (first) *first = d ? d->left_out : NULL;
    for (int64_t i = 0; d && first && !*first && i < d->nparts; i++) *first = d->parts[i]->left_out;
    return d ? d->nleft_out : 0;
}

/* ---- opening a source --------------------------------------------------------------------------- */

static uint64_t rt_fnv_u64(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xFF;
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static int64_t rt_shard_windows(const RtShard *s, int64_t T) { return s->ntok >= T + 1 ? (s->ntok - 1) / T : 0; }

void rt_data_close(RtData *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->nparts; i++) rt_data_close(d->parts[i]);
    free(d->parts);
    for (int64_t i = 0; d->shards && i < d->nshards; i++) rt_shard_close(&d->shards[i]); /* a composite has none */
    if (d->fd >= 0) close(d->fd);
    free(d->buf);
    free(d->shards);
    free(d->segs);
    free(d->left_out);
    free(d);
}

/* Line i of a pattern of several lines (malloc'd), or NULL. */
static char *rt_line(const char *text, int64_t i) {
    for (; i > 0 && text; i--) {
        text = strchr(text, '\n');
        if (text) text++;
    }
    if (!text) return NULL;
    size_t n = strcspn(text, "\n");
    char *line = malloc(n + 1);
    if (line) {
        memcpy(line, text, n);
        line[n] = 0;
    }
    return line;
}

static int64_t rt_nlines(const char *text) {
    int64_t n = 1;
    for (const char *c = text; *c; c++) n += *c == '\n';
    return n;
}

/* A composite source: one part a line of spec->pattern (see the top of the file). */
static RtStatus rt_data_open_parts(RtData **out, const RtDataSpec *spec, RtSplit split, int64_t n, RtError *err) {
    int own_val = spec->val_pattern && *spec->val_pattern;
    if (own_val && rt_nlines(spec->val_pattern) != n)
        return rt_fail(err, RT_ERR_ARG, "data: %lld training data sets but %lld held-out ones: give one held-out glob each",
                       (long long)n, (long long)rt_nlines(spec->val_pattern));
    if (spec->val_windows % n != 0)
        return rt_fail(err, RT_ERR_ARG, "data: %lld held-out windows cannot be split evenly between %lld data sets",
                       (long long)spec->val_windows, (long long)n);
    RtData *d = calloc(1, sizeof *d);
    if (d) d->parts = calloc((size_t)n, sizeof *d->parts);
    if (!d || !d->parts) {
        free(d);
        return rt_fail_errno(err, ENOMEM, "cannot open %lld data sets", (long long)n);
    }
    d->T = spec->seq;
    d->fd = -1;
    d->fd_shard = -1;
    RtStatus st = RT_OK;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = rt_fnv_u64(h, (uint64_t)n);
    for (int64_t i = 0; st == RT_OK && i < n; i++) {
        char *pat = rt_line(spec->pattern, i), *val = own_val ? rt_line(spec->val_pattern, i) : NULL;
        if (!pat || (own_val && !val)) st = rt_fail_errno(err, ENOMEM, "cannot open %lld data sets", (long long)n);
        else if (!*pat)
            st = rt_fail(err, RT_ERR_ARG, "data: data set %lld of %lld has no file pattern", (long long)i + 1, (long long)n);
        RtDataSpec one = *spec;
        one.pattern = pat;
        one.val_pattern = val;
        one.val_windows = spec->val_windows / n;
        if (st == RT_OK) st = rt_data_open(&d->parts[i], &one, split, err);
        free(pat);
        free(val);
        if (st != RT_OK) break;
        d->nparts = i + 1;
        RtData *q = d->parts[i];
        d->windows = i == 0 || q->windows < d->windows ? q->windows : d->windows;
        d->nshards += q->nshards;
        d->nleft_out += q->nleft_out;
        h = rt_fnv_u64(h, q->fingerprint);
    }
    if (st != RT_OK) {
        rt_data_close(d);
        return st;
    }
    d->windows *= n; /* rows: as many from each source before the smallest one wraps around */
    d->fingerprint = h;
    rt_data_rewind(d);
    *out = d;
    return RT_OK;
}

RtStatus rt_data_open(RtData **out, const RtDataSpec *spec, RtSplit split, RtError *err) {
    *out = NULL;
    if (!spec || !spec->pattern || !*spec->pattern) return rt_fail(err, RT_ERR_ARG, "data: no file pattern given");
    if (strchr(spec->pattern, '\n')) return rt_data_open_parts(out, spec, split, rt_nlines(spec->pattern), err);
    if (spec->seq < 1) return rt_fail(err, RT_ERR_ARG, "data: seq must be at least 1, not %lld", (long long)spec->seq);
    if (spec->vocab < 0 || spec->vocab > (int64_t)INT32_MAX + 1)
        return rt_fail(err, RT_ERR_ARG, "data: vocab %lld is out of range", (long long)spec->vocab);
    if (spec->val_windows < 0)
        return rt_fail(err, RT_ERR_ARG, "data: val_windows must not be negative (%lld)", (long long)spec->val_windows);
    if (split != RT_SPLIT_TRAIN && split != RT_SPLIT_VAL) return rt_fail(err, RT_ERR_ARG, "data: unknown split %d", (int)split);
    int own_val = spec->val_pattern && *spec->val_pattern;
    if (split == RT_SPLIT_VAL && !own_val && spec->val_windows == 0)
        return rt_fail(err, RT_ERR_NOTFOUND,
                       "data: no held-out data: give a val glob, or hold out windows at the end of the training data");
    const char *pattern = split == RT_SPLIT_VAL && own_val ? spec->val_pattern : spec->pattern;
    int64_t holdout = own_val ? 0 : spec->val_windows; /* windows at the end of `pattern` that are val's */

    RtData *d = calloc(1, sizeof *d);
    if (!d) return rt_fail_errno(err, ENOMEM, "cannot open data '%s'", pattern);
    d->T = spec->seq;
    d->vocab = spec->vocab;
    d->shuffle = split == RT_SPLIT_TRAIN && spec->shuffle;
    d->seed = spec->seed;
    d->fd = -1;
    d->fd_shard = -1;

    char **paths = NULL;
    int64_t npaths = 0;
    RtStatus st = rt_find_files(pattern, &paths, &npaths, err);
    if (st != RT_OK) {
        rt_data_close(d);
        return st;
    }
    if (pattern == spec->pattern && rt_has_glob_chars(pattern)) rt_leave_out_val(d, paths, &npaths);
    d->shards = calloc((size_t)npaths, sizeof *d->shards);
    d->segs = calloc((size_t)npaths, sizeof *d->segs);
    if (!d->shards || !d->segs) st = rt_fail_errno(err, ENOMEM, "cannot open data '%s'", pattern);
    for (int64_t i = 0; st == RT_OK && i < npaths; i++) {
        st = rt_shard_open(&d->shards[i], paths[i], err);
        d->nshards = i + 1; /* the failed one too: its path is freed by rt_data_close */
    }
    for (int64_t i = 0; i < npaths; i++) free(paths[i]);
    free(paths);
    if (st != RT_OK) {
        rt_data_close(d);
        return st;
    }

    int64_t total = 0;
    for (int64_t i = 0; i < d->nshards; i++) total += rt_shard_windows(&d->shards[i], d->T);
    if (total == 0) {
        st = rt_fail(err, RT_ERR_FORMAT, "data: no file matching '%s' holds a window of %lld tokens (seq %lld + 1)", pattern,
                     (long long)(d->T + 1), (long long)d->T);
        rt_data_close(d);
        return st;
    }
    d->buf = malloc((size_t)(d->T + 1) * 4); /* no larger than the file with the window */
    if (!d->buf) {
        st = rt_fail_errno(err, ENOMEM, "cannot open data '%s'", pattern);
        rt_data_close(d);
        return st;
    }
    if (holdout >= total) {
        st = rt_fail(err, RT_ERR_ARG,
                     "data: cannot hold out %lld windows for evaluation: the files matching '%s' hold only %lld "
                     "windows of %lld tokens",
                     (long long)holdout, pattern, (long long)total, (long long)(d->T + 1));
        rt_data_close(d);
        return st;
    }
    /* Split each shard's windows between train (the front) and val (the held-out tail). */
    int64_t left = holdout;
    for (int64_t i = d->nshards - 1; i >= 0; i--) {
        int64_t w = rt_shard_windows(&d->shards[i], d->T);
        int64_t held = w < left ? w : left;
        left -= held;
        RtSeg seg = {i, 0, w - held};
        if (split == RT_SPLIT_VAL && !own_val) seg = (RtSeg){i, w - held, held};
        d->segs[i] = seg;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < d->nshards; i++)
        if (d->segs[i].count > 0) d->segs[k++] = d->segs[i];
    d->nsegs = k;
    d->windows = 0;
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = rt_fnv_u64(h, (uint64_t)d->T);
    h = rt_fnv_u64(h, (uint64_t)d->shuffle);
    h = rt_fnv_u64(h, d->shuffle ? d->seed : 0);
    for (int64_t i = 0; i < d->nsegs; i++) {
        d->windows += d->segs[i].count;
        h = rt_fnv_u64(h, (uint64_t)d->shards[d->segs[i].shard].ntok);
        h = rt_fnv_u64(h, (uint64_t)d->segs[i].first);
        h = rt_fnv_u64(h, (uint64_t)d->segs[i].count);
    }
    d->fingerprint = h;
    rt_data_rewind(d);
    *out = d;
    return RT_OK;
}

/* ---- order and position ------------------------------------------------------------------------- */

/* The segment at position p.shard of epoch p.epoch, and the window number within its shard at
 * position p.window. */
static const RtSeg *rt_locate(const RtData *d, const RtDataPos *p, int64_t *window) {
    uint64_t si = p->shard, wi = p->window;
    if (d->shuffle) {
        RtPerm perm;
        rt_perm_init(&perm, (uint64_t)d->nsegs, d->seed, RT_RNG_DOMAIN_DATA, (uint32_t)p->epoch, RT_SHARD_ORDER_TWEAK);
        si = rt_perm_apply(&perm, si);
    }
    const RtSeg *seg = &d->segs[si];
    if (d->shuffle) {
        RtPerm perm;
        rt_perm_init(&perm, (uint64_t)seg->count, d->seed, RT_RNG_DOMAIN_DATA, (uint32_t)p->epoch, (uint32_t)si);
        wi = rt_perm_apply(&perm, wi);
    }
    *window = seg->first + (int64_t)wi;
    return seg;
}

static uint64_t rt_seg_count_at(const RtData *d, const RtDataPos *p) {
    int64_t w;
    return (uint64_t)rt_locate(d, &(RtDataPos){p->epoch, p->shard, 0, 0}, &w)->count;
}

static void rt_advance(const RtData *d, RtDataPos *p) {
    p->window++;
    if (p->window >= rt_seg_count_at(d, p)) {
        p->window = 0;
        p->shard++;
        if (p->shard >= (uint64_t)d->nsegs) {
            p->shard = 0;
            p->epoch++;
        }
    }
}

/* Opens shard i for reading (the one open before is closed): it must still be the file validated at
 * the start, with the size it had then. */
static RtStatus rt_shard_reopen(RtData *d, int64_t i, RtError *err) {
    const RtShard *s = &d->shards[i];
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->fd_shard = -1;
    int fd;
    int64_t size;
    RtStatus st = rt_open_regular(s->path, "data shard", &fd, &size, err);
    if (st != RT_OK) return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return rt_fail_errno(err, e, "cannot stat data shard '%s'", s->path);
    }
    if (sb.st_dev != s->dev || sb.st_ino != s->ino || size != s->size) {
        close(fd);
        if (sb.st_dev != s->dev || sb.st_ino != s->ino)
            return rt_fail(err, RT_ERR_IO, "data shard '%s' was replaced by another file while training read it", s->path);
        return rt_fail(err, RT_ERR_IO,
                       "data shard '%s' changed size while training read it: %lld bytes, not the %lld it had at the start",
                       s->path, (long long)size, (long long)s->size);
    }
    d->fd = fd;
    d->fd_shard = i;
    return RT_OK;
}

/* Window `window` of shard i: its T + 1 tokens' bytes into d->buf. */
static RtStatus rt_read_window(RtData *d, int64_t i, int64_t window, RtError *err) {
    if (d->fd_shard != i) {
        RtStatus st = rt_shard_reopen(d, i, err);
        if (st != RT_OK) return st;
    }
    const RtShard *s = &d->shards[i];
    int64_t n = (d->T + 1) * s->width, off = s->off + window * d->T * s->width;
    int64_t got = rt_pread_all(d->fd, d->buf, n, off);
    if (got < 0) return rt_fail_errno(err, errno, "cannot read data shard '%s'", s->path);
    if (got < n)
        return rt_fail(err, RT_ERR_IO,
                       "data shard '%s' was truncated while training read it: it had %lld bytes at the start, and "
                       "now ends before the %lld bytes of the window at byte %lld",
                       s->path, (long long)s->size, (long long)n, (long long)off);
    return RT_OK;
}

RtStatus rt_data_next(RtData *d, int64_t B, int32_t *x, int32_t *y, RtError *err) {
    if (B < 1) return rt_fail(err, RT_ERR_ARG, "data: a batch needs at least one sequence, not %lld", (long long)B);
    if (!x || !y) return rt_fail(err, RT_ERR_ARG, "data: no buffers for the batch");
    if (d->nparts > 0) { /* B/N rows from each source, in turn; all or none move */
        if (B % d->nparts != 0)
            return rt_fail(err, RT_ERR_ARG, "data: a batch of %lld rows cannot be split evenly between %lld data sets",
                           (long long)B, (long long)d->nparts);
        int64_t b = B / d->nparts;
        for (int64_t i = 0; i < d->nparts; i++) {
            RtDataPos was = d->parts[i]->pos;
            RtStatus st = rt_data_next(d->parts[i], b, x + i * b * d->T, y + i * b * d->T, err);
            if (st != RT_OK) {
                d->parts[i]->pos = was;
                for (int64_t j = 0; j < i; j++) { /* back to where they were */
                    rt_data_rewind(d->parts[j]);
                    rt_data_skip(d->parts[j], (int64_t)d->taken);
                }
                return st;
            }
        }
        d->taken += (uint64_t)b;
        d->pos.window = d->taken;
        return RT_OK;
    }
    RtDataPos p = d->pos; /* committed only when the whole batch is read */
    int64_t T = d->T;
    for (int64_t b = 0; b < B; b++) {
        int64_t window;
        const RtSeg *seg = rt_locate(d, &p, &window);
        const RtShard *s = &d->shards[seg->shard];
        int64_t start = window * T;
        int32_t *xr = x + b * T, *yr = y + b * T;
        RtStatus st = rt_read_window(d, seg->shard, window, err);
        if (st != RT_OK) return st;
        for (int64_t i = 0; i <= T; i++) {
            uint32_t t = rt_token(d->buf, s->width, i);
            if ((d->vocab > 0 && (int64_t)t >= d->vocab) || t > (uint32_t)INT32_MAX) {
                int64_t at = start + i;
                int64_t byte = s->off + at * s->width;
                if (d->vocab > 0)
                    return rt_fail(err, RT_ERR_FORMAT,
                                   "data shard '%s': token id %u at token %lld (byte offset %lld) is not below the "
                                   "vocabulary size %lld",
                                   s->path, t, (long long)at, (long long)byte, (long long)d->vocab);
                return rt_fail(err, RT_ERR_FORMAT,
                               "data shard '%s': token id %u at token %lld (byte offset %lld) does not fit in int32", s->path, t,
                               (long long)at, (long long)byte);
            }
            if (i < T) xr[i] = (int32_t)t;
            if (i > 0) yr[i - 1] = (int32_t)t;
        }
        rt_advance(d, &p);
    }
    d->pos = p;
    return RT_OK;
}

/* Data parallelism: every rank walks the same order of windows and skips the ones other ranks
 * read, so a global batch is the same windows at any number of ranks (docs/parallel.md). */
void rt_data_skip(RtData *d, int64_t n) {
    if (d->nparts > 0) { /* n rows: n/N of each source's (the train loop skips whole micro-batches) */
        for (int64_t i = 0; i < d->nparts; i++) rt_data_skip(d->parts[i], n / d->nparts);
        d->taken += (uint64_t)(n / d->nparts);
        d->pos.window = d->taken;
        return;
    }
    for (int64_t i = 0; i < n; i++) rt_advance(d, &d->pos);
}

RtDataPos rt_data_tell(const RtData *d) { return d->pos; }

RtStatus rt_data_seek(RtData *d, const RtDataPos *pos, RtError *err) {
    if (pos->fingerprint != d->fingerprint)
        return rt_fail(err, RT_ERR_ARG,
                       "cannot restore the data position: it was saved from other data or settings (fingerprint "
                       "%016llx, these data have %016llx)",
                       (unsigned long long)pos->fingerprint, (unsigned long long)d->fingerprint);
    if (d->nparts > 0) {
        if (pos->epoch != 0 || pos->shard != 0 || pos->window > (uint64_t)INT64_MAX)
            return rt_fail(err, RT_ERR_ARG,
                           "cannot restore the data position: epoch %llu, shard %llu is not a position of %lld data sets",
                           (unsigned long long)pos->epoch, (unsigned long long)pos->shard, (long long)d->nparts);
        rt_data_rewind(d);
        rt_data_skip(d, (int64_t)pos->window * d->nparts);
        return RT_OK;
    }
    if (pos->epoch > UINT32_MAX || pos->shard >= (uint64_t)d->nsegs || pos->window >= rt_seg_count_at(d, pos))
        return rt_fail(err, RT_ERR_ARG,
                       "cannot restore the data position: epoch %llu, shard %llu, window %llu is outside the data",
                       (unsigned long long)pos->epoch, (unsigned long long)pos->shard, (unsigned long long)pos->window);
    d->pos = *pos;
    return RT_OK;
}

void rt_data_rewind(RtData *d) {
    for (int64_t i = 0; i < d->nparts; i++) rt_data_rewind(d->parts[i]);
    d->taken = 0;
    d->pos = (RtDataPos){0, 0, 0, d->fingerprint};
}

int64_t rt_data_windows(const RtData *d) { return d->windows; }
int64_t rt_data_seq(const RtData *d) { return d->T; }
int64_t rt_data_nfiles(const RtData *d) { return d->nshards; }
/* A composite's files are its parts', in order. */
static const RtData *rt_file_owner(const RtData *d, int64_t *i) {
    for (int64_t k = 0; k < d->nparts; k++) {
        if (*i < d->parts[k]->nshards) return d->parts[k];
        *i -= d->parts[k]->nshards;
    }
    return d;
}
const char *rt_data_file(const RtData *d, int64_t i) {
    if (i < 0 || i >= d->nshards) return NULL;
    d = rt_file_owner(d, &i);
    return d->shards[i].path;
}
int64_t rt_data_file_tokens(const RtData *d, int64_t i) {
    if (i < 0 || i >= d->nshards) return -1;
    d = rt_file_owner(d, &i);
    return d->shards[i].ntok;
}

/* ---- writing shards ----------------------------------------------------------------------------- */

RtStatus rt_shard_write(const char *path, RtShardFormat fmt, const uint32_t *tokens, int64_t n, RtError *err) {
    if (fmt != RT_SHARD_LLMC && fmt != RT_SHARD_LLMC_U32 && fmt != RT_SHARD_RAW)
        return rt_fail(err, RT_ERR_ARG, "cannot write data shard '%s': unknown format %d", path, (int)fmt);
    if (n < 0 || (n > 0 && !tokens)) return rt_fail(err, RT_ERR_ARG, "cannot write data shard '%s': no tokens", path);
    if (fmt != RT_SHARD_RAW && n > INT32_MAX)
        return rt_fail(err, RT_ERR_ARG, "cannot write data shard '%s': %lld tokens do not fit an llm.c header", path,
                       (long long)n);
    int width = fmt == RT_SHARD_LLMC_U32 ? 4 : 2;
    for (int64_t i = 0; width == 2 && i < n; i++)
        if (tokens[i] > 0xFFFF)
            return rt_fail(err, RT_ERR_ARG, "cannot write data shard '%s': token %lld is %u, which does not fit uint16", path,
                           (long long)i, tokens[i]);
    RtAtomicFile f;
    RtStatus st = rt_atomic_begin(&f, path, "data shard", err);
    if (st != RT_OK) return st;
    enum { CHUNK = 1 << 14 };
    unsigned char buf[CHUNK * 4];
    if (fmt != RT_SHARD_RAW) {
        unsigned char hdr[RT_LLMC_HEADER_BYTES];
        memset(hdr, 0, sizeof hdr);
        uint32_t words[3] = {fmt == RT_SHARD_LLMC ? RT_LLMC_MAGIC : RT_LLMC_MAGIC_U32, RT_LLMC_VERSION, (uint32_t)n};
        for (int w = 0; w < 3; w++)
            for (int k = 0; k < 4; k++) hdr[4 * w + k] = (unsigned char)(words[w] >> (8 * k));
        st = rt_atomic_write(&f, hdr, sizeof hdr, err);
    }
    for (int64_t i = 0; st == RT_OK && i < n; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        for (int64_t j = 0; j < m; j++)
            for (int k = 0; k < width; k++) buf[j * width + k] = (unsigned char)(tokens[i + j] >> (8 * k));
        st = rt_atomic_write(&f, buf, (size_t)(m * width), err);
    }
    if (st != RT_OK) {
        rt_atomic_abort(&f);
        return st;
    }
    return rt_atomic_commit(&f, err);
}
