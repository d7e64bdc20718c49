/* test_rt_json.c - the JSON reader of runtime/json.c (a checkpoint's state.json): values of every
 * kind, escapes and surrogate pairs decoded, 64-bit integers read exactly, and every malformed
 * input refused with its byte offset. */
#include <stdint.h>
#include <string.h>

#include "rt.h"
#include "unit.h"

static RtJsonDoc *parse(const char *text, RtError *e) {
    RtJsonDoc *d = NULL;
    rt_error_clear(e);
    rt_json_parse(&d, text, strlen(text), "t.json", e);
    return d;
}

static void values(void) {
    RtError e;
    RtJsonDoc *d = parse(" {\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"big\": 18446744073709551615,"
                         " \"neg\": -9223372036854775808, \"o\": {}} ",
                         &e);
    CHECK(d != NULL, "a valid document is refused: %s", e.msg);
    if (!d) return;
    const RtJsonValue *r = rt_json_root(d), *a = rt_json_get(r, "a");
    CHECK(r->type == RT_JSON_OBJECT && r->n == 4, "the root is an object of 4 members");
    CHECK(a && a->type == RT_JSON_ARRAY && a->n == 6, "a is an array of 6");
    double f = 0;
    int64_t i = 0;
    uint64_t u = 0;
    CHECK(rt_json_i64(a->items[0], &i) && i == 1, "1 reads as 1");
    CHECK(!rt_json_i64(a->items[1], &i) && rt_json_f64(a->items[1], &f) && f == -2500.0, "-2.5e3 is a number, not an integer");
    CHECK(a->items[2]->type == RT_JSON_BOOL && a->items[2]->boolean == 1 && a->items[3]->boolean == 0, "true, false");
    CHECK(a->items[4]->type == RT_JSON_NULL, "null");
    CHECK_STR(rt_json_str(a->items[5]), "x\xc3\xa9\xf0\x9f\x98\x80\n", "escapes and a surrogate pair decode to UTF-8");
    CHECK(rt_json_u64(rt_json_get(r, "big"), &u) && u == UINT64_MAX, "2^64-1 reads exactly");
    CHECK(!rt_json_i64(rt_json_get(r, "big"), &i), "2^64-1 does not fit an i64");
    CHECK(rt_json_i64(rt_json_get(r, "neg"), &i) && i == INT64_MIN, "-2^63 reads exactly");
    CHECK(!rt_json_u64(rt_json_get(r, "neg"), &u), "a negative number is no u64");
    CHECK(rt_json_get(r, "o")->n == 0 && !rt_json_get(r, "missing") && !rt_json_get(a, "a"), "lookups");
    rt_json_free(d);
}

static void malformed(void) {
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"", "byte 0: unexpected end of the file (a value was expected)"},
        {"{\"a\": 1,}", "byte 8: an object key must be a string"},
        {"[1, 2", "byte 5: expected ',' or ']' in an array"},
        {"{\"a\" 1}", "byte 5: expected ':' after an object key"},
        {"{\"a\": 1, \"a\": 2}", "byte 12: a key repeated in one object"},
        {"\"abc", "byte 1: unterminated string"},
        {"\"a\tb\"", "byte 2: a control character in a string (write it as an escape)"},
        {"\"\\q\"", "byte 1: an unknown escape in a string"},
        {"\"\\u12g4\"", "byte 1: a \\u escape needs four hex digits"},
        {"\"\\ud83d\"", "byte 7: an unpaired high surrogate"},
        {"\"\\ude00\"", "byte 7: an unpaired low surrogate"},
        {"\"\\u0000\"", "byte 7: a NUL character in a string"},
        {"\"\xc3\x28\"", "byte 1: invalid UTF-8 in a string"},
        {"01", "byte 1: more after the JSON value"},
        {"-", "byte 1: a malformed number"},
        {"1.", "byte 2: a malformed number (no digit after '.')"},
        {"1e+", "byte 3: a malformed number (no digit in the exponent)"},
        {"+1", "byte 0: unexpected character (a value was expected)"},
        {"tru", "byte 0: an unknown word"},
        {"[1] [2]", "byte 4: more after the JSON value"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        RtError e;
        RtJsonDoc *d = parse(bad[k].text, &e);
        CHECK(d == NULL && e.code == RT_ERR_FORMAT, "'%s' is refused", bad[k].text);
        char want[256];
        snprintf(want, sizeof want, "t.json: %s", bad[k].msg);
        CHECK_STR(e.msg, want, bad[k].text);
        rt_json_free(d);
    }
    /* nesting past the limit is refused, not a stack overflow */
    char deep[200];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    RtError e;
    RtJsonDoc *d = parse(deep, &e);
    CHECK(d == NULL && strstr(e.msg, "nested too deeply"), "199 nested arrays are refused: %s", e.msg);
}

int main(void) {
    RUN(values);
    RUN(malformed);
    return unit_finish();
}
