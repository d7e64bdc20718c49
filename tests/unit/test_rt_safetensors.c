/* test_rt_safetensors.c - unit tests of runtime/safetensors.c: bytes identical to the reference
 * serializer's, round trips of every supported dtype, f16/bf16 conversions, one case per kind of
 * bad file with the exact error text, a no-crash sweep over truncated and corrupted files, and
 * atomic writes that leave the previous file untouched when they fail.
 *
 * Build: make build/tests/test_rt_safetensors (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case (and `SKIP name: why` for a case that cannot run here, never counted
 * as passed), then `N passed, M failed`; exits 1 on a failure. */
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "rt.h"
#include "unit.h"
#include "scratch.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static void dir_make(void) { dir_make_tagged("st"); }

/* The whole file, malloc'd. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *p = NULL;
    size_t cap = 0;
    *n = 0;
    for (;;) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 4096;
            p = realloc(p, cap);
        }
        size_t k = fread(p + *n, 1, cap - *n, f);
        if (k == 0) break;
        *n += k;
    }
    fclose(f);
    return p;
}

static void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && (n == 0 || fwrite(p, 1, n, f) == n) && fclose(f) == 0, "writing %s", path);
}

/* Expected file bytes: length, header text, then data. */
static unsigned char *expect_bytes(const char *header, const void *data, size_t data_len, size_t *n) {
    size_t h = strlen(header);
    *n = 8 + h + data_len;
    unsigned char *p = malloc(*n);
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)((uint64_t)h >> (8 * k));
    memcpy(p + 8, header, h);
    if (data_len) memcpy(p + 8 + h, data, data_len);
    return p;
}

static void check_file_is(const char *path, const unsigned char *want, size_t n, const char *what) {
    size_t got_n = 0;
    unsigned char *got = slurp(path, &got_n);
    CHECK(got && got_n == n && memcmp(got, want, n) == 0, "%s: file bytes differ (%zu bytes, expected %zu)", what, got_n, n);
    free(got);
}

/* Leftover temporary files in dir. */
static int leftovers(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* ---- the reference's own outputs ---------------------------------------------------------------- */

/* Expected bytes from the reference implementation's tests (huggingface/safetensors,
 * safetensors/src/tensor.rs at commit 24b0b2857fef49be734b9ab72ce97c09bb25f5b9: test_serialization,
 * test_serialization_forced_alignement, test_empty), written here as the header text they encode. */
static void reference_bytes(void) {
    dir_make();
    float six[6] = {0, 1, 2, 3, 4, 5};
    RtError e;
    size_t n;
    unsigned char *want;

    int64_t s1[3] = {1, 2, 3};
    RtStEntry t1 = {"attn.0", RT_F32, 3, s1, six, 0};
    CHECK(rt_st_write(at("a.st"), &t1, 1, NULL, 0, &e) == RT_OK, "%s", e.msg);
    want = expect_bytes("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", six, 24, &n);
    check_file_is(at("a.st"), want, n, "test_serialization");
    free(want);

    int64_t s2[4] = {1, 1, 2, 3};
    RtStEntry t2 = {"attn0", RT_F32, 4, s2, six, 1}; /* from f32: the same bytes */
    CHECK(rt_st_write(at("b.st"), &t2, 1, NULL, 0, &e) == RT_OK, "%s", e.msg);
    want = expect_bytes("{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ", six, 24, &n);
    check_file_is(at("b.st"), want, n, "test_serialization_forced_alignement");
    free(want);

    CHECK(rt_st_write(at("c.st"), NULL, 0, NULL, 0, &e) == RT_OK, "%s", e.msg);
    want = expect_bytes("{}      ", NULL, 0, &n);
    check_file_is(at("c.st"), want, n, "test_empty");
    free(want);

    RtStMeta m = {"framework", "pt"};
    CHECK(rt_st_write(at("d.st"), NULL, 0, &m, 1, &e) == RT_OK, "%s", e.msg);
    want = expect_bytes("{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0, &n);
    check_file_is(at("d.st"), want, n, "test_empty with metadata");
    free(want);

    /* And each reads back. */
    const char *names[4] = {"a.st", "b.st", "c.st", "d.st"};
    for (int i = 0; i < 4; i++) {
        RtStFile *f = NULL;
        CHECK(rt_st_open(&f, at(names[i]), &e) == RT_OK, "%s: %s", names[i], e.msg);
        rt_st_close(f);
    }
    dir_remove();
}

/* ---- round trips -------------------------------------------------------------------------------- */

static void round_trip(void) {
    dir_make();
    float f32[6] = {1.5f, -2.25f, 3.0e-38f, INFINITY, -0.0f, 65504.0f};
    uint16_t f16[5];
    float f16_src[5] = {1.0f, -0.5f, 0.0999755859375f, 6.0e-8f, 65504.0f};
    for (int i = 0; i < 5; i++) f16[i] = rt_f32_to_f16(f16_src[i]);
    float bf_src[6] = {1.0f, 3.14159265f, -1e30f, 1e-30f, 0.0f, 2.5f};
    int32_t i32[4] = {0, -1, INT32_MAX, INT32_MIN};
    int64_t i64[4] = {INT64_MIN, -7, 1LL << 40, INT64_MAX};
    uint8_t u8[3] = {1, 2, 255};
    float scalar = 42.0f;
    int64_t sh_f32[2] = {2, 3}, sh_f16[1] = {5}, sh_bf[3] = {3, 1, 2}, sh_i32[1] = {4}, sh_i64[2] = {2, 2}, sh_u8[1] = {3},
            sh_empty[2] = {0, 3};
    RtStEntry t[] = {
        {"h.0.attn.c_attn.weight", RT_F32, 2, sh_f32, f32, 0},
        {"half", RT_F16, 1, sh_f16, f16, 0},
        {"brain", RT_BF16, 3, sh_bf, bf_src, 1},
        {"ints", RT_I32, 1, sh_i32, i32, 0},
        {"longs", RT_I64, 2, sh_i64, i64, 0},
        {"bytes", RT_U8, 1, sh_u8, u8, 0},
        {"scalar", RT_F32, 0, NULL, &scalar, 0},
        {"empty", RT_F32, 2, sh_empty, NULL, 0},
        {"unicode \xc3\xa9 \"quoted\" \\ tab\t", RT_F32, 0, NULL, &scalar, 0},
    };
    int nt = (int)(sizeof t / sizeof t[0]);
    RtStMeta meta[2] = {{"format", "pt"}, {"note", "\xc3\xbcnicode \"q\"\n"}};
    RtError e;
    CHECK(rt_st_write(at("m.st"), t, nt, meta, 2, &e) == RT_OK, "write: %s", e.msg);
    RtStFile *f = NULL;
    CHECK(rt_st_open(&f, at("m.st"), &e) == RT_OK, "open: %s", e.msg);
    if (!f) {
        dir_remove();
        return;
    }
    CHECK(rt_st_count(f) == nt, "%lld tensors", (long long)rt_st_count(f));
    CHECK(rt_st_meta_count(f) == 2, "metadata count");
    CHECK_STR(rt_st_meta_get(f, "note"), "\xc3\xbcnicode \"q\"\n", "metadata value");
    CHECK_STR(rt_st_meta_key(f, 0), "format", "metadata order");
    /* Layout: descending dtype (I64, F32..., I32, BF16, F16, U8), names ascending within one. */
    const char *order[] = {
        "longs", "empty", "h.0.attn.c_attn.weight", "scalar", "unicode \xc3\xa9 \"quoted\" \\ tab\t", "ints", "brain",
        "half",  "bytes"};
    for (int i = 0; i < nt; i++) {
        const RtStTensor *x = rt_st_tensor(f, i);
        CHECK(x && strcmp(x->name, order[i]) == 0, "tensor %d is '%s', expected '%s'", i, x ? x->name : "?", order[i]);
        /* the header is padded to 8 bytes and the layout descends in element size: aligned */
        if (x) CHECK((x->begin % (uint64_t)rt_dtype_size(x->dtype)) == 0, "'%s' is not aligned", x->name);
    }
    const RtStTensor *x = rt_st_find(f, "h.0.attn.c_attn.weight");
    float out[6];
    CHECK(x && x->dtype == RT_F32 && x->rank == 2 && x->shape[0] == 2 && x->shape[1] == 3 && x->numel == 6, "f32 info");
    CHECK(x && rt_st_read_f32(f, x, out, 6, &e) == RT_OK && memcmp(out, f32, sizeof out) == 0, "f32 values");
    x = rt_st_find(f, "half");
    CHECK(x && rt_st_read_f32(f, x, out, 5, &e) == RT_OK, "f16 read: %s", e.msg);
    for (int i = 0; x && i < 5; i++) CHECK(out[i] == rt_f16_to_f32(f16[i]), "f16 element %d: %g", i, (double)out[i]);
    CHECK(out[0] == 1.0f && out[1] == -0.5f && out[4] == 65504.0f, "f16 exact values");
    x = rt_st_find(f, "brain");
    CHECK(x && x->rank == 3 && x->shape[1] == 1 && rt_st_read_f32(f, x, out, 6, &e) == RT_OK, "bf16 read");
    for (int i = 0; x && i < 6; i++)
        CHECK(out[i] == rt_bf16_to_f32(rt_f32_to_bf16(bf_src[i])), "bf16 element %d: %g", i, (double)out[i]);
    CHECK(out[0] == 1.0f && out[5] == 2.5f && out[1] == 3.140625f, "bf16 values %g %g %g", (double)out[0], (double)out[1],
          (double)out[5]);
    int32_t oi[4];
    int64_t ol[4];
    x = rt_st_find(f, "ints");
    CHECK(x && rt_st_read_i32(f, x, oi, 4, &e) == RT_OK && memcmp(oi, i32, sizeof oi) == 0, "i32 values");
    CHECK(x && rt_st_read_i64(f, x, ol, 4, &e) == RT_OK && ol[1] == -1 && ol[3] == INT32_MIN, "i32 as i64");
    x = rt_st_find(f, "longs");
    CHECK(x && rt_st_read_i64(f, x, ol, 4, &e) == RT_OK && memcmp(ol, i64, sizeof ol) == 0, "i64 values");
    CHECK(x && rt_st_read_i32(f, x, oi, 4, &e) == RT_ERR_FORMAT, "an I64 beyond int32 read as i32");
    char want[700];
    snprintf(want, sizeof want, "safetensors file '%s': element 0 of I64 tensor 'longs' (%lld) does not fit int32", at("m.st"),
             (long long)INT64_MIN);
    CHECK_STR(e.msg, want, "message");
    x = rt_st_find(f, "scalar");
    CHECK(x && x->rank == 0 && x->numel == 1 && rt_st_read_f32(f, x, out, 1, &e) == RT_OK && out[0] == 42.0f, "scalar");
    x = rt_st_find(f, "empty");
    CHECK(x && x->numel == 0 && x->begin == x->end && rt_st_read_f32(f, x, NULL, 0, &e) == RT_OK, "empty tensor");
    x = rt_st_find(f, "unicode \xc3\xa9 \"quoted\" \\ tab\t");
    CHECK(x != NULL, "a name with escapes and UTF-8 was not found");
    x = rt_st_find(f, "bytes");
    unsigned char raw[3] = {0};
    CHECK(x && x->dtype == RT_U8 && x->data == NULL && rt_st_read_raw(f, x, raw, 3, &e) == RT_OK && raw[2] == 255,
          "u8 raw bytes");
    CHECK(x && rt_st_read_f32(f, x, out, 3, &e) == RT_ERR_FORMAT, "u8 read as f32");
    snprintf(want, sizeof want,
             "safetensors file '%s': tensor 'bytes' is U8, which cannot be read as f32 (F32, F16, BF16 or F64 expected)",
             at("m.st"));
    CHECK_STR(e.msg, want, "message");
    x = rt_st_find(f, "ints");
    CHECK(x && rt_st_read_i32(f, x, oi, 3, &e) == RT_ERR_ARG, "wrong element count accepted");
    snprintf(want, sizeof want, "safetensors file '%s': tensor 'ints' has 4 elements, not the 3 asked for", at("m.st"));
    CHECK_STR(e.msg, want, "message");
    CHECK(rt_st_find(f, "nope") == NULL && rt_st_find(f, "") == NULL, "found a tensor that does not exist");
    rt_st_close(f);
    dir_remove();
}

/* ---- conversions -------------------------------------------------------------------------------- */

static void conversions(void) {
    /* Every bf16 and f16 value survives a round trip through f32 (NaNs stay NaN). */
    for (uint32_t h = 0; h < 65536; h++) {
        float b = rt_bf16_to_f32((uint16_t)h);
        if (isnan(b)) CHECK(isnan(rt_bf16_to_f32(rt_f32_to_bf16(b))), "bf16 NaN %04x", h);
        else CHECK(rt_f32_to_bf16(b) == h, "bf16 %04x -> %g -> %04x", h, (double)b, rt_f32_to_bf16(b));
        float f = rt_f16_to_f32((uint16_t)h);
        if (isnan(f)) CHECK(isnan(rt_f16_to_f32(rt_f32_to_f16(f))), "f16 NaN %04x", h);
        else CHECK(rt_f32_to_f16(f) == h, "f16 %04x -> %g -> %04x", h, (double)f, rt_f32_to_f16(f));
        if (h % 8192 == 0 && unit_case_failures) break;
    }
    /* Round to nearest, ties to even. */
    CHECK(rt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3F80, "bf16 tie down to even");
    CHECK(rt_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82, "bf16 tie up to even");
    CHECK(rt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81, "bf16 above the tie rounds up");
    CHECK(rt_f32_to_bf16(3.4e38f) == 0x7F80, "bf16 overflow to inf");
    CHECK(rt_f32_to_f16(1.0f + 0x1p-11f) == 0x3C00, "f16 tie down to even");
    CHECK(rt_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02, "f16 tie up to even");
    CHECK(rt_f32_to_f16(65519.0f) == 0x7BFF, "f16 65519 -> max");
    CHECK(rt_f32_to_f16(65520.0f) == 0x7C00, "f16 65520 -> inf");
    CHECK(rt_f32_to_f16(-1e10f) == 0xFC00, "f16 -inf");
    CHECK(rt_f32_to_f16(0x1p-24f) == 0x0001, "f16 smallest subnormal");
    CHECK(rt_f32_to_f16(0x1p-25f) == 0x0000, "f16 2^-25 ties to zero");
    CHECK(rt_f32_to_f16(3 * 0x1p-25f) == 0x0002, "f16 3*2^-25 ties to even");
    CHECK(rt_f32_to_f16(0x1p-14f) == 0x0400, "f16 smallest normal");
    CHECK(rt_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400, "f16 rounds up into the normals");
    CHECK(rt_f32_to_f16(-0.0f) == 0x8000, "f16 -0");
    CHECK(isnan(rt_f16_to_f32(rt_f32_to_f16(NAN))), "f16 NaN");
    CHECK(rt_f16_to_f32(0x3555) == 0x1.554p-2f, "f16 0x3555");
}

/* ---- bad files ---------------------------------------------------------------------------------- */

#define F32A "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

typedef struct Bad {
    const char *name;
    const char *header;
    long long len;   /* the length field, or -1 for the header's length */
    size_t data;     /* data bytes after the header */
    const char *msg; /* the message after "safetensors file 'PATH': ": a syntax error at its byte in the file (the
                         * JSON reader's words), a schema error naming the tensor or key */
} Bad;

static const Bad bads[] = {
    {"header_beyond_file", "{}", 1000, 20, "header length 1000 is beyond the end of the file (30 bytes)"},
    {"header_too_large", "{}", 1LL << 40, 0, "header length 1099511627776 exceeds the limit of 100000000 bytes"},
    {"not_an_object", "[]", -1, 0, "malformed header at byte 8: the header must start with '{', found '['"},
    {"leading_space", " {}", -1, 0, "malformed header at byte 8: the header must start with '{', found ' '"},
    {"empty_header", "", -1, 0, "malformed header at byte 8: the header must start with '{', found the end of the header"},
    {"unclosed_object", "{\"a\":" F32A, -1, 4, "malformed header at byte 61: '}' expected near end of file"},
    {"missing_colon", "{\"a\" " F32A "}", -1, 4, "malformed header at byte 14: ':' expected near '{'"},
    {"unterminated_string", "{\"abc", -1, 0, "malformed header at byte 13: premature end of input near '\"abc'"},
    {"bad_escape", "{\"a\\q\":" F32A "}", -1, 4, "malformed header at byte 13: invalid escape near '\"a\\q'"},
    {"bad_unicode_escape", "{\"a\\u12G4\":" F32A "}", -1, 4, "malformed header at byte 16: invalid escape near '\"a\\u12G'"},
    {"invalid_utf8", "{\"a\xff\":" F32A "}", -1, 4, "malformed header at byte 11: unable to decode byte 0xff near '\"a'"},
    {"overlong_utf8", "{\"a\xc0\xaf\":" F32A "}", -1, 4, "malformed header at byte 11: unable to decode byte 0xc0 near '\"a'"},
    {"control_char", "{\"a\x01\":" F32A "}", -1, 4, "malformed header at byte 11: control character 0x1 near '\"a'"},
    {"lone_surrogate", "{\"\\udc00\":" F32A "}", -1, 4,
     "malformed header at byte 17: invalid Unicode '\\uDC00' near '\"\\udc00\"'"},
    {"unpaired_high_surrogate", "{\"\\ud800x\":" F32A "}", -1, 4,
     "malformed header at byte 18: invalid Unicode '\\uD800' near '\"\\ud800x\"'"},
    {"nul_escape", "{\"a\\u0000\":" F32A "}", -1, 4,
     "malformed header at byte 18: NUL byte in object key not supported near '\"a\\u0000\"'"},
    {"leading_zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header at byte 38: invalid token near '0'"},
    {"negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-1,4]}}", -1, 4,
     "malformed header: data_offsets of tensor \"a\" holds a negative number"},
    {"fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: shape of tensor \"a\" must hold whole numbers, not a fraction or exponent"},
    {"exponent", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: shape of tensor \"a\" must hold whole numbers, not a fraction or exponent"},
    {"huge_number", "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header at byte 57: too big integer near '99999999999999999999'"},
    {"string_number", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: shape of tensor \"a\" must hold whole numbers, not a string"},
    {"shape_not_list", "{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: shape of tensor \"a\" must be a list, not a whole number"},
    {"three_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", -1, 4,
     "malformed header: data_offsets of tensor \"a\" must hold two numbers, not 3"},
    {"one_offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4,
     "malformed header: data_offsets of tensor \"a\" must hold two numbers, not 1"},
    {"missing_dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "malformed header: tensor \"a\" has no dtype"},
    {"unknown_key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"foo\":1,\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: unknown key \"foo\" in tensor \"a\" (expected dtype, shape, data_offsets)"},
    {"duplicate_key", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header at byte 35: duplicate object key near '\"dtype\"'"},
    {"tensor_not_object", "{\"a\":\"b\"}", -1, 0, "malformed header: tensor \"a\" must be an object, not a string"},
    {"deep_nesting", "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", -1, 0,
     "malformed header: tensor \"a\" must be an object, not a list"},
    {"metadata_not_string", "{\"__metadata__\":{\"k\":1}}", -1, 0,
     "malformed header: the value of __metadata__ key \"k\" must be a string, not a whole number"},
    {"metadata_nested", "{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", -1, 0,
     "malformed header: the value of __metadata__ key \"k\" must be a string, not an object"},
    {"duplicate_metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", -1, 0,
     "malformed header at byte 41: duplicate object key near '\"__metadata__\"'"},
    {"garbage_after", "{} x", -1, 0, "malformed header at byte 12: end of file expected near 'x'"},
    {"nul_padding", "{}\0\0", 4, 0,
     "malformed header at byte 11: end of file expected near end of file"}, /* jansson reads NUL as the end */
    {"too_many_dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: shape of tensor \"a\" has more than 16 dimensions"},
    {"unknown_dtype", "{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4,
     "malformed header: unknown dtype \"F17\" of tensor \"a\""},
    {"sub_byte_dtype", "{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", -1, 1,
     "malformed header: dtype \"F4\" of tensor \"a\" is not supported (its elements are smaller than a byte)"},
    {"outside_data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}", -1, 24,
     "tensor 'a' has data_offsets [0, 100] outside the data (24 bytes)"},
    {"reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", -1, 8,
     "tensor 'a' has reversed data_offsets [8, 4]"},
    {"size_mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", -1, 20,
     "tensor 'a' is F32 [2, 3] (24 bytes) but its data_offsets [0, 20] span 20 bytes"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
     -1, 24, "tensors 'a' [0, 16] and 'b' [8, 24] overlap"},
    {"gap",
     "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     -1, 24, "data bytes [8, 16) before tensor 'b' belong to no tensor"},
    {"hole_at_start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", -1, 16,
     "data bytes [0, 8) before tensor 'a' belong to no tensor"},
    {"trailing_data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 16,
     "data bytes [8, 16) at the end belong to no tensor"},
    {"duplicate_name", "{\"a\":" F32A ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8,
     "malformed header at byte 65: duplicate object key near '\"a\"'"},
    {"duplicate_metadata_key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", -1, 0,
     "malformed header at byte 36: duplicate object key near '\"k\"'"},
    {"too_many_elements", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824,1073741824,1073741824],\"data_offsets\":[0,4]}}", -1,
     4, "tensor 'a' has too many elements"},
};

static void bad_files(void) {
    dir_make();
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        const Bad *b = &bads[i];
        const char *path = at("bad.st");
        size_t hlen = b->len >= 0 && strcmp(b->name, "nul_padding") == 0 ? 4 : strlen(b->header);
        /* write explicitly (the header may hold NUL bytes) */
        size_t n = 8 + hlen + b->data;
        unsigned char *p = calloc(n, 1);
        uint64_t L = b->len < 0 ? (uint64_t)hlen : (uint64_t)b->len;
        for (int k = 0; k < 8; k++) p[k] = (unsigned char)(L >> (8 * k));
        memcpy(p + 8, b->header, hlen);
        spit(path, p, n);
        free(p);
        char want[1200];
        snprintf(want, sizeof want, "safetensors file '%s': %s", path, b->msg);
        RtStFile *f = NULL;
        RtError e;
        RtStatus st = rt_st_open(&f, path, &e);
        CHECK(st == RT_ERR_FORMAT && f == NULL, "%s: status %s", b->name, rt_status_name(st));
        if (st != RT_OK && strcmp(e.msg, want) != 0) {
            unit_fail_at(__FILE__, __LINE__, "%s: message differs", b->name);
            unit_detail("expected", want);
            unit_detail("got", e.msg);
        }
        rt_st_close(f);
    }
    /* A trailing comma (reported after the closing brace, the header's last byte). */
    char want[700];
    RtStFile *f = NULL;
    RtError e;
    const char *tc = "{\"a\":" F32A ",}";
    size_t tcn = strlen(tc);
    unsigned char *tp = calloc(8 + tcn + 4, 1);
    tp[0] = (unsigned char)tcn;
    memcpy(tp + 8, tc, tcn);
    spit(at("comma.st"), tp, 8 + tcn + 4);
    free(tp);
    CHECK(rt_st_open(&f, at("comma.st"), &e) == RT_ERR_FORMAT, "a trailing comma was accepted");
    snprintf(want, sizeof want, "safetensors file '%s': malformed header at byte %zu: string or '}' expected near '}'",
             at("comma.st"), 8 + tcn);
    CHECK_STR(e.msg, want, "message");
    /* Too short for the length field; missing; a directory. */
    spit(at("short.st"), "\x08\0\0", 3);
    CHECK(rt_st_open(&f, at("short.st"), &e) == RT_ERR_FORMAT, "a 3-byte file opened");
    snprintf(want, sizeof want, "safetensors file '%s' is truncated: 3 bytes, too short for the 8-byte header length",
             at("short.st"));
    CHECK_STR(e.msg, want, "message");
    CHECK(rt_st_open(&f, at("nope.st"), &e) == RT_ERR_IO, "a missing file opened");
    snprintf(want, sizeof want, "cannot open safetensors file '%s': No such file or directory", at("nope.st"));
    CHECK_STR(e.msg, want, "message");
    CHECK(rt_st_open(&f, dir, &e) == RT_ERR_FORMAT, "a directory opened");
    snprintf(want, sizeof want, "safetensors file '%s' is a directory, not a regular file", dir);
    CHECK_STR(e.msg, want, "message");
    dir_remove();
}

/* ---- truncation, and names in messages ---------------------------------------------------------- */

/* A valid file cut short at each part of it: the length field, the header, the data. */
static void truncated_files(void) {
    dir_make();
    float v[4] = {1, 2, 3, 4};
    int64_t s4[1] = {4};
    RtStEntry t = {"a", RT_F32, 1, s4, v, 0};
    RtError e;
    CHECK(rt_st_write(at("ok.st"), &t, 1, NULL, 0, &e) == RT_OK, "%s", e.msg);
    size_t n = 0;
    unsigned char *good = slurp(at("ok.st"), &n);
    size_t hlen = n - 8 - 16;
    struct {
        size_t len;
        char msg[200];
    } cuts[3];
    cuts[0].len = 5;
    snprintf(cuts[0].msg, sizeof cuts[0].msg, "' is truncated: 5 bytes, too short for the 8-byte header length");
    cuts[1].len = 8 + hlen / 2;
    snprintf(cuts[1].msg, sizeof cuts[1].msg, "': header length %zu is beyond the end of the file (%zu bytes)", hlen,
             8 + hlen / 2);
    cuts[2].len = n - 3;
    snprintf(cuts[2].msg, sizeof cuts[2].msg, "': tensor 'a' has data_offsets [0, 16] outside the data (13 bytes)");
    for (int i = 0; i < 3; i++) {
        spit(at("cut.st"), good, cuts[i].len);
        RtStFile *f = NULL;
        char want[700];
        snprintf(want, sizeof want, "safetensors file '%s%s", at("cut.st"), cuts[i].msg);
        CHECK(rt_st_open(&f, at("cut.st"), &e) == RT_ERR_FORMAT && f == NULL, "the file cut to %zu bytes opened", cuts[i].len);
        CHECK_STR(e.msg, want, "message");
        rt_st_close(f);
    }
    free(good);
    dir_remove();
}

/* Names may hold control characters (valid JSON escapes); messages naming them stay one line,
 * the characters written as escapes. (The safetensors fuzzer found a newline splitting one.) */
static void names_in_messages(void) {
    dir_make();
    static const char hdr[] = "{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char p[8 + sizeof hdr - 1 + 4] = {0};
    p[0] = (unsigned char)(sizeof hdr - 1);
    memcpy(p + 8, hdr, sizeof hdr - 1);
    RtStFile *f = NULL;
    RtError e;
    CHECK(rt_st_open_memory(&f, p, sizeof p, "m", &e) == RT_OK, "%s", e.msg);
    const RtStTensor *t = f ? rt_st_find(f, "a\nb") : NULL;
    CHECK(t != NULL, "the name with a newline was not found");
    int64_t out;
    CHECK(t && rt_st_read_i64(f, t, &out, 1, &e) == RT_ERR_FORMAT, "F32 read as i64");
    CHECK_STR(e.msg, "safetensors file 'm': tensor 'a\\nb' is F32, which cannot be read as i64 (I32 or I64 expected)", "message");
    rt_st_close(f);
    static const char hdr2[] = "{\"x\\t\\u0001\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char q[8 + sizeof hdr2 - 1 + 4] = {0};
    q[0] = (unsigned char)(sizeof hdr2 - 1);
    memcpy(q + 8, hdr2, sizeof hdr2 - 1);
    CHECK(rt_st_open_memory(&f, q, sizeof q, "m", &e) == RT_ERR_FORMAT && f == NULL, "an unknown dtype opened");
    CHECK_STR(e.msg, "safetensors file 'm': malformed header: unknown dtype \"F17\" of tensor \"x\\t\\x01\"", "message");
    CHECK(strchr(e.msg, '\n') == NULL && strchr(e.msg, '\t') == NULL, "a control character in the message");
    dir_remove();
}

/* ---- no crash on damaged files ------------------------------------------------------------------ */

/* Parses a private copy of exactly n bytes, so that AddressSanitizer sees any read past the end. */
static void parse_copy(const unsigned char *src, size_t n, int *ok) {
    unsigned char *p = malloc(n ? n : 1);
    memcpy(p, src, n);
    RtStFile *f = NULL;
    RtError e;
    RtStatus st = rt_st_open_memory(&f, p, n, "x", &e);
    *ok = st == RT_OK;
    if (st == RT_OK) {
        for (int64_t i = 0; i < rt_st_count(f); i++) {
            const RtStTensor *t = rt_st_tensor(f, i);
            CHECK(t->data >= p && t->data + (t->end - t->begin) <= p + n, "a tensor lies outside the buffer");
            float one;
            if (t->numel == 1 && (t->dtype == RT_F32 || t->dtype == RT_F16 || t->dtype == RT_BF16))
                CHECK(rt_st_read_f32(f, t, &one, 1, &e) == RT_OK, "read: %s", e.msg);
        }
    } else {
        CHECK(strncmp(e.msg, "safetensors file 'x'", 20) == 0, "an error that does not name the file: %s", e.msg);
    }
    rt_st_close(f);
    free(p);
}

static void no_crash_sweep(void) {
    dir_make();
    float v[3] = {1, 2, 3};
    int64_t s3[1] = {3}, s1[1] = {1};
    RtStEntry t[3] = {{"a", RT_F32, 1, s3, v, 0}, {"b.c", RT_BF16, 1, s1, v, 1}, {"d", RT_F16, 1, s1, v, 1}};
    RtStMeta m = {"format", "pt"};
    RtError e;
    CHECK(rt_st_write(at("ok.st"), t, 3, &m, 1, &e) == RT_OK, "%s", e.msg);
    size_t n = 0;
    unsigned char *good = slurp(at("ok.st"), &n);
    int ok;
    parse_copy(good, n, &ok);
    CHECK(ok, "the intact file does not parse");
    int accepted = 0;
    for (size_t k = 0; k < n; k++) {
        parse_copy(good, k, &ok);
        CHECK(!ok, "the file cut to %zu bytes was accepted", k);
    }
    static const unsigned char vals[] = {0x00, 0x20, '"', '{',  '}', '[', ']',  ',', ':',
                                         '0',  '9',  '-', '\\', 'e', 'u', 0x80, 0xFF};
    unsigned char *bad = malloc(n);
    for (size_t k = 0; k < n; k++)
        for (size_t q = 0; q < sizeof vals; q++) {
            memcpy(bad, good, n);
            bad[k] = vals[q];
            parse_copy(bad, n, &ok);
            accepted += ok;
        }
    /* Deterministic pseudo-random damage, several bytes at a time. */
    RtRng r;
    rt_rng_init(&r, 1, 2, 3);
    for (int it = 0; it < 20000; it++) {
        memcpy(bad, good, n);
        int hits = 1 + (int)rt_rng_below(&r, 4);
        for (int h = 0; h < hits; h++) bad[rt_rng_below(&r, n)] = (unsigned char)rt_rng_u32(&r);
        parse_copy(bad, n, &ok);
        accepted += ok;
    }
    /* Changing data bytes or padding keeps a file valid; that some variants parse is expected. */
    CHECK(accepted > 0, "no damaged variant parsed at all - the sweep tests nothing");
    free(bad);
    free(good);
    dir_remove();
}

/* ---- writing ------------------------------------------------------------------------------------ */

static void write_errors(void) {
    dir_make();
    float v[2] = {1, 2};
    int32_t iv[2] = {1, 2};
    int64_t s[1] = {2};
    RtError e;
    char want[600];
    RtStEntry dup[2] = {{"w", RT_F32, 1, s, v, 0}, {"w", RT_I32, 1, s, iv, 0}};
    CHECK(rt_st_write(at("x.st"), dup, 2, NULL, 0, &e) == RT_ERR_ARG, "duplicate names written");
    snprintf(want, sizeof want, "cannot write safetensors file '%s': duplicate tensor name 'w'", at("x.st"));
    CHECK_STR(e.msg, want, "message");
    RtStEntry conv = {"w", RT_I32, 1, s, v, 1};
    CHECK(rt_st_write(at("x.st"), &conv, 1, NULL, 0, &e) == RT_ERR_ARG, "f32 -> I32 accepted");
    snprintf(want, sizeof want, "cannot write safetensors file '%s': tensor 'w' cannot be converted from f32 to I32", at("x.st"));
    CHECK_STR(e.msg, want, "message");
    RtStEntry meta_name = {"__metadata__", RT_F32, 1, s, v, 0};
    CHECK(rt_st_write(at("x.st"), &meta_name, 1, NULL, 0, &e) == RT_ERR_ARG, "a tensor named __metadata__ written");
    snprintf(want, sizeof want, "cannot write safetensors file '%s': tensor 0 has an invalid name '__metadata__'", at("x.st"));
    CHECK_STR(e.msg, want, "message");
    RtStEntry bad_utf8 = {"a\xff", RT_F32, 1, s, v, 0};
    CHECK(rt_st_write(at("x.st"), &bad_utf8, 1, NULL, 0, &e) == RT_ERR_ARG, "invalid UTF-8 name written");
    RtStMeta m[2] = {{"k", "1"}, {"k", "2"}};
    CHECK(rt_st_write(at("x.st"), NULL, 0, m, 2, &e) == RT_ERR_ARG, "duplicate metadata written");
    snprintf(want, sizeof want, "cannot write safetensors file '%s': duplicate __metadata__ key 'k'", at("x.st"));
    CHECK_STR(e.msg, want, "message");
    CHECK(access(at("x.st"), F_OK) != 0 && leftovers() == 0, "a refused write left a file behind");
    CHECK(rt_st_write(at("no/such/dir/x.st"), NULL, 0, NULL, 0, &e) == RT_ERR_IO, "writing into a missing directory");
    snprintf(want, sizeof want, "cannot create safetensors file '%s' (temporary file '%s.tmp.%ld.0'): No such file or directory",
             at("no/such/dir/x.st"), at("no/such/dir/x.st"), (long)getpid());
    CHECK_STR(e.msg, want, "message");
    dir_remove();
}

/* The previous file, a failed write, and the check that nothing changed. */
static void write_old(const char *path, size_t *n, unsigned char **bytes) {
    float v[4] = {1, 2, 3, 4};
    int64_t s[1] = {4};
    RtStEntry t = {"old", RT_F32, 1, s, v, 0};
    RtError e;
    CHECK(rt_st_write(path, &t, 1, NULL, 0, &e) == RT_OK, "%s", e.msg);
    *bytes = slurp(path, n);
}

static void atomic_file_too_large(void) {
    dir_make();
    size_t n0;
    unsigned char *old;
    write_old(at("ck.st"), &n0, &old);
    /* A file-size limit makes write() fail with EFBIG part-way, as a full disk would with ENOSPC. */
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
    int64_t s[1] = {100000};
    float *big = calloc(100000, sizeof *big);
    RtStEntry t = {"new", RT_F32, 1, s, big, 1};
    RtError e;
    RtStatus st = rt_st_write(at("ck.st"), &t, 1, NULL, 0, &e);
    setrlimit(RLIMIT_FSIZE, &saved);
    CHECK(st == RT_ERR_IO, "the oversized write succeeded");
    char want[700];
    snprintf(want, sizeof want, "cannot write safetensors file '%s' (temporary file '%s.tmp.%ld.0'): File too large", at("ck.st"),
             at("ck.st"), (long)getpid());
    CHECK_STR(e.msg, want, "message");
    check_file_is(at("ck.st"), old, n0, "the previous file after a failed write");
    CHECK(leftovers() == 0, "the failed write left its temporary file");
    /* and a successful write replaces it */
    s[0] = 10;
    CHECK(rt_st_write(at("ck.st"), &t, 1, NULL, 0, &e) == RT_OK, "%s", e.msg);
    RtStFile *f = NULL;
    CHECK(rt_st_open(&f, at("ck.st"), &e) == RT_OK && rt_st_find(f, "new") && !rt_st_find(f, "old"), "not replaced");
    rt_st_close(f);
    free(big);
    free(old);
    dir_remove();
}

static void atomic_readonly_dir(void) {
    dir_make();
    size_t n0;
    unsigned char *old;
    write_old(at("ck.st"), &n0, &old);
    CHECK(chmod(dir, 0555) == 0, "chmod: %s", strerror(errno));
    float v[2] = {5, 6};
    int64_t s[1] = {2};
    RtStEntry t = {"new", RT_F32, 1, s, v, 0};
    RtError e;
    CHECK(rt_st_write(at("ck.st"), &t, 1, NULL, 0, &e) == RT_ERR_IO, "wrote into a read-only directory");
    char want[700];
    snprintf(want, sizeof want, "cannot create safetensors file '%s' (temporary file '%s.tmp.%ld.0'): Permission denied",
             at("ck.st"), at("ck.st"), (long)getpid());
    CHECK_STR(e.msg, want, "message");
    check_file_is(at("ck.st"), old, n0, "the previous file after a refused write");
    CHECK(leftovers() == 0, "a temporary file was left");
    free(old);
    dir_remove();
}

/* A file truncated after it was opened (its header checked against its size then), as another
 * process may do while a run loads its weights: reading a tensor past the new end is an error
 * naming the file and the tensor, not a SIGBUS (the reader used to map the file). Two tensors of
 * 3 MiB, so that the reads go over several 1 MiB chunks; the cut falls inside the second. */
static void shrunk_while_reading(void) {
    dir_make();
    int64_t count = (int64_t)3 << 18; /* 3 MiB of f32 */
    float *a = malloc((size_t)count * sizeof *a), *b = malloc((size_t)count * sizeof *b);
    float *out = malloc((size_t)count * sizeof *out);
    for (int64_t i = 0; i < count; i++) {
        a[i] = (float)i;
        b[i] = (float)-i;
    }
    int64_t shape[1] = {count};
    RtStEntry t[2] = {{"a", RT_F32, 1, shape, a, 0}, {"b", RT_F32, 1, shape, b, 0}};
    RtError e;
    CHECK(rt_st_write(at("big.st"), t, 2, NULL, 0, &e) == RT_OK, "%s", e.msg);
    RtStFile *f = NULL;
    CHECK(rt_st_open(&f, at("big.st"), &e) == RT_OK, "open: %s", e.msg);
    if (f) {
        const RtStTensor *ta = rt_st_find(f, "a"), *tb = rt_st_find(f, "b");
        CHECK(ta && ta->data == NULL && rt_st_read_f32(f, ta, out, count, &e) == RT_OK && memcmp(out, a, (size_t)count * 4) == 0,
              "tensor a before the cut: %s", e.msg);
        struct stat sb;
        CHECK(stat(at("big.st"), &sb) == 0, "stat");
        long long cut = (long long)sb.st_size - (long long)count * 4 / 2; /* half of the second tensor */
        CHECK(truncate(at("big.st"), (off_t)cut) == 0, "truncate");
        CHECK(rt_st_read_f32(f, ta, out, count, &e) == RT_OK && memcmp(out, a, (size_t)count * 4) == 0,
              "tensor a, still whole after the cut: %s", e.msg);
        CHECK(tb && rt_st_read_f32(f, tb, out, count, &e) == RT_ERR_IO, "tensor b read past the cut");
        char want[700];
        snprintf(want, sizeof want,
                 "safetensors file '%s' shrank while it was read: it was %lld bytes when opened and is %lld now, so tensor "
                 "'b' (bytes %lld to %lld) cannot be read",
                 at("big.st"), (long long)sb.st_size, cut, (long long)sb.st_size - count * 4, (long long)sb.st_size);
        CHECK_STR(e.msg, want, "message");
        int32_t i32[1];
        CHECK(rt_st_read_raw(f, tb, out, count, &e) == RT_ERR_IO && rt_st_read_i32(f, tb, i32, 1, &e) == RT_ERR_ARG,
              "raw read past the cut, and a wrong count");
        rt_st_close(f);
    }
    free(a);
    free(b);
    free(out);
    dir_remove();
}

int main(void) {
    RUN(reference_bytes);
    RUN(round_trip);
    RUN(conversions);
    RUN(bad_files);
    RUN(truncated_files);
    RUN(shrunk_while_reading);
    RUN(names_in_messages);
    RUN(no_crash_sweep);
    RUN(write_errors);
    RUN(atomic_file_too_large);
    /* root ignores directory permissions, so the read-only case cannot fail a write there */
    if (geteuid() != 0) RUN(atomic_readonly_dir);
    else printf("SKIP atomic_readonly_dir: running as root, which bypasses directory permissions\n");
    return unit_finish();
}
