/* test_rt_tokenizer.c - unit tests of runtime/serve/tokenizer.c on a hand-made byte-level BPE (the
 * serve layer compares it with Hugging Face's `tokenizers` where that is installed): merges by
 * rank, GPT-2's pre-tokenizer (a space joins the word after it; a run of spaces leaves its last
 * one to the next word), added tokens matched whole, decoding back to bytes, GPT-2's vocab.json +
 * merges.txt, and located errors for a missing merges.txt, a non-BPE model and bad JSON.
 *
 * Build: make build/tests/test_rt_tokenizer (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve.h"
#include "unit.h"

/* GPT-2's byte-to-unicode symbol of byte b, as UTF-8. */
static void symbol(int b, char out[4]) {
    int c = b, n = 0;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        for (int k = 0; k < b; k++)
            if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) n++;
        c = 256 + n;
    }
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 63)), out[2] = 0;
}

static char g_dir[64];

/* Bytes are ids 0..255; merges: h e, l l, he ll, hell o, Ġ Ġ, Ġ hello; <|endoftext|> is 262. */
static const char *write_tokenizer(int as_vocab_json) {
    json_t *vocab = json_object();
    char s[8];
    for (int b = 0; b < 256; b++) {
        symbol(b, s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    const char *merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0\xc4\xa0", "\xc4\xa0hello"};
    const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 \xc4\xa0", "\xc4\xa0 hello"};
    for (int i = 0; i < 6; i++) json_object_set_new(vocab, merged[i], json_integer(256 + i));
    static char path[128];
    if (as_vocab_json) {
        snprintf(path, sizeof path, "%s/vocab.json", g_dir);
        json_dump_file(vocab, path, 0);
        char mp[128];
        snprintf(mp, sizeof mp, "%s/merges.txt", g_dir);
        FILE *f = fopen(mp, "w");
        fprintf(f, "#version: 0.2\n");
        for (int i = 0; i < 6; i++) fprintf(f, "%s\n", merges[i]);
        fclose(f);
        json_decref(vocab);
        return path;
    }
    json_t *m = json_array();
    for (int i = 0; i < 6; i++) json_array_append_new(m, json_string(merges[i]));
    json_t *root = json_pack("{s:{s:s,s:o,s:o},s:[{s:i,s:s,s:b}]}", "model", "type", "BPE", "vocab", vocab, "merges", m,
                             "added_tokens", "id", 262, "content", "<|endoftext|>", "special", 1);
    snprintf(path, sizeof path, "%s/tokenizer.json", g_dir);
    json_dump_file(root, path, 0);
    json_decref(root);
    return path;
}

static int encode(SvTokenizer *t, const char *text, int32_t *out, int max) {
    int32_t *ids;
    int64_t n;
    RtError e;
    if (sv_tokenizer_encode(t, text, strlen(text), &ids, &n, &e) != RT_OK) return -1;
    for (int64_t i = 0; i < n && i < max; i++) out[i] = ids[i];
    free(ids);
    return (int)n;
}

static void merges_and_pretokens(void) {
    SvTokenizer *t;
    RtError e;
    CHECK(sv_tokenizer_load(&t, write_tokenizer(0), &e) == RT_OK, "load: %s", e.msg);
    if (!t) return;
    int32_t ids[32] = {0};
    /* "hello hello": hello, then " hello" (the space joins the word) = Ġhello */
    int n = encode(t, "hello hello", ids, 32);
    CHECK(n == 2 && ids[0] == 259 && ids[1] == 261, "hello hello -> %d ids: %d %d", n, ids[0], ids[1]);
    /* "a   hello": a, "  " (the run keeps its last space for the word) = ĠĠ, " hello" = Ġhello */
    n = encode(t, "a   hello", ids, 32);
    CHECK(n == 3 && ids[0] == 'a' && ids[1] == 260 && ids[2] == 261, "a   hello -> %d ids: %d %d %d", n, ids[0], ids[1], ids[2]);
    /* trailing spaces stay one run: "hi  " -> h i ĠĠ */
    n = encode(t, "hi  ", ids, 32);
    CHECK(n == 3 && ids[2] == 260, "trailing spaces -> %d ids, last %d", n, ids[n - 1]);
    /* the added token is matched whole, in the middle of words */
    n = encode(t, "hello<|endoftext|>hello", ids, 32);
    CHECK(n == 3 && ids[1] == 262 && ids[0] == 259 && ids[2] == 259, "added token -> %d ids", n);
    CHECK(sv_tokenizer_find(t, "<|endoftext|>") == 262 && sv_tokenizer_find(t, "nope") == -1, "find");
    /* decoding gives the bytes back, UTF-8 included */
    const char *text = "caf\xc3\xa9 hello\t\n<|endoftext|> \xf0\x9f\x99\x82";
    int32_t *all;
    int64_t na;
    CHECK(sv_tokenizer_encode(t, text, strlen(text), &all, &na, &e) == RT_OK, "encode: %s", e.msg);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (int64_t i = 0; i < na; i++) sv_tokenizer_piece(t, all[i], &buf, &len, &cap);
    CHECK(len == strlen(text) && memcmp(buf, text, len) == 0, "round trip: '%.*s'", (int)len, buf ? buf : "");
    free(buf);
    free(all);
    sv_tokenizer_free(t);
}

static void vocab_and_merges_files(void) {
    SvTokenizer *t;
    RtError e;
    CHECK(sv_tokenizer_load(&t, write_tokenizer(1), &e) == RT_OK, "load vocab.json: %s", e.msg);
    if (!t) return;
    int32_t ids[8] = {0};
    int n = encode(t, "hello hello", ids, 8);
    CHECK(n == 2 && ids[0] == 259 && ids[1] == 261, "vocab.json + merges.txt: %d ids", n);
    sv_tokenizer_free(t);
    /* vocab.json alone, in a folder of its own */
    char dir[128], vp[160];
    snprintf(dir, sizeof dir, "%s/alone", g_dir);
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    CHECK(mkdir(dir, 0700) == 0 && rename(write_tokenizer(1), vp) == 0, "setup");
    CHECK(sv_tokenizer_load(&t, vp, &e) == RT_ERR_IO, "no merges.txt refused");
    CHECK(strstr(e.msg, "alone/merges.txt") != NULL && strstr(e.msg, "needs merges.txt beside it"), "message: %s", e.msg);
}

static void bad_files(void) {
    SvTokenizer *t;
    RtError e;
    char p[128];
    snprintf(p, sizeof p, "%s/bad.json", g_dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    fclose(f);
    CHECK(sv_tokenizer_load(&t, p, &e) == RT_ERR_FORMAT && strstr(e.msg, "Unigram model; only byte-level BPE"), "%s", e.msg);
    f = fopen(p, "w");
    fprintf(f, "{\"model\": ");
    fclose(f);
    CHECK(sv_tokenizer_load(&t, p, &e) == RT_ERR_FORMAT && strstr(e.msg, "is not valid JSON"), "%s", e.msg);
    CHECK(sv_tokenizer_load(&t, "/nonexistent/tokenizer.json", &e) == RT_ERR_IO && strstr(e.msg, "cannot open"), "%s", e.msg);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/mbt-tok-XXXXXX");
    if (!mkdtemp(g_dir)) return 2;
    RUN(merges_and_pretokens);
    RUN(vocab_and_merges_files);
    RUN(bad_files);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 2;
    return unit_finish();
}
