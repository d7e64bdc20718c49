/* safetensors.c - reading and writing safetensors files (see rt.h; docs/runtime.md).
 *
 * Pipeline position: checkpoints (weights, optimizer state) are written here, and Hugging Face
 * weights (GPT-2, Llama) are read here by name for `serve { weights = ... }` and fine-tuning.
 *
 * The format (github.com/huggingface/safetensors, README "Format"): 8 bytes, a little-endian
 * uint64 N; N bytes of UTF-8 JSON, starting with '{' and possibly padded with spaces: an object
 * mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
 * "__metadata__" object of strings; then the data, to which the offsets are relative. The data
 * must be covered exactly by the tensors, without holes or overlaps.
 *
 * Reading never maps the file (a mapped file that another process truncates raises SIGBUS):
 * the header is read with pread when the file is opened, and each tensor's bytes when it is read,
 * a MiB at a time, so a file that shrank since it was opened is an error naming the tensor. It
 * trusts nothing: the header, capped at 100 MB as in the reference
 * implementation, is parsed by the runtime's JSON reader (json.c over jansson: strict, a key
 * repeated in one object refused, nesting bounded) and then checked against the schema here;
 * every offset, size and product is checked before use. Any malformed input is an RT_ERR_FORMAT
 * naming the file and the problem (a syntax error with its byte in the file, a schema error with
 * the tensor or key), never a read out of bounds.
 *
 * Writing follows the reference serializer (safetensors/src/tensor.rs, `prepare`): tensors laid
 * out in descending dtype order then by name (so each tensor's data is aligned to its element
 * size), compact JSON with `__metadata__` first, the header padded with spaces to a multiple of
 * 8 bytes, built and written by the same JSON module. Without metadata the bytes are identical to
 * the reference's; the test checks this against the reference's own expected outputs. The file is
 * written atomically (rt_file.c). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

/* ---- messages ----------------------------------------------------------------------------------- */

/* rt_fail, with the message kept to one line: tensor names and metadata keys come from the file
 * and may hold any character (a name "a\nb" is valid JSON), so control characters in the
 * formatted message are written as escapes (\n, \t, \r, \xNN). Every failure in this file goes
 * through here (found by fuzzing: a name holding a newline split the message in two). */
static RtStatus rt_st_fail(RtError *e, RtStatus code, const char *fmt, ...) RT_PRINTF(3, 4);
static RtStatus rt_st_fail(RtError *e, RtStatus code, const char *fmt, ...) {
    if (!e) return code;
    char raw[RT_ERROR_MAX], esc[4 * RT_ERROR_MAX + 8];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    if (n < 0) return rt_fail(e, code, "(unprintable error message)");
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        unsigned c = *p;
        if (c >= 0x20 && c != 0x7F) esc[k++] = (char)c;
        else if (c == '\n' || c == '\t' || c == '\r') {
            esc[k++] = '\\';
            esc[k++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else {
            k += (size_t)snprintf(esc + k, sizeof esc - k, "\\x%02x", c);
        }
    }
    if ((size_t)n >= sizeof raw) { /* cut already: make sure rt_fail marks it so */
        memcpy(esc + k, "...", 3);
        k += 3;
    }
    esc[k] = 0;
    return rt_fail(e, code, "%s", esc);
}

/* ---- dtypes ------------------------------------------------------------------------------------- */

static const char *const rt_dtype_names[RT_DTYPE_COUNT] = {
    "BOOL", "U8",   "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
    "F16",  "BF16", "I32", "U32",     "F32",     "C64",     "F64",         "I64",         "U64",
};
static const unsigned char rt_dtype_sizes[RT_DTYPE_COUNT] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 8};

const char *rt_dtype_name(RtDtype t) { return (unsigned)t < RT_DTYPE_COUNT ? rt_dtype_names[t] : "?"; }

int rt_dtype_size(RtDtype t) { return (unsigned)t < RT_DTYPE_COUNT ? rt_dtype_sizes[t] : 0; }

int rt_dtype_parse(const char *s, RtDtype *out) {
    for (int i = 0; i < RT_DTYPE_COUNT; i++)
        if (strcmp(s, rt_dtype_names[i]) == 0) {
            *out = (RtDtype)i;
            return 1;
        }
    return 0;
}

/* ---- conversions -------------------------------------------------------------------------------- */

static uint32_t rt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float rt_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float rt_bf16_to_f32(uint16_t h) { return rt_bits_f32((uint32_t)h << 16); }

uint16_t rt_f32_to_bf16(float f) {
    uint32_t u = rt_f32_bits(f);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x0040); /* NaN: keep it quiet */
    uint32_t bias = 0x7FFF + ((u >> 16) & 1);                                 /* ties to even */
    return (uint16_t)((u + bias) >> 16);
}

float rt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    if (exp == 31) return rt_bits_f32(sign | 0x7F800000 | (mant << 13));
    return rt_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t rt_f32_to_f16(float f) {
    uint32_t u = rt_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t x = u & 0x7FFFFFFF;
    if (x > 0x7F800000) return (uint16_t)(sign | 0x7E00 | ((x >> 13) & 0x3FF)); /* NaN */
    if (x >= 0x477FF000) return (uint16_t)(sign | 0x7C00);                      /* >= 65520 rounds to inf */
    uint32_t e = x >> 23;
    if (e < 113) {                /* below 2^-14: a subnormal half (or zero) */
        if (e < 102) return sign; /* below 2^-25: rounds to zero */
        uint32_t m = (x & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((e - 112) << 10) | ((x & 0x7FFFFF) >> 13);
    uint32_t rem = x & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

/* ---- the open file ------------------------------------------------------------------------------ */

struct RtStFile {
    char *label;                /* the path, for messages */
    int fd;                     /* when opened from a path: -1 otherwise */
    unsigned char *head;        /* when opened from a path: the 8-byte length and the header */
    const unsigned char *bytes; /* the whole file (from memory), or head (from a path) */
    size_t size;                /* the file's size when it was opened */
    uint64_t data_at;           /* where the data starts: 8 + the header's length */
    RtStTensor *t;              /* in data-offset order once validated */
    int64_t nt;
    RtStTensor **by_name; /* sorted by name */
    char **mkey, **mval;  /* __metadata__, header order */
    int64_t nmeta;
};

void rt_st_close(RtStFile *f) {
    if (!f) return;
    for (int64_t i = 0; i < f->nt; i++) free((char *)f->t[i].name);
    for (int64_t i = 0; i < f->nmeta; i++) {
        free(f->mkey[i]);
        free(f->mval[i]);
    }
    free(f->t);
    free(f->by_name);
    free(f->mkey);
    free(f->mval);
    if (f->fd >= 0) close(f->fd);
    free(f->head);
    free(f->label);
    free(f);
}

/* ---- the header ---------------------------------------------------------------------------------- */

/* The header is read by the runtime's JSON reader (json.c: strict RFC 8259, a key repeated in
 * one object refused, so tensor names and __metadata__ keys are unique), then checked against
 * safetensors' schema here: an object of tensor entries - objects of exactly dtype, shape and
 * data_offsets - and at most one __metadata__ object of strings. A schema error names the tensor
 * or key it is about. */

#define RT_ST_MAX_INT (INT64_C(1) << 53) /* larger whole numbers are not exact in JSON readers */

typedef struct RtStCtx {
    RtStFile *f;
    RtError *err;
} RtStCtx;

static RtStatus rt_st_schema(RtStCtx *c, const char *fmt, ...) RT_PRINTF(2, 3);
static RtStatus rt_st_schema(RtStCtx *c, const char *fmt, ...) {
    char what[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rt_st_fail(c->err, RT_ERR_FORMAT, "safetensors file '%s': malformed header: %s", c->f->label, what);
}

static RtStatus rt_st_nomem(RtStCtx *c) {
    return rt_fail_errno(c->err, ENOMEM, "cannot read safetensors file '%s'", c->f->label);
}

/* What a JSON value is, for messages. */
static const char *rt_st_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "a whole number";
    case JSON_REAL: return "a fraction or exponent";
    default: return "true, false or null";
    }
}

/* A whole number in [0, 2^53]: a shape's dimension or a data offset. */
static RtStatus rt_st_whole(RtStCtx *c, const json_t *v, const char *field, const char *name, uint64_t *out) {
    if (!json_is_integer(v))
        return rt_st_schema(c, "%s of tensor \"%.100s\" must hold whole numbers, not %s", field, name, rt_st_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < 0) return rt_st_schema(c, "%s of tensor \"%.100s\" holds a negative number", field, name);
    if (x > RT_ST_MAX_INT) return rt_st_schema(c, "%s of tensor \"%.100s\" holds a number above 2^53", field, name);
    *out = (uint64_t)x;
    return RT_OK;
}

static RtStatus rt_st_dtype(RtStCtx *c, const json_t *v, RtStTensor *t) {
    const char *s = json_string_value(v);
    if (!s) return rt_st_schema(c, "dtype of tensor \"%.100s\" must be a string, not %s", t->name, rt_st_kind(v));
    if (rt_dtype_parse(s, &t->dtype)) return RT_OK;
    if (strcmp(s, "F4") == 0 || strcmp(s, "F6_E2M3") == 0 || strcmp(s, "F6_E3M2") == 0)
        return rt_st_schema(c, "dtype \"%s\" of tensor \"%.100s\" is not supported (its elements are smaller than a byte)", s,
                            t->name);
    return rt_st_schema(c, "unknown dtype \"%.40s\" of tensor \"%.100s\"", s, t->name);
}

static RtStatus rt_st_shape(RtStCtx *c, const json_t *v, RtStTensor *t) {
    if (!json_is_array(v)) return rt_st_schema(c, "shape of tensor \"%.100s\" must be a list, not %s", t->name, rt_st_kind(v));
    if (json_array_size(v) > RT_ST_MAX_RANK)
        return rt_st_schema(c, "shape of tensor \"%.100s\" has more than %d dimensions", t->name, RT_ST_MAX_RANK);
    t->rank = (int)json_array_size(v);
    for (int d = 0; d < t->rank; d++) {
        uint64_t x;
        RtStatus st = rt_st_whole(c, json_array_get(v, (size_t)d), "shape", t->name, &x);
        if (st != RT_OK) return st;
        t->shape[d] = (int64_t)x;
    }
    return RT_OK;
}

static RtStatus rt_st_offsets(RtStCtx *c, const json_t *v, RtStTensor *t) {
    if (!json_is_array(v))
        return rt_st_schema(c, "data_offsets of tensor \"%.100s\" must be a list, not %s", t->name, rt_st_kind(v));
    if (json_array_size(v) != 2)
        return rt_st_schema(c, "data_offsets of tensor \"%.100s\" must hold two numbers, not %zu", t->name, json_array_size(v));
    RtStatus st = rt_st_whole(c, json_array_get(v, 0), "data_offsets", t->name, &t->begin);
    return st == RT_OK ? rt_st_whole(c, json_array_get(v, 1), "data_offsets", t->name, &t->end) : st;
}

/* One tensor entry into t (name already set). */
static RtStatus rt_st_entry(RtStCtx *c, const json_t *v, RtStTensor *t) {
    if (!json_is_object(v)) return rt_st_schema(c, "tensor \"%.100s\" must be an object, not %s", t->name, rt_st_kind(v));
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        RtStatus st = strcmp(key, "dtype") == 0   ? rt_st_dtype(c, x, t)
                      : strcmp(key, "shape") == 0 ? rt_st_shape(c, x, t)
                      : strcmp(key, "data_offsets") == 0
                          ? rt_st_offsets(c, x, t)
                          : rt_st_schema(c, "unknown key \"%.100s\" in tensor \"%.100s\" (expected dtype, shape, data_offsets)",
                                         key, t->name);
        if (st != RT_OK) return st;
    }
    static const char *const need[3] = {"dtype", "shape", "data_offsets"};
    for (int k = 0; k < 3; k++)
        if (!json_object_get(v, need[k])) return rt_st_schema(c, "tensor \"%.100s\" has no %s", t->name, need[k]);
    return RT_OK;
}

static RtStatus rt_st_metadata(RtStCtx *c, const json_t *v) {
    if (!json_is_object(v)) return rt_st_schema(c, "__metadata__ must be an object, not %s", rt_st_kind(v));
    RtStFile *f = c->f;
    size_t n = json_object_size(v);
    f->mkey = calloc(n ? n : 1, sizeof *f->mkey);
    f->mval = calloc(n ? n : 1, sizeof *f->mval);
    if (!f->mkey || !f->mval) return rt_st_nomem(c);
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (!json_is_string(x))
            return rt_st_schema(c, "the value of __metadata__ key \"%.100s\" must be a string, not %s", key, rt_st_kind(x));
        f->mkey[f->nmeta] = strdup(key);
        f->mval[f->nmeta] = strdup(json_string_value(x));
        f->nmeta++;
        if (!f->mkey[f->nmeta - 1] || !f->mval[f->nmeta - 1]) return rt_st_nomem(c);
    }
    return RT_OK;
}

static RtStatus rt_st_header(RtStFile *f, const unsigned char *text, size_t n, RtError *err) {
    RtStCtx c = {f, err};
    if (n == 0 || text[0] != '{') {
        char found[24] = "the end of the header";
        if (n) snprintf(found, sizeof found, text[0] >= 0x20 && text[0] < 0x7F ? "'%c'" : "byte 0x%02x", text[0]);
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s': malformed header at byte 8: the header must start with '{', found %s", f->label,
                          found);
    }
    char what[4200];
    snprintf(what, sizeof what, "safetensors file '%s': malformed header", f->label);
    json_t *root = NULL;
    RtStatus st = rt_json_parse(&root, text, n, 8, what, err);
    if (st != RT_OK) return rt_st_fail(err, st, "%s", err ? err->msg : "");
    f->t = calloc(json_object_size(root) + 1, sizeof *f->t);
    if (!f->t) st = rt_st_nomem(&c);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (st != RT_OK) break;
        if (strcmp(key, "__metadata__") == 0) {
            st = rt_st_metadata(&c, v);
            continue;
        }
        RtStTensor *t = &f->t[f->nt];
        if (!(t->name = strdup(key))) st = rt_st_nomem(&c);
        else {
            f->nt++;
            st = rt_st_entry(&c, v, t);
        }
    }
    json_decref(root);
    return st;
}

/* ---- validation --------------------------------------------------------------------------------- */

static int rt_cmp_offsets(const void *a, const void *b) {
    const RtStTensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int rt_cmp_tensor_names(const void *a, const void *b) {
    return strcmp((*(RtStTensor *const *)a)->name, (*(RtStTensor *const *)b)->name);
}

/* "[2, 3]" into buf. */
static const char *rt_shape_str(const RtStTensor *t, char *buf, size_t cap) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int d = 0; d < t->rank && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

static RtStatus rt_st_validate(RtStFile *f, uint64_t data_size, RtError *err) {
    const char *L = f->label;
    for (int64_t i = 0; i < f->nt; i++) {
        RtStTensor *t = &f->t[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->rank; d++) {
            uint64_t s = (uint64_t)t->shape[d];
            if (s != 0 && numel > (UINT64_C(1) << 62) / s)
                return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' has too many elements", L, t->name);
            numel *= s;
        }
        if (numel > (UINT64_C(1) << 62) / 8)
            return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' has too many elements", L, t->name);
        uint64_t bytes = numel * (uint64_t)rt_dtype_size(t->dtype); /* < 2^62: no overflow */
        t->numel = (int64_t)numel;
        if (t->begin > t->end)
            return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' has reversed data_offsets [%llu, %llu]", L,
                              t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->end > data_size)
            return rt_st_fail(err, RT_ERR_FORMAT,
                              "safetensors file '%s': tensor '%s' has data_offsets [%llu, %llu] outside the data (%llu bytes)", L,
                              t->name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size);
        if (t->end - t->begin != bytes) {
            char sh[256];
            return rt_st_fail(err, RT_ERR_FORMAT,
                              "safetensors file '%s': tensor '%s' is %s %s (%llu bytes) but its data_offsets [%llu, %llu] "
                              "span %llu bytes",
                              L, t->name, rt_dtype_name(t->dtype), rt_shape_str(t, sh, sizeof sh), (unsigned long long)bytes,
                              (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
        }
    }
    /* Offsets: in order they must tile the data exactly (the format forbids holes). Names are
     * unique (the JSON reader refuses a repeated key); pointers sorted by name serve rt_st_find. */
    qsort(f->t, (size_t)f->nt, sizeof *f->t, rt_cmp_offsets);
    f->by_name = malloc((size_t)(f->nt ? f->nt : 1) * sizeof *f->by_name);
    if (!f->by_name) return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", L);
    for (int64_t i = 0; i < f->nt; i++) f->by_name[i] = &f->t[i];
    qsort(f->by_name, (size_t)f->nt, sizeof *f->by_name, rt_cmp_tensor_names);
    uint64_t at = 0;
    const RtStTensor *prev = NULL;
    for (int64_t i = 0; i < f->nt; i++) {
        const RtStTensor *t = &f->t[i];
        if (t->begin < at)
            return rt_st_fail(err, RT_ERR_FORMAT,
                              "safetensors file '%s': tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", L, prev->name,
                              (unsigned long long)prev->begin, (unsigned long long)prev->end, t->name,
                              (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->begin > at)
            return rt_st_fail(err, RT_ERR_FORMAT,
                              "safetensors file '%s': data bytes [%llu, %llu) before tensor '%s' belong to no tensor", L,
                              (unsigned long long)at, (unsigned long long)t->begin, t->name);
        at = t->end;
        prev = t;
    }
    if (at != data_size)
        return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': data bytes [%llu, %llu) at the end belong to no tensor", L,
                          (unsigned long long)at, (unsigned long long)data_size);
    return RT_OK;
}

/* ---- opening ------------------------------------------------------------------------------------ */

static RtStatus rt_st_parse(RtStFile *f, RtError *err) {
    const char *L = f->label;
    if (f->size < 8)
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s' is truncated: %zu bytes, too short for the 8-byte header length", L, f->size);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | f->bytes[k];
    if (n > RT_ST_MAX_HEADER)
        return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': header length %llu exceeds the limit of %llu bytes", L,
                          (unsigned long long)n, (unsigned long long)RT_ST_MAX_HEADER);
    if (n > f->size - 8)
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s': header length %llu is beyond the end of the file (%zu bytes)", L,
                          (unsigned long long)n, f->size);
    RtStatus st = rt_st_header(f, f->bytes + 8, (size_t)n, err);
    if (st != RT_OK) return st;
    st = rt_st_validate(f, (uint64_t)(f->size - 8 - n), err);
    if (st != RT_OK) return st;
    f->data_at = 8 + n;
    /* From memory, a tensor's bytes have an address; from a path they are read when asked for. */
    for (int64_t i = 0; i < f->nt; i++) f->t[i].data = f->fd < 0 ? f->bytes + f->data_at + f->t[i].begin : NULL;
    return RT_OK;
}

static RtStatus rt_st_new(RtStFile **out, const char *label, RtError *err) {
    *out = calloc(1, sizeof **out);
    if (*out) (*out)->fd = -1;
    if (*out) (*out)->label = strdup(label);
    if (!*out || !(*out)->label) {
        free(*out);
        *out = NULL;
        return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", label);
    }
    return RT_OK;
}

/* Opens path and reads what rt_st_parse looks at: the 8-byte length, and the header when that
 * length is within the limit and the file (otherwise the parse reports it from the length). */
static RtStatus rt_st_read_head(RtStFile *f, const char *path, RtError *err) {
    int64_t size;
    RtStatus st = rt_open_regular(path, "safetensors file", &f->fd, &size, err);
    if (st != RT_OK) return st;
    f->size = (size_t)size;
    unsigned char len8[8];
    int64_t want = size < 8 ? size : 8;
    int64_t got = rt_pread_all(f->fd, len8, want, 0);
    if (got < 0) return rt_fail_errno(err, errno, "cannot read safetensors file '%s'", path);
    uint64_t n = 0;
    if (got == 8)
        for (int k = 7; k >= 0; k--) n = n << 8 | len8[k];
    if (got < 8 || n > RT_ST_MAX_HEADER || n > (uint64_t)size - 8) n = 0;
    f->head = malloc((size_t)(8 + n));
    if (!f->head) return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", path);
    want = size < 8 ? size : (int64_t)(8 + n);
    got = rt_pread_all(f->fd, f->head, want, 0);
    if (got < 0) return rt_fail_errno(err, errno, "cannot read safetensors file '%s'", path);
    if (got < want)
        return rt_st_fail(err, RT_ERR_IO, "safetensors file '%s' shrank while its header was read (%lld of %lld bytes)", path,
                          (long long)got, (long long)want);
    f->bytes = f->head;
    return RT_OK;
}

RtStatus rt_st_open(RtStFile **out, const char *path, RtError *err) {
    RtStFile *f;
    RtStatus st = rt_st_new(&f, path, err);
    if (st != RT_OK) {
        *out = NULL;
        return st;
    }
    st = rt_st_read_head(f, path, err);
    if (st == RT_OK) st = rt_st_parse(f, err);
    if (st != RT_OK) {
        rt_st_close(f);
        f = NULL;
    }
    *out = f;
    return st;
}

RtStatus rt_st_open_memory(RtStFile **out, const void *bytes, size_t n, const char *label, RtError *err) {
    RtStFile *f;
    RtStatus st = rt_st_new(&f, label ? label : "(memory)", err);
    if (st != RT_OK) {
        *out = NULL;
        return st;
    }
    f->bytes = bytes;
    f->size = n;
    st = rt_st_parse(f, err);
    if (st != RT_OK) {
        rt_st_close(f);
        f = NULL;
    }
    *out = f;
    return st;
}

/* ---- queries and reading ------------------------------------------------------------------------ */

int64_t rt_st_count(const RtStFile *f) { return f->nt; }

const RtStTensor *rt_st_tensor(const RtStFile *f, int64_t i) { return i >= 0 && i < f->nt ? &f->t[i] : NULL; }

const RtStTensor *rt_st_find(const RtStFile *f, const char *name) {
    int64_t lo = 0, hi = f->nt;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int64_t rt_st_meta_count(const RtStFile *f) { return f->nmeta; }
const char *rt_st_meta_key(const RtStFile *f, int64_t i) { return i >= 0 && i < f->nmeta ? f->mkey[i] : NULL; }
const char *rt_st_meta_value(const RtStFile *f, int64_t i) { return i >= 0 && i < f->nmeta ? f->mval[i] : NULL; }

const char *rt_st_meta_get(const RtStFile *f, const char *key) {
    for (int64_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->mkey[i], key) == 0) return f->mval[i];
    return NULL;
}

/* The checks every read starts with. */
static RtStatus rt_st_read_check(const RtStFile *f, const RtStTensor *t, const void *dst, int64_t n, RtError *err) {
    uintptr_t at = (uintptr_t)t, first = (uintptr_t)f->t, past = (uintptr_t)(f->t + f->nt);
    if (!t || at < first || at >= past || (at - first) % sizeof *t)
        return rt_st_fail(err, RT_ERR_ARG, "safetensors file '%s': the tensor to read is not one of this file's", f->label);
    if (n != t->numel)
        return rt_st_fail(err, RT_ERR_ARG, "safetensors file '%s': tensor '%s' has %lld elements, not the %lld asked for",
                          f->label, t->name, (long long)t->numel, (long long)n);
    if (n > 0 && !dst)
        return rt_st_fail(err, RT_ERR_ARG, "safetensors file '%s': no buffer to read '%s' into", f->label, t->name);
    return RT_OK;
}

static uint16_t rt_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rt_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rt_le64(const unsigned char *p) { return (uint64_t)rt_le32(p) | (uint64_t)rt_le32(p + 4) << 32; }

#define RT_ST_CHUNK ((int64_t)1 << 20) /* bytes read with one pread: a multiple of every element size */

/* The bytes [off, off + len) of t's data: their address from memory, or read with pread into
 * *buf (allocated on first use, RT_ST_CHUNK bytes; len is at most that). A file that ends before
 * them shrank since it was opened (its header was checked against its size then). */
static RtStatus rt_st_bytes(const RtStFile *f, const RtStTensor *t, int64_t off, int64_t len, unsigned char **buf,
                            const unsigned char **p, RtError *err) {
    if (f->fd < 0) {
        *p = t->data + off;
        return RT_OK;
    }
    if (!*buf && !(*buf = malloc((size_t)RT_ST_CHUNK)))
        return rt_fail_errno(err, ENOMEM, "cannot read tensor '%s' of safetensors file '%s'", t->name, f->label);
    int64_t at = (int64_t)(f->data_at + t->begin) + off;
    int64_t got = rt_pread_all(f->fd, *buf, len, at);
    if (got < 0) return rt_fail_errno(err, errno, "cannot read tensor '%s' of safetensors file '%s'", t->name, f->label);
    if (got < len) {
        struct stat sb;
        long long now = fstat(f->fd, &sb) == 0 ? (long long)sb.st_size : at + got;
        return rt_st_fail(err, RT_ERR_IO,
                          "safetensors file '%s' shrank while it was read: it was %zu bytes when opened and is %lld now, "
                          "so tensor '%s' (bytes %lld to %lld) cannot be read",
                          f->label, f->size, now, t->name, (long long)(f->data_at + t->begin), (long long)(f->data_at + t->end));
    }
    *p = *buf;
    return RT_OK;
}

typedef enum { RT_AS_F32, RT_AS_I64, RT_AS_I32, RT_AS_RAW } RtStAs;

/* Converts element i of p (t's dtype) into dst (as `as`); 0, or -1 for an I64 beyond int32. */
static int rt_st_convert(const RtStTensor *t, const unsigned char *p, int64_t i, void *dst, int64_t at, RtStAs as) {
    if (as == RT_AS_F32) {
        float *d = (float *)dst + at;
        switch (t->dtype) {
        case RT_F32: *d = rt_bits_f32(rt_le32(p + 4 * i)); break;
        case RT_F16: *d = rt_f16_to_f32(rt_le16(p + 2 * i)); break;
        case RT_BF16: *d = rt_bf16_to_f32(rt_le16(p + 2 * i)); break;
        default: {
            uint64_t u = rt_le64(p + 8 * i);
            double x;
            memcpy(&x, &u, 8);
            *d = (float)x;
        }
        }
        return 0;
    }
    int64_t v = t->dtype == RT_I64 ? (int64_t)rt_le64(p + 8 * i) : (int32_t)rt_le32(p + 4 * i);
    if (as == RT_AS_I64) {
        ((int64_t *)dst)[at] = v;
        return 0;
    }
    if (v < INT32_MIN || v > INT32_MAX) return -1;
    ((int32_t *)dst)[at] = (int32_t)v;
    return 0;
}

/* Reads t's n elements into dst as `as`, a chunk at a time (the dtype was checked by the caller). */
static RtStatus rt_st_read_as(const RtStFile *f, const RtStTensor *t, void *dst, int64_t n, RtStAs as, RtError *err) {
    int64_t esize = rt_dtype_size(t->dtype);
    int64_t per = RT_ST_CHUNK / esize;
    unsigned char *buf = NULL;
    RtStatus st = RT_OK;
    for (int64_t i0 = 0; i0 < n && st == RT_OK; i0 += per) {
        int64_t k = n - i0 < per ? n - i0 : per;
        const unsigned char *p = NULL;
        st = rt_st_bytes(f, t, i0 * esize, k * esize, &buf, &p, err);
        if (st != RT_OK) break;
        if (as == RT_AS_RAW) {
            memcpy((unsigned char *)dst + i0 * esize, p, (size_t)(k * esize));
            continue;
        }
        for (int64_t i = 0; i < k; i++)
            if (rt_st_convert(t, p, i, dst, i0 + i, as) != 0) {
                st = rt_st_fail(err, RT_ERR_FORMAT,
                                "safetensors file '%s': element %lld of I64 tensor '%s' (%lld) does not fit int32", f->label,
                                (long long)(i0 + i), t->name, (long long)(int64_t)rt_le64(p + 8 * i));
                break;
            }
    }
    free(buf);
    return st;
}

RtStatus rt_st_read_f32(const RtStFile *f, const RtStTensor *t, float *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    if (t->dtype != RT_F32 && t->dtype != RT_F16 && t->dtype != RT_BF16 && t->dtype != RT_F64)
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s': tensor '%s' is %s, which cannot be read as f32 (F32, F16, "
                          "BF16 or F64 expected)",
                          f->label, t->name, rt_dtype_name(t->dtype));
    return rt_st_read_as(f, t, dst, n, RT_AS_F32, err);
}

RtStatus rt_st_read_i64(const RtStFile *f, const RtStTensor *t, int64_t *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    if (t->dtype != RT_I64 && t->dtype != RT_I32)
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s': tensor '%s' is %s, which cannot be read as i64 (I32 or I64 expected)", f->label,
                          t->name, rt_dtype_name(t->dtype));
    return rt_st_read_as(f, t, dst, n, RT_AS_I64, err);
}

RtStatus rt_st_read_i32(const RtStFile *f, const RtStTensor *t, int32_t *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    if (t->dtype != RT_I64 && t->dtype != RT_I32)
        return rt_st_fail(err, RT_ERR_FORMAT,
                          "safetensors file '%s': tensor '%s' is %s, which cannot be read as i32 (I32 or I64 expected)", f->label,
                          t->name, rt_dtype_name(t->dtype));
    return rt_st_read_as(f, t, dst, n, RT_AS_I32, err);
}

RtStatus rt_st_read_raw(const RtStFile *f, const RtStTensor *t, void *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    return rt_st_read_as(f, t, dst, n, RT_AS_RAW, err);
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* A string the header may hold: UTF-8 that a JSON string can carry. Out of memory counts as
 * valid here: building the header then fails with ENOMEM. */
static int rt_st_name_ok(const char *s) {
    int nomem = 0;
    return rt_json_valid_utf8(s, &nomem) || nomem;
}

static int rt_cmp_entry_names(const void *a, const void *b) {
    return strcmp((*(const RtStEntry *const *)a)->name, (*(const RtStEntry *const *)b)->name);
}

/* The reference's layout order: descending dtype, then name. */
static int rt_cmp_layout(const void *a, const void *b) {
    const RtStEntry *x = *(const RtStEntry *const *)a, *y = *(const RtStEntry *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

static RtStatus rt_st_write_data(RtAtomicFile *af, const RtStEntry *e, uint64_t numel, RtError *err) {
    int size = rt_dtype_size(e->dtype);
    if (!e->from_f32) return numel ? rt_atomic_write(af, e->data, numel * (uint64_t)size, err) : RT_OK;
    enum { CHUNK = 4096 };
    unsigned char buf[CHUNK * 4];
    const float *src = e->data;
    for (uint64_t i = 0; i < numel; i += CHUNK) {
        uint64_t m = numel - i < CHUNK ? numel - i : CHUNK;
        for (uint64_t k = 0; k < m; k++) {
            float v = src[i + k];
            uint32_t u = e->dtype == RT_F32 ? rt_f32_bits(v) : e->dtype == RT_BF16 ? rt_f32_to_bf16(v) : rt_f32_to_f16(v);
            for (int q = 0; q < size; q++) buf[k * (uint64_t)size + (uint64_t)q] = (unsigned char)(u >> (8 * q));
        }
        RtStatus st = rt_atomic_write(af, buf, m * (uint64_t)size, err);
        if (st != RT_OK) return st;
    }
    return RT_OK;
}

/* The header's JSON text as the reference writes it (compact, __metadata__ first, then the
 * tensors in layout order), padded with spaces to a multiple of 8 bytes; malloc'd into *out. */
static RtStatus rt_st_header_text(const char *path, const RtStEntry *t, const RtStEntry **order, const uint64_t *numel, int64_t n,
                                  const RtStMeta *meta, int64_t nmeta, char **out, size_t *len, RtError *err) {
    json_t *root = json_object(), *m = nmeta > 0 ? json_object() : NULL;
    int bad = !root || (nmeta > 0 && json_object_set_new(root, "__metadata__", m) != 0);
    for (int64_t i = 0; i < nmeta && !bad; i++) bad = json_object_set_new(m, meta[i].key, json_string(meta[i].value)) != 0;
    uint64_t off = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        const RtStEntry *e = order[i];
        uint64_t bytes = numel[e - t] * (uint64_t)rt_dtype_size(e->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < e->rank && shape && !bad; d++) bad = json_array_append_new(shape, json_integer(e->shape[d])) != 0;
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", rt_dtype_name(e->dtype), "shape", shape, "data_offsets",
                                  (json_int_t)off, (json_int_t)(off + bytes));
        bad = bad || json_object_set_new(root, e->name, entry) != 0;
        off += bytes;
    }
    char *text = bad ? NULL : rt_json_text(root, JSON_COMPACT, len);
    json_decref(root);
    char *padded = text ? realloc(text, *len + 8) : NULL;
    if (!padded) {
        free(text);
        return rt_fail_errno(err, ENOMEM, "cannot write safetensors file '%s'", path);
    }
    while (*len % 8) padded[(*len)++] = ' ';
    *out = padded;
    return RT_OK;
}

RtStatus rt_st_write(const char *path, const RtStEntry *t, int64_t n, const RtStMeta *meta, int64_t nmeta, RtError *err) {
    if (n < 0 || nmeta < 0 || (n > 0 && !t) || (nmeta > 0 && !meta))
        return rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': bad tensor or metadata list", path);
    uint64_t *numel = calloc((size_t)(n ? n : 1), sizeof *numel);
    const RtStEntry **order = calloc((size_t)(n ? n : 1), sizeof *order);
    const RtStEntry **byname = calloc((size_t)(n ? n : 1), sizeof *byname);
    char *header = NULL;
    RtStatus st = RT_OK;
    if (!numel || !order || !byname) {
        st = rt_fail_errno(err, ENOMEM, "cannot write safetensors file '%s'", path);
        goto done;
    }
    /* Check everything before the file is touched. */
    for (int64_t i = 0; i < n && st == RT_OK; i++) {
        const RtStEntry *e = &t[i];
        if (!e->name || !*e->name || strcmp(e->name, "__metadata__") == 0 || !rt_st_name_ok(e->name)) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor %lld has an invalid name%s%s%s", path,
                            (long long)i, e->name ? " '" : "", e->name ? e->name : "", e->name ? "'" : "");
            break;
        }
        if ((unsigned)e->dtype >= RT_DTYPE_COUNT || e->rank < 0 || e->rank > RT_ST_MAX_RANK || (e->rank > 0 && !e->shape)) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' has a bad dtype or shape", path,
                            e->name);
            break;
        }
        if (e->from_f32 && e->dtype != RT_F32 && e->dtype != RT_F16 && e->dtype != RT_BF16) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' cannot be converted from f32 to %s",
                            path, e->name, rt_dtype_name(e->dtype));
            break;
        }
        uint64_t c = 1;
        for (int d = 0; d < e->rank; d++) {
            if (e->shape[d] < 0 || (e->shape[d] > 0 && c > (UINT64_C(1) << 56) / (uint64_t)e->shape[d])) {
                st =
                    rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' has a bad shape", path, e->name);
                break;
            }
            c *= (uint64_t)e->shape[d];
        }
        if (st == RT_OK && c > 0 && !e->data)
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' has no data", path, e->name);
        numel[i] = c;
        order[i] = e;
    }
    for (int64_t i = 0; i < nmeta && st == RT_OK; i++)
        if (!meta[i].key || !meta[i].value || !rt_st_name_ok(meta[i].key) || !rt_st_name_ok(meta[i].value))
            st = rt_st_fail(err, RT_ERR_ARG,
                            "cannot write safetensors file '%s': __metadata__ entry %lld is not a pair of UTF-8 strings", path,
                            (long long)i);
    for (int64_t i = 0; i < nmeta && st == RT_OK; i++)
        for (int64_t k = 0; k < i && st == RT_OK; k++)
            if (strcmp(meta[i].key, meta[k].key) == 0)
                st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': duplicate __metadata__ key '%s'", path,
                                meta[i].key);
    if (st != RT_OK) goto done;
    /* Names are unique (checked on a name-sorted copy: the layout order groups by dtype). */
    memcpy(byname, order, (size_t)n * sizeof *byname);
    qsort(byname, (size_t)n, sizeof *byname, rt_cmp_entry_names);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': duplicate tensor name '%s'", path,
                            byname[i]->name);
            goto done;
        }
    qsort(order, (size_t)n, sizeof *order, rt_cmp_layout);
    size_t hlen = 0;
    st = rt_st_header_text(path, t, order, numel, n, meta, nmeta, &header, &hlen, err);
    if (st != RT_OK) goto done;
    if (hlen > RT_ST_MAX_HEADER) {
        st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': the header would be %zu bytes, over the limit",
                        path, hlen);
        goto done;
    }
    RtAtomicFile af;
    st = rt_atomic_begin(&af, path, "safetensors file", err);
    if (st != RT_OK) goto done;
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
    st = rt_atomic_write(&af, len8, 8, err);
    if (st == RT_OK) st = rt_atomic_write(&af, header, hlen, err);
    for (int64_t i = 0; i < n && st == RT_OK; i++) st = rt_st_write_data(&af, order[i], numel[order[i] - t], err);
    if (st == RT_OK) st = rt_atomic_commit(&af, err);
    else rt_atomic_abort(&af);
done:
    free(header);
    free(numel);
    free(order);
    free(byname);
    return st;
}
