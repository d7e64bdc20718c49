/* json.c - the runtime's one JSON reader and one JSON writer, over Debian's jansson (see rt.h;
 * docs/runtime.md, "JSON").
 *
 * Pipeline position: under everything in the runtime that reads or writes JSON: the safetensors
 * header (safetensors.c), a checkpoint's state.json (checkpoint.c), the --log JSON lines (log.c)
 * and the MBT_TRACE Chrome trace (gpu_timing.c). Documents are jansson's json_t; this file adds
 * what jansson leaves to its caller:
 *
 * - Reading is strict RFC 8259 (jansson's decoder: invalid UTF-8, unpaired surrogates, \u0000
 *   and nesting past 2048 are refused) and also refuses a key repeated in one object. A failure
 *   is an RT_ERR_FORMAT "WHAT at byte N: reason", N counted in the caller's file, with the bytes
 *   jansson quotes from the input written as escapes, so the message stays one printable line.
 * - jansson's integers are int64: a u64 above INT64_MAX is written as a string of its decimal
 *   digits (rt_json_new_u64) and read back from either form (rt_json_u64), so it round-trips.
 * - JSON has no NaN or infinity: rt_json_new_f64 writes them as null.
 * - Text is jansson's, with \u escapes in lower case as serde_json (the safetensors reference)
 *   and Python write them, so a safetensors header is byte-identical to the reference's. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* ---- reading ------------------------------------------------------------------------------------ */

RtStatus rt_json_parse(json_t **out, const void *text, size_t n, size_t at, const char *what, RtError *err) {
    json_error_t je;
    *out = json_loadb(n ? text : "", n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je); /* an empty mapping is NULL */
    if (*out) return RT_OK;
    if (json_error_code(&je) == json_error_out_of_memory) return rt_fail_errno(err, ENOMEM, "cannot read %s", what);
    char reason[4 * sizeof je.text];
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)je.text; *p; p++) {
        if (*p >= 0x20 && *p < 0x7F) reason[k++] = (char)*p;
        else k += (size_t)snprintf(reason + k, sizeof reason - k, "\\x%02x", *p);
    }
    reason[k] = 0;
    return rt_fail(err, RT_ERR_FORMAT, "%s at byte %zu: %s", what, at + (size_t)(je.position > 0 ? je.position : 0), reason);
}

const json_t *rt_json_get(const json_t *obj, const char *key) { return json_is_object(obj) ? json_object_get(obj, key) : NULL; }

int rt_json_i64(const json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

int rt_json_u64(const json_t *v, uint64_t *out) {
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0) return 0;
        *out = (uint64_t)json_integer_value(v);
        return 1;
    }
    const char *s = json_string_value(v);
    if (!s || !*s || strspn(s, "0123456789") != strlen(s) || (s[0] == '0' && s[1])) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = x;
    return 1;
}

int rt_json_f64(const json_t *v, double *out) {
    if (!json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

const char *rt_json_str(const json_t *v) { return json_string_value(v); }

/* ---- writing ------------------------------------------------------------------------------------ */

json_t *rt_json_new_u64(uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) return json_integer((json_int_t)v);
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    return json_string(digits);
}

json_t *rt_json_new_f64(double v) { return isfinite(v) ? json_real(v) : json_null(); }

int rt_json_valid_utf8(const char *s, int *nomem) {
    errno = 0;
    json_t *t = json_string(s);
    *nomem = !t && errno == ENOMEM;
    json_decref(t);
    return t != NULL;
}

/* jansson writes "\u001F"; serde_json and Python write "\u001f". The text is valid JSON written
 * by jansson, so a backslash inside a string always starts an escape. */
static void rt_json_lower_escapes(char *s) {
    int in_string = 0;
    for (char *p = s; *p; p++) {
        if (*p == '"') in_string = !in_string;
        else if (in_string && *p == '\\') {
            p++;
            if (*p == 'u')
                for (int k = 1; k <= 4 && p[k]; k++) p[k] = (char)tolower((unsigned char)p[k]);
        }
    }
}

char *rt_json_text(const json_t *v, size_t flags, size_t *len) {
    char *s = v ? json_dumps(v, flags | JSON_ENCODE_ANY) : NULL;
    if (!s) return NULL;
    rt_json_lower_escapes(s);
    if (len) *len = strlen(s);
    return s;
}
