/* sv_tokenize.c - runtime/serve/tokenizer.c from the command line, for the serve layer's
 * comparison with Hugging Face's `tokenizers` (tests/serve/serve_test.py):
 *
 *   sv_tokenize TOKENIZER encode TEXTFILE   the ids of the file's text, one line, space-separated
 *   sv_tokenize TOKENIZER decode IDS...     the bytes of the ids, as they are
 *
 * Exit status 1 with the message on stderr when the tokenizer or the text cannot be read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "encode") != 0 && strcmp(argv[2], "decode") != 0) ||
        (strcmp(argv[2], "encode") == 0 && argc != 4)) {
        fprintf(stderr, "usage: sv_tokenize TOKENIZER encode TEXTFILE | sv_tokenize TOKENIZER decode IDS...\n");
        return 2;
    }
    RtError e;
    SvTokenizer *t;
    if (sv_tokenizer_load(&t, argv[1], &e) != RT_OK) {
        fprintf(stderr, "sv_tokenize: %s\n", e.msg);
        return 1;
    }
    int rc = 0;
    if (strcmp(argv[2], "encode") == 0) {
        FILE *f = fopen(argv[3], "rb");
        if (!f) {
            perror(argv[3]);
            sv_tokenizer_free(t);
            return 1;
        }
        size_t cap = 1 << 20, n = 0;
        char *buf = malloc(cap);
        size_t k;
        while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
            n += k;
            if (n == cap) {
                char *q = realloc(buf, cap *= 2);
                if (!q) free(buf);
                buf = q;
            }
        }
        fclose(f);
        int32_t *ids = NULL;
        int64_t nid = 0;
        if (!buf || sv_tokenizer_encode(t, buf, n, &ids, &nid, &e) != RT_OK) {
            fprintf(stderr, "sv_tokenize: %s\n", buf ? e.msg : "out of memory");
            rc = 1;
        } else {
            for (int64_t i = 0; i < nid; i++) printf("%s%d", i ? " " : "", (int)ids[i]);
            printf("\n");
        }
        free(ids);
        free(buf);
    } else {
        char *out = NULL;
        size_t len = 0, cap = 0;
        for (int i = 3; i < argc; i++) sv_tokenizer_piece(t, (int32_t)atoi(argv[i]), &out, &len, &cap);
        if (len) fwrite(out, 1, len, stdout);
        free(out);
    }
    sv_tokenizer_free(t);
    return rc;
}
