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
 * Reading maps the file and trusts nothing: the JSON parser below knows exactly this schema (so
 * nesting is bounded by construction), the header is capped at 100 MB as in the reference
 * implementation, and every offset, size and product is checked before use. Any malformed
 * input is an RT_ERR_FORMAT naming the file and the problem, never a read out of bounds.
 *
 * Writing follows the reference serializer (safetensors/src/tensor.rs, `prepare`): tensors laid
 * out in descending dtype order then by name (so each tensor's data is aligned to its element
 * size), compact JSON with `__metadata__` first, the header padded with spaces to a multiple of
 * 8 bytes. Without metadata the bytes are identical to the reference's; the test checks this
 * against the reference's own expected outputs. The file is written atomically (rt_file.c). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
    "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
};
static const unsigned char rt_dtype_sizes[RT_DTYPE_COUNT] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 8};

const char *rt_dtype_name(RtDtype t) {
    return (unsigned)t < RT_DTYPE_COUNT ? rt_dtype_names[t] : "?";
}

int rt_dtype_size(RtDtype t) {
    return (unsigned)t < RT_DTYPE_COUNT ? rt_dtype_sizes[t] : 0;
}

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

float rt_bf16_to_f32(uint16_t h) {
    return rt_bits_f32((uint32_t)h << 16);
}

uint16_t rt_f32_to_bf16(float f) {
    uint32_t u = rt_f32_bits(f);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x0040); /* NaN: keep it quiet */
    uint32_t bias = 0x7FFF + ((u >> 16) & 1);                                  /* ties to even */
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
    if (e < 113) { /* below 2^-14: a subnormal half (or zero) */
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
    RtMap map;                  /* when opened from a path */
    const unsigned char *bytes; /* the whole file */
    size_t size;
    RtStTensor *t; /* in data-offset order once validated */
    int64_t nt, tcap;
    RtStTensor **by_name; /* sorted by name */
    char **mkey, **mval;  /* __metadata__, header order */
    int64_t nmeta, mcap;
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
    rt_unmap(&f->map);
    free(f->label);
    free(f);
}

/* ---- the JSON header parser --------------------------------------------------------------------- */

/* A cursor over the header. The grammar is safetensors' schema, not general JSON: an object of
 * tensor entries (objects of exactly dtype/shape/data_offsets) and one __metadata__ object of
 * strings. Strings and whole numbers follow RFC 8259 strictly. */
typedef struct RtJson {
    const unsigned char *s;
    size_t n, i;
    RtStFile *f;
    RtError *err;
} RtJson;

static RtStatus rt_json_fail(RtJson *j, const char *fmt, ...) RT_PRINTF(2, 3);
static RtStatus rt_json_fail(RtJson *j, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rt_st_fail(j->err, RT_ERR_FORMAT, "safetensors file '%s': malformed header at offset %zu: %s", j->f->label,
                   8 + j->i, what);
}

/* What is at the cursor, for messages: "'x'", "byte 0x01", "the end of the header". */
static const char *rt_json_found(const RtJson *j, char *buf, size_t cap) {
    if (j->i >= j->n) return "the end of the header";
    unsigned char c = j->s[j->i];
    if (c >= 0x20 && c < 0x7F) snprintf(buf, cap, "'%c'", c);
    else snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

static void rt_json_ws(RtJson *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) j->i++;
}

static RtStatus rt_json_expect(RtJson *j, char c, const char *context) {
    rt_json_ws(j);
    if (j->i < j->n && j->s[j->i] == (unsigned char)c) {
        j->i++;
        return RT_OK;
    }
    char b[16];
    return rt_json_fail(j, "expected '%c' %s, found %s", c, context, rt_json_found(j, b, sizeof b));
}

/* Length of the well-formed UTF-8 sequence at p (at most avail bytes), or 0. */
static int rt_utf8_len(const unsigned char *p, size_t avail) {
    unsigned c = p[0];
    int len;
    uint32_t min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000, cp = c & 0x07;
    else return 0;
    if ((size_t)len > avail) return 0;
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static int rt_hex4(const unsigned char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

static size_t rt_utf8_put(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at the cursor (after optional whitespace), decoded into a malloc'd NUL-terminated
 * buffer. The decoded form is never longer than the encoded one, which bounds the buffer. */
static RtStatus rt_json_string(RtJson *j, char **out, const char *context) {
    *out = NULL;
    rt_json_ws(j);
    if (j->i >= j->n || j->s[j->i] != '"') {
        char b[16];
        return rt_json_fail(j, "expected a string %s, found %s", context, rt_json_found(j, b, sizeof b));
    }
    size_t start = ++j->i;
    size_t end = start;
    while (end < j->n && j->s[end] != '"') end += j->s[end] == '\\' ? 2 : 1;
    if (end > j->n) end = j->n;
    /* Decoding consumes exactly [start, end) when the string is well formed, and every escape
     * decodes to fewer bytes than it takes, so this always suffices. */
    unsigned char *o = malloc(end - start + 1);
    if (!o) return rt_fail_errno(j->err, ENOMEM, "cannot read safetensors file '%s'", j->f->label);
    size_t k = 0;
    for (;;) {
        if (j->i >= j->n) {
            free(o);
            return rt_json_fail(j, "unterminated string %s", context);
        }
        unsigned char c = j->s[j->i];
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20) {
            free(o);
            return rt_json_fail(j, "control character 0x%02x in a string %s (it must be escaped)", c, context);
        }
        if (c == '\\') {
            if (j->i + 1 >= j->n) {
                free(o);
                return rt_json_fail(j, "unterminated string %s", context);
            }
            unsigned char e = j->s[j->i + 1];
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char map[] = "\"\\/\b\f\n\r\t";
                o[k++] = (unsigned char)map[simple - "\"\\/bfnrt"];
                j->i += 2;
                continue;
            }
            if (e != 'u') {
                free(o);
                j->i++;
                return rt_json_fail(j, "invalid escape '\\%c' in a string %s", e >= 0x20 && e < 0x7F ? e : '?', context);
            }
            uint32_t cp;
            if (j->i + 6 > j->n || !rt_hex4(j->s + j->i + 2, &cp)) {
                free(o);
                return rt_json_fail(j, "invalid \\u escape in a string %s (four hex digits expected)", context);
            }
            size_t esc_at = j->i;
            j->i += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(o);
                j->i = esc_at;
                return rt_json_fail(j, "unpaired surrogate \\u%04x in a string %s", (unsigned)cp, context);
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (j->i + 6 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' || !rt_hex4(j->s + j->i + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF) {
                    free(o);
                    j->i = esc_at;
                    return rt_json_fail(j, "unpaired surrogate \\u%04x in a string %s", (unsigned)cp, context);
                }
                j->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) {
                free(o);
                j->i = esc_at;
                return rt_json_fail(j, "a string %s holds the NUL character (\\u0000), which mbt does not accept", context);
            }
            k += rt_utf8_put(o + k, cp); /* never longer than the 6 (or 12) escape bytes */
            continue;
        }
        int len = rt_utf8_len(j->s + j->i, j->n - j->i);
        if (!len) {
            free(o);
            return rt_json_fail(j, "invalid UTF-8 in a string %s", context);
        }
        memcpy(o + k, j->s + j->i, (size_t)len);
        k += (size_t)len;
        j->i += (size_t)len;
    }
    o[k] = 0;
    *out = (char *)o;
    return RT_OK;
}

#define RT_JSON_MAX_INT (UINT64_C(1) << 53) /* larger whole numbers are not exact in JSON readers */

static RtStatus rt_json_uint(RtJson *j, uint64_t *out, const char *context) {
    rt_json_ws(j);
    char b[16];
    if (j->i < j->n && j->s[j->i] == '-') return rt_json_fail(j, "negative number %s", context);
    if (j->i >= j->n || j->s[j->i] < '0' || j->s[j->i] > '9')
        return rt_json_fail(j, "expected a whole number %s, found %s", context, rt_json_found(j, b, sizeof b));
    if (j->s[j->i] == '0' && j->i + 1 < j->n && j->s[j->i + 1] >= '0' && j->s[j->i + 1] <= '9')
        return rt_json_fail(j, "number with a leading zero %s", context);
    uint64_t v = 0;
    size_t at = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        v = v * 10 + (uint64_t)(j->s[j->i] - '0');
        if (v > RT_JSON_MAX_INT) {
            j->i = at;
            return rt_json_fail(j, "number too large %s (the limit is 2^53)", context);
        }
        j->i++;
    }
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i = at;
        return rt_json_fail(j, "expected a whole number %s, found a fraction or exponent", context);
    }
    *out = v;
    return RT_OK;
}

/* ',' then more, or the closing bracket: returns 1 for more, 0 at the end, -1 on error. */
static int rt_json_more(RtJson *j, char close, const char *context) {
    rt_json_ws(j);
    if (j->i < j->n && j->s[j->i] == ',') {
        j->i++;
        return 1;
    }
    if (j->i < j->n && j->s[j->i] == (unsigned char)close) {
        j->i++;
        return 0;
    }
    char b[16];
    rt_json_fail(j, "expected ',' or '%c' %s, found %s", close, context, rt_json_found(j, b, sizeof b));
    return -1;
}

/* The opening bracket and whether the list is empty: 1 non-empty, 0 empty, -1 error. */
static int rt_json_open(RtJson *j, char open, char close, const char *context) {
    if (rt_json_expect(j, open, context) != RT_OK) return -1;
    rt_json_ws(j);
    if (j->i < j->n && j->s[j->i] == (unsigned char)close) {
        j->i++;
        return 0;
    }
    return 1;
}

static RtStatus rt_json_metadata(RtJson *j) {
    int more = rt_json_open(j, '{', '}', "to open __metadata__");
    while (more > 0) {
        char *key = NULL, *val = NULL;
        RtStatus st = rt_json_string(j, &key, "as a __metadata__ key");
        if (st != RT_OK) return st;
        char ctx[160];
        snprintf(ctx, sizeof ctx, "after the __metadata__ key \"%.100s\"", key);
        if ((st = rt_json_expect(j, ':', ctx)) != RT_OK) {
            free(key);
            return st;
        }
        rt_json_ws(j);
        if (j->i >= j->n || j->s[j->i] != '"') {
            char b[16];
            st = rt_json_fail(j, "the value of __metadata__ key \"%.100s\" must be a string, found %s", key,
                                       rt_json_found(j, b, sizeof b));
            free(key);
            return st;
        }
        if ((st = rt_json_string(j, &val, "as a __metadata__ value")) != RT_OK) {
            free(key);
            return st;
        }
        if (j->f->nmeta == j->f->mcap) {
            int64_t cap = j->f->mcap ? 2 * j->f->mcap : 8;
            char **k2 = realloc(j->f->mkey, (size_t)cap * sizeof *k2);
            if (k2) j->f->mkey = k2;
            char **v2 = k2 ? realloc(j->f->mval, (size_t)cap * sizeof *v2) : NULL;
            if (v2) j->f->mval = v2;
            if (!k2 || !v2) {
                free(key);
                free(val);
                return rt_fail_errno(j->err, ENOMEM, "cannot read safetensors file '%s'", j->f->label);
            }
            j->f->mcap = cap;
        }
        j->f->mkey[j->f->nmeta] = key;
        j->f->mval[j->f->nmeta] = val;
        j->f->nmeta++;
        more = rt_json_more(j, '}', "in __metadata__");
    }
    return more < 0 ? RT_ERR_FORMAT : RT_OK;
}

/* One tensor entry into t (name already set). */
static RtStatus rt_json_tensor(RtJson *j, RtStTensor *t) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "for tensor \"%.100s\"", t->name);
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    RtStatus st;
    int more = rt_json_open(j, '{', '}', ctx);
    if (more < 0) return RT_ERR_FORMAT;
    while (more > 0) {
        size_t key_at = j->i;
        char *key = NULL;
        if ((st = rt_json_string(j, &key, ctx)) != RT_OK) return st;
        int which = strcmp(key, "dtype") == 0 ? 0 : strcmp(key, "shape") == 0 ? 1 : strcmp(key, "data_offsets") == 0 ? 2 : -1;
        if (which < 0 || (which == 0 && have_dtype) || (which == 1 && have_shape) || (which == 2 && have_offsets)) {
            j->i = key_at;
            rt_json_ws(j);
            st = which < 0 ? rt_json_fail(j, "unknown key \"%.100s\" %s (expected dtype, shape, data_offsets)", key, ctx)
                           : rt_json_fail(j, "duplicate key \"%s\" %s", key, ctx);
            free(key);
            return st;
        }
        free(key);
        if ((st = rt_json_expect(j, ':', ctx)) != RT_OK) return st;
        if (which == 0) {
            rt_json_ws(j);
            size_t at = j->i;
            char *name = NULL;
            if ((st = rt_json_string(j, &name, ctx)) != RT_OK) return st;
            RtDtype dt;
            if (!rt_dtype_parse(name, &dt)) {
                j->i = at;
                int sub = strcmp(name, "F4") == 0 || strcmp(name, "F6_E2M3") == 0 || strcmp(name, "F6_E3M2") == 0;
                st = sub ? rt_json_fail(j, "dtype \"%s\" %s is not supported (its elements are smaller than a byte)", name, ctx)
                     : rt_json_fail(j, "unknown dtype \"%.40s\" %s", name, ctx);
                free(name);
                return st;
            }
            free(name);
            t->dtype = dt;
            have_dtype = 1;
        } else if (which == 1) {
            int m = rt_json_open(j, '[', ']', ctx);
            if (m < 0) return RT_ERR_FORMAT;
            t->rank = 0;
            while (m > 0) {
                if (t->rank == RT_ST_MAX_RANK) return rt_json_fail(j, "shape %s has more than %d dimensions", ctx, RT_ST_MAX_RANK);
                uint64_t v;
                if ((st = rt_json_uint(j, &v, ctx)) != RT_OK) return st;
                t->shape[t->rank++] = (int64_t)v;
                m = rt_json_more(j, ']', ctx);
                if (m < 0) return RT_ERR_FORMAT;
            }
            have_shape = 1;
        } else {
            uint64_t v[2];
            int m = rt_json_open(j, '[', ']', ctx);
            if (m < 0) return RT_ERR_FORMAT;
            if (m == 0) return rt_json_fail(j, "data_offsets %s must hold two numbers, not none", ctx);
            if ((st = rt_json_uint(j, &v[0], ctx)) != RT_OK) return st;
            m = rt_json_more(j, ']', ctx);
            if (m < 0) return RT_ERR_FORMAT;
            if (m == 0) return rt_json_fail(j, "data_offsets %s must hold two numbers, not one", ctx);
            if ((st = rt_json_uint(j, &v[1], ctx)) != RT_OK) return st;
            rt_json_ws(j);
            if (j->i < j->n && j->s[j->i] == ',') return rt_json_fail(j, "data_offsets %s must hold two numbers, not more", ctx);
            if ((st = rt_json_expect(j, ']', ctx)) != RT_OK) return st;
            t->begin = v[0];
            t->end = v[1];
            have_offsets = 1;
        }
        more = rt_json_more(j, '}', ctx);
    }
    if (more < 0) return RT_ERR_FORMAT;
    if (!have_dtype || !have_shape || !have_offsets) {
        j->i--; /* at the closing brace */
        return rt_json_fail(j, "tensor \"%.100s\" has no %s", t->name,
                            !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    }
    return RT_OK;
}

static RtStatus rt_json_header(RtJson *j) {
    if (j->n == 0 || j->s[0] != '{') {
        char b[16];
        return rt_json_fail(j, "the header must start with '{', found %s", rt_json_found(j, b, sizeof b));
    }
    int seen_meta = 0;
    int more = rt_json_open(j, '{', '}', "to open the header");
    while (more > 0) {
        rt_json_ws(j);
        size_t key_at = j->i;
        char *name = NULL;
        RtStatus st = rt_json_string(j, &name, "as a tensor name");
        if (st != RT_OK) return st;
        char ctx[160];
        snprintf(ctx, sizeof ctx, "after the name \"%.100s\"", name);
        if ((st = rt_json_expect(j, ':', ctx)) != RT_OK) {
            free(name);
            return st;
        }
        if (strcmp(name, "__metadata__") == 0) {
            free(name);
            if (seen_meta) {
                j->i = key_at;
                return rt_json_fail(j, "duplicate key \"__metadata__\"");
            }
            seen_meta = 1;
            if ((st = rt_json_metadata(j)) != RT_OK) return st;
        } else {
            RtStFile *f = j->f;
            if (f->nt == f->tcap) {
                int64_t cap = f->tcap ? 2 * f->tcap : 16;
                RtStTensor *t2 = realloc(f->t, (size_t)cap * sizeof *t2);
                if (!t2) {
                    free(name);
                    return rt_fail_errno(j->err, ENOMEM, "cannot read safetensors file '%s'", f->label);
                }
                f->t = t2;
                f->tcap = cap;
            }
            RtStTensor *t = &f->t[f->nt++];
            memset(t, 0, sizeof *t);
            t->name = name;
            if ((st = rt_json_tensor(j, t)) != RT_OK) return st;
        }
        more = rt_json_more(j, '}', "in the header object");
    }
    if (more < 0) return RT_ERR_FORMAT;
    rt_json_ws(j);
    if (j->i < j->n) {
        char b[16];
        return rt_json_fail(j, "unexpected %s after the header object (only space padding may follow it)",
                            rt_json_found(j, b, sizeof b));
    }
    return RT_OK;
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

static int rt_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
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
                           "safetensors file '%s': tensor '%s' has data_offsets [%llu, %llu] outside the data (%llu bytes)",
                           L, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)data_size);
        if (t->end - t->begin != bytes) {
            char sh[256];
            return rt_st_fail(err, RT_ERR_FORMAT,
                           "safetensors file '%s': tensor '%s' is %s %s (%llu bytes) but its data_offsets [%llu, %llu] "
                           "span %llu bytes",
                           L, t->name, rt_dtype_name(t->dtype), rt_shape_str(t, sh, sizeof sh), (unsigned long long)bytes,
                           (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)(t->end - t->begin));
        }
    }
    /* Names: sorted copies find duplicates (and serve rt_st_find). */
    f->by_name = malloc((size_t)(f->nt ? f->nt : 1) * sizeof *f->by_name);
    if (!f->by_name) return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", L);
    for (int64_t i = 0; i < f->nt; i++) f->by_name[i] = &f->t[i];
    qsort(f->by_name, (size_t)f->nt, sizeof *f->by_name, rt_cmp_tensor_names);
    for (int64_t i = 1; i < f->nt; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': duplicate tensor name '%s'", L, f->by_name[i]->name);
    if (f->nmeta > 1) {
        char **keys = malloc((size_t)f->nmeta * sizeof *keys);
        if (!keys) return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", L);
        memcpy(keys, f->mkey, (size_t)f->nmeta * sizeof *keys);
        qsort(keys, (size_t)f->nmeta, sizeof *keys, rt_cmp_str);
        for (int64_t i = 1; i < f->nmeta; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0) {
                RtStatus st = rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': duplicate __metadata__ key '%s'", L, keys[i]);
                free(keys);
                return st;
            }
        free(keys);
    }
    /* Offsets: in order they must tile the data exactly (the format forbids holes). */
    if (f->nt > 1) {
        qsort(f->t, (size_t)f->nt, sizeof *f->t, rt_cmp_offsets);
        for (int64_t i = 0; i < f->nt; i++) f->by_name[i] = &f->t[i]; /* re-point after the move */
        qsort(f->by_name, (size_t)f->nt, sizeof *f->by_name, rt_cmp_tensor_names);
    }
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
        return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': header length %llu is beyond the end of the file (%zu bytes)",
                       L, (unsigned long long)n, f->size);
    RtJson j = {f->bytes + 8, (size_t)n, 0, f, err};
    RtStatus st = rt_json_header(&j);
    if (st != RT_OK) return st;
    const unsigned char *data = f->bytes + 8 + n;
    st = rt_st_validate(f, (uint64_t)(f->size - 8 - n), err);
    if (st != RT_OK) return st;
    for (int64_t i = 0; i < f->nt; i++) f->t[i].data = data + f->t[i].begin;
    return RT_OK;
}

static RtStatus rt_st_new(RtStFile **out, const char *label, RtError *err) {
    *out = calloc(1, sizeof **out);
    if (*out) (*out)->label = strdup(label);
    if (!*out || !(*out)->label) {
        free(*out);
        *out = NULL;
        return rt_fail_errno(err, ENOMEM, "cannot read safetensors file '%s'", label);
    }
    return RT_OK;
}

RtStatus rt_st_open(RtStFile **out, const char *path, RtError *err) {
    RtStFile *f;
    RtStatus st = rt_st_new(&f, path, err);
    if (st != RT_OK) {
        *out = NULL;
        return st;
    }
    st = rt_map_file(&f->map, path, "safetensors file", err);
    if (st == RT_OK) {
        f->bytes = f->map.data;
        f->size = f->map.size;
        st = rt_st_parse(f, err);
    }
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

const RtStTensor *rt_st_tensor(const RtStFile *f, int64_t i) {
    return i >= 0 && i < f->nt ? &f->t[i] : NULL;
}

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
    if (n > 0 && !dst) return rt_st_fail(err, RT_ERR_ARG, "safetensors file '%s': no buffer to read '%s' into", f->label, t->name);
    return RT_OK;
}

static uint16_t rt_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rt_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rt_le64(const unsigned char *p) { return (uint64_t)rt_le32(p) | (uint64_t)rt_le32(p + 4) << 32; }

RtStatus rt_st_read_f32(const RtStFile *f, const RtStTensor *t, float *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case RT_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = rt_bits_f32(rt_le32(p + 4 * i));
        return RT_OK;
    case RT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = rt_f16_to_f32(rt_le16(p + 2 * i));
        return RT_OK;
    case RT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = rt_bf16_to_f32(rt_le16(p + 2 * i));
        return RT_OK;
    case RT_F64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = rt_le64(p + 8 * i);
            double d;
            memcpy(&d, &u, 8);
            dst[i] = (float)d;
        }
        return RT_OK;
    default:
        return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' is %s, which cannot be read as f32 (F32, F16, "
                       "BF16 or F64 expected)", f->label, t->name, rt_dtype_name(t->dtype));
    }
}

RtStatus rt_st_read_i64(const RtStFile *f, const RtStTensor *t, int64_t *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    const unsigned char *p = t->data;
    if (t->dtype == RT_I64) {
        for (int64_t i = 0; i < n; i++) dst[i] = (int64_t)rt_le64(p + 8 * i);
        return RT_OK;
    }
    if (t->dtype == RT_I32) {
        for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)rt_le32(p + 4 * i);
        return RT_OK;
    }
    return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' is %s, which cannot be read as i64 (I32 or I64 expected)",
                   f->label, t->name, rt_dtype_name(t->dtype));
}

RtStatus rt_st_read_i32(const RtStFile *f, const RtStTensor *t, int32_t *dst, int64_t n, RtError *err) {
    RtStatus st = rt_st_read_check(f, t, dst, n, err);
    if (st != RT_OK) return st;
    const unsigned char *p = t->data;
    if (t->dtype == RT_I32) {
        for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)rt_le32(p + 4 * i);
        return RT_OK;
    }
    if (t->dtype == RT_I64) {
        for (int64_t i = 0; i < n; i++) {
            int64_t v = (int64_t)rt_le64(p + 8 * i);
            if (v < INT32_MIN || v > INT32_MAX)
                return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': element %lld of I64 tensor '%s' (%lld) does not fit int32",
                               f->label, (long long)i, t->name, (long long)v);
            dst[i] = (int32_t)v;
        }
        return RT_OK;
    }
    return rt_st_fail(err, RT_ERR_FORMAT, "safetensors file '%s': tensor '%s' is %s, which cannot be read as i32 (I32 or I64 expected)",
                   f->label, t->name, rt_dtype_name(t->dtype));
}

/* ---- writing ------------------------------------------------------------------------------------ */

typedef struct RtSb {
    char *p;
    size_t n, cap;
    int oom;
} RtSb;

static void rt_sb_put(RtSb *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void rt_sb_str(RtSb *b, const char *s) { rt_sb_put(b, s, strlen(s)); }

static void rt_sb_u64(RtSb *b, uint64_t v) {
    char tmp[24];
    int k = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    rt_sb_put(b, tmp, (size_t)k);
}

/* A JSON string as serde_json writes it: '"' and '\\' escaped, control characters as \b \f \n
 * \r \t or \u00xx, everything else (UTF-8 included) as is. */
static void rt_sb_json(RtSb *b, const char *s) {
    rt_sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': rt_sb_put(b, "\\\"", 2); break;
        case '\\': rt_sb_put(b, "\\\\", 2); break;
        case '\b': rt_sb_put(b, "\\b", 2); break;
        case '\f': rt_sb_put(b, "\\f", 2); break;
        case '\n': rt_sb_put(b, "\\n", 2); break;
        case '\r': rt_sb_put(b, "\\r", 2); break;
        case '\t': rt_sb_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                rt_sb_put(b, esc, 6);
            } else {
                rt_sb_put(b, (const char *)p, 1);
            }
        }
    }
    rt_sb_put(b, "\"", 1);
}

static int rt_valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        int len = rt_utf8_len(p + i, n - i);
        if (!len) return 0;
        i += (size_t)len;
    }
    return 1;
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

RtStatus rt_st_write(const char *path, const RtStEntry *t, int64_t n, const RtStMeta *meta, int64_t nmeta, RtError *err) {
    if (n < 0 || nmeta < 0 || (n > 0 && !t) || (nmeta > 0 && !meta))
        return rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': bad tensor or metadata list", path);
    uint64_t *numel = calloc((size_t)(n ? n : 1), sizeof *numel);
    const RtStEntry **order = calloc((size_t)(n ? n : 1), sizeof *order);
    const RtStEntry **byname = calloc((size_t)(n ? n : 1), sizeof *byname);
    RtSb hb = {0};
    RtStatus st = RT_OK;
    if (!numel || !order || !byname) {
        st = rt_fail_errno(err, ENOMEM, "cannot write safetensors file '%s'", path);
        goto done;
    }
    /* Check everything before the file is touched. */
    for (int64_t i = 0; i < n && st == RT_OK; i++) {
        const RtStEntry *e = &t[i];
        if (!e->name || !*e->name || strcmp(e->name, "__metadata__") == 0 || !rt_valid_utf8(e->name)) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor %lld has an invalid name%s%s%s", path,
                         (long long)i, e->name ? " '" : "", e->name ? e->name : "", e->name ? "'" : "");
            break;
        }
        if ((unsigned)e->dtype >= RT_DTYPE_COUNT || e->rank < 0 || e->rank > RT_ST_MAX_RANK || (e->rank > 0 && !e->shape)) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' has a bad dtype or shape", path, e->name);
            break;
        }
        if (e->from_f32 && e->dtype != RT_F32 && e->dtype != RT_F16 && e->dtype != RT_BF16) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' cannot be converted from f32 to %s", path,
                         e->name, rt_dtype_name(e->dtype));
            break;
        }
        uint64_t c = 1;
        for (int d = 0; d < e->rank; d++) {
            if (e->shape[d] < 0 || (e->shape[d] > 0 && c > (UINT64_C(1) << 56) / (uint64_t)e->shape[d])) {
                st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': tensor '%s' has a bad shape", path, e->name);
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
        if (!meta[i].key || !meta[i].value || !rt_valid_utf8(meta[i].key) || !rt_valid_utf8(meta[i].value))
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': __metadata__ entry %lld is not a pair of UTF-8 strings",
                         path, (long long)i);
    for (int64_t i = 0; i < nmeta && st == RT_OK; i++)
        for (int64_t k = 0; k < i && st == RT_OK; k++)
            if (strcmp(meta[i].key, meta[k].key) == 0)
                st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': duplicate __metadata__ key '%s'", path, meta[i].key);
    if (st != RT_OK) goto done;
    /* Names are unique (checked on a name-sorted copy: the layout order groups by dtype). */
    memcpy(byname, order, (size_t)n * sizeof *byname);
    qsort(byname, (size_t)n, sizeof *byname, rt_cmp_entry_names);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
            st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': duplicate tensor name '%s'", path, byname[i]->name);
            goto done;
        }
    qsort(order, (size_t)n, sizeof *order, rt_cmp_layout);
    /* The header. */
    rt_sb_str(&hb, "{");
    if (nmeta > 0) {
        rt_sb_str(&hb, "\"__metadata__\":{");
        for (int64_t i = 0; i < nmeta; i++) {
            if (i) rt_sb_str(&hb, ",");
            rt_sb_json(&hb, meta[i].key);
            rt_sb_str(&hb, ":");
            rt_sb_json(&hb, meta[i].value);
        }
        rt_sb_str(&hb, "}");
        if (n > 0) rt_sb_str(&hb, ",");
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const RtStEntry *e = order[i];
        uint64_t bytes = numel[e - t] * (uint64_t)rt_dtype_size(e->dtype);
        if (i) rt_sb_str(&hb, ",");
        rt_sb_json(&hb, e->name);
        rt_sb_str(&hb, ":{\"dtype\":\"");
        rt_sb_str(&hb, rt_dtype_name(e->dtype));
        rt_sb_str(&hb, "\",\"shape\":[");
        for (int d = 0; d < e->rank; d++) {
            if (d) rt_sb_str(&hb, ",");
            rt_sb_u64(&hb, (uint64_t)e->shape[d]);
        }
        rt_sb_str(&hb, "],\"data_offsets\":[");
        rt_sb_u64(&hb, off);
        rt_sb_str(&hb, ",");
        rt_sb_u64(&hb, off + bytes);
        rt_sb_str(&hb, "]}");
        off += bytes;
    }
    rt_sb_str(&hb, "}");
    while (hb.n % 8) rt_sb_str(&hb, " ");
    if (hb.oom) {
        st = rt_fail_errno(err, ENOMEM, "cannot write safetensors file '%s'", path);
        goto done;
    }
    if (hb.n > RT_ST_MAX_HEADER) {
        st = rt_st_fail(err, RT_ERR_ARG, "cannot write safetensors file '%s': the header would be %zu bytes, over the limit", path, hb.n);
        goto done;
    }
    RtAtomicFile af;
    st = rt_atomic_begin(&af, path, "safetensors file", err);
    if (st != RT_OK) goto done;
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hb.n >> (8 * k));
    st = rt_atomic_write(&af, len8, 8, err);
    if (st == RT_OK) st = rt_atomic_write(&af, hb.p, hb.n, err);
    for (int64_t i = 0; i < n && st == RT_OK; i++) st = rt_st_write_data(&af, order[i], numel[order[i] - t], err);
    if (st == RT_OK) st = rt_atomic_commit(&af, err);
    else rt_atomic_abort(&af);
done:
    free(hb.p);
    free(numel);
    free(order);
    free(byname);
    return st;
}
