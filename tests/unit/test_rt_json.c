/* test_rt_json.c - the runtime's JSON reader and writer (runtime/io/json.c, over jansson): values of
 * every kind read back, escapes and surrogate pairs decoded, 64-bit integers exact in both
 * directions (a u64 past INT64_MAX through its decimal string), NaN and infinities written as
 * null, \u escapes written in lower case, and every malformed input refused with its byte offset
 * counted in the caller's file. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rt.h"
#include "unit.h"

static json_t *parse_at(const char *text, size_t at, RtError *e) {
    json_t *d = NULL;
    rt_error_clear(e);
    rt_json_parse(&d, text, strlen(text), at, "t.json", e);
    return d;
}

static void values(void) {
    RtError e;
    json_t *r = parse_at(" {\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"max\": 9223372036854775807,"
                         " \"big\": \"18446744073709551615\", \"neg\": -9223372036854775808, \"o\": {}} ",
                         0, &e);
    CHECK(r != NULL, "a valid document is refused: %s", e.msg);
    if (!r) return;
    const json_t *a = rt_json_get(r, "a");
    CHECK(json_is_object(r) && json_object_size(r) == 5, "the root is an object of 5 members");
    CHECK(json_is_array(a) && json_array_size(a) == 6, "a is an array of 6");
    double f = 0;
    int64_t i = 0;
    uint64_t u = 0;
    CHECK(rt_json_i64(json_array_get(a, 0), &i) && i == 1, "1 reads as 1");
    CHECK(!rt_json_i64(json_array_get(a, 1), &i) && rt_json_f64(json_array_get(a, 1), &f) && f == -2500.0,
          "-2.5e3 is a number, not an integer");
    CHECK(json_is_true(json_array_get(a, 2)) && json_is_false(json_array_get(a, 3)), "true, false");
    CHECK(json_is_null(json_array_get(a, 4)), "null");
    CHECK_STR(rt_json_str(json_array_get(a, 5)), "x\xc3\xa9\xf0\x9f\x98\x80\n", "escapes and a surrogate pair decode to UTF-8");
    CHECK(rt_json_u64(rt_json_get(r, "max"), &u) && u == INT64_MAX, "2^63-1 reads exactly as a u64");
    CHECK(rt_json_u64(rt_json_get(r, "big"), &u) && u == UINT64_MAX, "2^64-1 reads exactly from its decimal string");
    CHECK(!rt_json_i64(rt_json_get(r, "big"), &i), "a string is no i64");
    CHECK(rt_json_i64(rt_json_get(r, "neg"), &i) && i == INT64_MIN, "-2^63 reads exactly");
    CHECK(!rt_json_u64(rt_json_get(r, "neg"), &u), "a negative number is no u64");
    CHECK(json_object_size(rt_json_get(r, "o")) == 0 && !rt_json_get(r, "missing") && !rt_json_get(a, "a"), "lookups");
    CHECK(!rt_json_str(rt_json_get(r, "max")) && !rt_json_f64(rt_json_get(r, "o"), &f), "type mismatches read as absent");
    json_decref(r);
    /* strings that are no u64 */
    static const char *const not_u64[] = {"[\"\"]", "[\"-1\"]", "[\"01\"]", "[\"1x\"]", "[\"18446744073709551616\"]", "[\" 1\"]"};
    for (size_t k = 0; k < sizeof not_u64 / sizeof *not_u64; k++) {
        r = parse_at(not_u64[k], 0, &e);
        CHECK(r && !rt_json_u64(json_array_get(r, 0), &u), "%s read as a u64", not_u64[k]);
        json_decref(r);
    }
}

static void writing(void) {
    json_t *o = json_object();
    json_object_set_new(o, "u", rt_json_new_u64(UINT64_MAX));
    json_object_set_new(o, "s", rt_json_new_u64(42));
    json_object_set_new(o, "nan", rt_json_new_f64(NAN));
    json_object_set_new(o, "inf", rt_json_new_f64(-INFINITY));
    json_object_set_new(o, "x", rt_json_new_f64(0.1));
    json_object_set_new(o, "c\x01\x1f\t\xc3\xa9", json_string("q\"\\/"));
    size_t len = 0;
    char *text = rt_json_text(o, JSON_COMPACT, &len);
    CHECK_STR(text,
              "{\"u\":\"18446744073709551615\",\"s\":42,\"nan\":null,\"inf\":null,\"x\":0.10000000000000001,"
              "\"c\\u0001\\u001f\\t\xc3\xa9\":\"q\\\"\\\\/\"}",
              "compact text: insertion order, u64 past INT64_MAX as a string, null for NaN and inf, lower-case \\u escapes");
    CHECK(text && len == strlen(text), "the length");
    /* and it reads back to the same values */
    RtError e;
    json_t *back = text ? parse_at(text, 0, &e) : NULL;
    uint64_t u = 0;
    double x = 0;
    CHECK(back && rt_json_u64(rt_json_get(back, "u"), &u) && u == UINT64_MAX, "2^64-1 round-trips");
    CHECK(back && rt_json_f64(rt_json_get(back, "x"), &x) && x == 0.1, "0.1 round-trips with 17 digits");
    CHECK(back && json_is_null(rt_json_get(back, "nan")), "NaN reads back as null");
    CHECK(back && rt_json_get(back, "c\x01\x1f\t\xc3\xa9"), "a key with control characters round-trips");
    free(text);
    json_decref(back);
    text = rt_json_text(o, JSON_REAL_PRECISION(9), NULL);
    CHECK(text && strstr(text, "\"x\": 0.1,"), "9 significant digits, spaced members: %s", text ? text : "(null)");
    free(text);
    json_decref(o);
    CHECK(rt_json_text(NULL, 0, &len) == NULL, "no text for no value");
    int nomem = 1;
    CHECK(rt_json_valid_utf8("a\xc3\xa9", &nomem) && !nomem, "UTF-8 is valid");
    CHECK(!rt_json_valid_utf8("a\xff", &nomem) && !nomem, "0xff is not UTF-8");
    CHECK(!rt_json_valid_utf8("\xc0\xaf", &nomem) && !nomem, "an overlong form is not UTF-8");
}

static void malformed(void) {
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"", "byte 0: unexpected token near end of file"},
        {"{\"a\": 1,}", "byte 9: string or '}' expected near '}'"},
        {"[1, 2", "byte 5: ']' expected near end of file"},
        {"{\"a\" 1}", "byte 6: ':' expected near '1'"},
        {"{\"a\": 1, \"a\": 2}", "byte 12: duplicate object key near '\"a\"'"},
        {"\"abc", "byte 4: premature end of input near '\"abc'"},
        {"\"a\tb\"", "byte 2: control character 0x9 near '\"a'"},
        {"\"\\q\"", "byte 3: invalid escape near '\"\\q'"},
        {"\"\\u12g4\"", "byte 6: invalid escape near '\"\\u12g'"},
        {"\"\\ud83d\"", "byte 8: invalid Unicode '\\uD83D' near '\"\\ud83d\"'"},
        {"\"\\ude00\"", "byte 8: invalid Unicode '\\uDE00' near '\"\\ude00\"'"},
        {"\"\\u0000\"", "byte 8: \\u0000 is not allowed without JSON_ALLOW_NUL near '\"\\u0000\"'"},
        {"\"\xc3\x28\"", "byte 1: unable to decode byte 0xc3 near '\"'"},
        {"01", "byte 1: invalid token near '0'"},
        {"-", "byte 1: invalid token near '-'"},
        {"1.", "byte 2: invalid token near '1.'"},
        {"1e+", "byte 3: invalid token near '1e+'"},
        {"+1", "byte 1: invalid token near '+'"},
        {"tru", "byte 3: invalid token near 'tru'"},
        {"[1] [2]", "byte 5: end of file expected near '['"},
        {"[18446744073709551615]", "byte 21: too big integer near '18446744073709551615'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        RtError e;
        json_t *d = parse_at(bad[k].text, 0, &e);
        CHECK(d == NULL && e.code == RT_ERR_FORMAT, "'%s' is refused", bad[k].text);
        char want[256];
        snprintf(want, sizeof want, "t.json at %s", bad[k].msg);
        CHECK_STR(e.msg, want, bad[k].text);
        json_decref(d);
    }
    /* offsets count from where the text starts in its file; bytes jansson quotes are escaped */
    RtError e;
    json_t *d = parse_at("[\x01]", 100, &e);
    CHECK(d == NULL && strcmp(e.msg, "t.json at byte 102: invalid token near '\\x01'") == 0, "offset and escape: %s", e.msg);
    /* nesting past jansson's limit (2048) is refused, not a stack overflow */
    char deep[3000];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    d = parse_at(deep, 0, &e);
    CHECK(d == NULL && strstr(e.msg, "maximum parsing depth reached"), "2999 nested arrays are refused: %s", e.msg);
}

int main(void) {
    RUN(values);
    RUN(writing);
    RUN(malformed);
    return unit_finish();
}
