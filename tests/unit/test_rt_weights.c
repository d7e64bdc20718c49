/* test_rt_weights.c - rt_weights_load (runtime/weights.c) against a hand-written parameter table:
 * values read from F32, F16 and BF16 exactly, tensors that are not parameters counted, and a file
 * that does not fit the program reported in one message listing every problem (missing tensors,
 * wrong shapes, dtypes with no f32 conversion), capped with "and N more", with no parameter
 * written. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "rt_exec.h"
#include "unit.h"

static char g_dir[256];

static const char *tmp(const char *name) {
    static char buf[4][PATH_MAX];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, PATH_MAX, "%s/%s", g_dir, name);
    return p;
}

/* A GPT-2-like table: 4 parameters, 120 floats. */
static const RtParam g_params[] = {
    {"wte.weight", 2, {8, 4}, 32, 0, RT_INIT_ZEROS, 0, 0},
    {"h.0.ln_1.weight", 1, {4}, 4, 32, RT_INIT_ZEROS, 0, 0},
    {"h.0.attn.c_attn.weight", 2, {4, 12}, 48, 36, RT_INIT_ZEROS, 0, 0},
    {"lm_head.weight", 2, {8, 4}, 32, 84, RT_INIT_ZEROS, 0, 0},
};
#define NFLOATS 116

static RtProgram program(const RtParam *params, int64_t n) {
    RtProgram p;
    memset(&p, 0, sizeof p);
    p.params = params;
    p.nparams = n;
    return p;
}

static void values(float *v, int64_t n, float base) {
    for (int64_t i = 0; i < n; i++) v[i] = base + 0.25f * (float)i; /* exact in f16 and bf16 up to 64 */
}

static void loads_every_dtype(void) {
    float wte[32], ln[4], attn[48], head[32], mask[4] = {1, 0, 1, 1};
    values(wte, 32, -4), values(ln, 4, 1), values(attn, 48, -6), values(head, 32, 2);
    int64_t s84[2] = {8, 4}, s4[1] = {4}, s412[2] = {4, 12}, s1122[4] = {1, 1, 2, 2};
    RtStEntry e[5] = {{"wte.weight", RT_F32, 2, s84, wte, 1},
                      {"h.0.ln_1.weight", RT_F16, 1, s4, ln, 1},
                      {"h.0.attn.c_attn.weight", RT_BF16, 2, s412, attn, 1},
                      {"lm_head.weight", RT_F16, 2, s84, head, 1},
                      {"h.0.attn.bias", RT_F32, 4, s1122, mask, 1}};
    RtError err;
    CHECK(rt_st_write(tmp("ok.safetensors"), e, 5, NULL, 0, &err) == RT_OK, "%s", err.msg);
    RtProgram p = program(g_params, 4);
    float got[NFLOATS];
    int64_t unused = -1;
    CHECK(rt_weights_load(&p, got, tmp("ok.safetensors"), &unused, &err) == RT_OK, "%s", err.msg);
    CHECK(unused == 1, "%lld unused tensors, expected 1 (h.0.attn.bias)", (long long)unused);
    CHECK(memcmp(got, wte, sizeof wte) == 0 && memcmp(got + 32, ln, sizeof ln) == 0 && memcmp(got + 36, attn, sizeof attn) == 0 &&
              memcmp(got + 84, head, sizeof head) == 0,
          "values differ after the exact conversions");
}

/* Missing, transposed, I32, and I32 with the wrong shape: every one in one message. */
static void every_problem_at_once(void) {
    float wte[32] = {0}, attn[48] = {0};
    int32_t head[40] = {0};
    int64_t s84[2] = {8, 4}, s124[2] = {12, 4}, s85[2] = {8, 5}, s2[1] = {2};
    RtStEntry e[4] = {{"wte.weight", RT_F32, 2, s84, wte, 1},
                      {"h.0.attn.c_attn.weight", RT_F32, 2, s124, attn, 1},
                      {"lm_head.weight", RT_I32, 2, s85, head, 0},
                      {"extra", RT_F32, 1, s2, wte, 1}};
    RtError err;
    const char *path = tmp("bad.safetensors");
    CHECK(rt_st_write(path, e, 4, NULL, 0, &err) == RT_OK, "%s", err.msg);
    RtProgram p = program(g_params, 4);
    float got[NFLOATS];
    for (int i = 0; i < NFLOATS; i++) got[i] = 7.0f;
    int64_t unused = -1;
    CHECK(rt_weights_load(&p, got, path, &unused, &err) == RT_ERR_FORMAT, "status %s", rt_status_name(err.code));
    char want[RT_ERROR_MAX];
    snprintf(want, sizeof want,
             "weights file '%s' does not fit the program (4 problems): missing 'h.0.ln_1.weight' [4]; "
             "'h.0.attn.c_attn.weight' is [12, 4] but the parameter is [4, 12]; 'lm_head.weight' is [8, 5] but the "
             "parameter is [8, 4]; 'lm_head.weight' is I32, which cannot be converted to f32",
             path);
    CHECK_STR(err.msg, want, "message");
    int untouched = 1;
    for (int i = 0; i < NFLOATS; i++) untouched &= got[i] == 7.0f;
    CHECK(untouched, "a parameter was written although the file does not fit");
    CHECK(unused == -1, "*unused set on failure");

    /* Only missing tensors: RT_ERR_NOTFOUND, one problem in the singular. */
    RtStEntry only[3] = {e[0], {"h.0.ln_1.weight", RT_F32, 1, s84 + 1, wte, 1}, {"lm_head.weight", RT_F32, 2, s84, wte, 1}};
    CHECK(rt_st_write(path, only, 3, NULL, 0, &err) == RT_OK, "%s", err.msg);
    CHECK(rt_weights_load(&p, got, path, &unused, &err) == RT_ERR_NOTFOUND, "status %s", rt_status_name(err.code));
    snprintf(want, sizeof want,
             "weights file '%s' does not fit the program (1 problem): missing 'h.0.attn.c_attn.weight' [4, 12]", path);
    CHECK_STR(err.msg, want, "message");
}

/* 30 missing parameters: 20 listed, "and 10 more"; with long names, fewer fit, the message is
 * never cut (no "..."), and the count is still right. */
static void the_list_is_capped(void) {
    enum { N = 30 };
    static RtParam many[N];
    static char names[N][200];
    float one = 1;
    int64_t s1[1] = {1};
    RtStEntry e = {"unrelated", RT_F32, 1, s1, &one, 1};
    RtError err;
    const char *path = tmp("few.safetensors");
    CHECK(rt_st_write(path, &e, 1, NULL, 0, &err) == RT_OK, "%s", err.msg);
    for (int len = 0; len < 2; len++) {
        for (int i = 0; i < N; i++) {
            if (len == 0) snprintf(names[i], sizeof names[i], "p%d", i);
            else snprintf(names[i], sizeof names[i], "model.layers.%d.%0150d", i, 0);
            many[i] = (RtParam){names[i], 1, {2}, 2, 2 * i, RT_INIT_ZEROS, 0, 0};
        }
        RtProgram p = program(many, N);
        float got[2 * N];
        CHECK(rt_weights_load(&p, got, path, NULL, &err) == RT_ERR_NOTFOUND, "status");
        size_t L = strlen(err.msg);
        CHECK(L < RT_ERROR_MAX - 100 && strstr(err.msg, "...") == NULL, "the message was cut (%zu bytes)", L);
        CHECK(strstr(err.msg, "(30 problems): missing 'p0' [2]; ") != NULL || len == 1, "the count: %s", err.msg);
        int listed = 0;
        for (const char *q = err.msg; (q = strstr(q, "missing '")) != NULL; q++) listed++;
        char tail[64];
        snprintf(tail, sizeof tail, "; and %d more", N - listed);
        CHECK(L > strlen(tail) && strcmp(err.msg + L - strlen(tail), tail) == 0, "no '%s' at the end: %s", tail, err.msg);
        if (len == 0) CHECK(listed == 20, "%d listed, expected 20", listed);
        else CHECK(listed >= 3 && listed < 20, "%d long names listed", listed);
    }
}

/* rt_step_dump checks that the regions' padding is zero (a padded vocabulary's rows past the
 * program's, docs/cuda.md): a parameter of [3, 2] stored as [4, 2] at 0 and one of [2] at 16, so
 * elements 6..15 and 18..19 are padding; one of them not zero in any region refuses the dump. */
static void dump_padding_is_checked(void) {
    static const RtParam params[] = {{"wte", 2, {3, 2}, 6, 0, RT_INIT_ZEROS, 0, 0}, {"b", 1, {2}, 2, 16, RT_INIT_ZEROS, 0, 0}};
    RtProgram p = program(params, 2);
    p.param_floats = 20;
    p.train.micro = 1, p.train.seq = 2;
    float pv[20] = {0}, gv[20] = {0}, nv[20] = {0};
    values(pv, 6, 1), values(gv, 6, 2), values(nv, 6, 3);
    pv[16] = gv[16] = nv[17] = 5;
    int32_t x[2] = {1, 2}, y[2] = {2, 0};
    RtStepDump d = {pv, gv, nv, x, y, 1, 1.5, 0.1, 0, 1};
    RtError err;
    CHECK(rt_step_dump(&p, &d, tmp("dump.safetensors"), &err) == RT_OK, "%s", err.msg);
    float *regions[3] = {pv, gv, nv};
    const int64_t at[3] = {6, 15, 19};
    for (int k = 0; k < 3; k++) {
        regions[k][at[k]] = -0.5f;
        CHECK(rt_step_dump(&p, &d, tmp("dump.safetensors"), &err) != RT_OK, "region %d: padding %lld not zero was dumped", k,
              (long long)at[k]);
        char want[64];
        snprintf(want, sizeof want, "element %lld of the", (long long)at[k]);
        CHECK(strstr(err.msg, want) && strstr(err.msg, "(padding) and is -0.5"), "region %d: %s", k, err.msg);
        regions[k][at[k]] = 0;
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/mbt-weights-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(loads_every_dtype);
    RUN(every_problem_at_once);
    RUN(the_list_is_capped);
    RUN(dump_padding_is_checked);
    const char *files[] = {"ok.safetensors", "bad.safetensors", "few.safetensors", "dump.safetensors"};
    for (int i = 0; i < 4; i++) remove(tmp(files[i]));
    rmdir(g_dir);
    return unit_finish();
}
