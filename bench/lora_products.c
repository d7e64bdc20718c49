/* lora_products.c - LoRA's down and up products timed alone on the CPU (bench/lora.py, docs/bench.md
 * "Fused LoRA"): rt_lora_f32 (one call, row tiles whose S stays in cache) against the two calls
 * the unfused program makes (rt_sgemm_batched S = x A^T, then C = D + alpha S B^T with the add
 * epilogue), at the shapes of bench/lora.mbt and larger ones, in the forward's layout (the weights
 * read transposed, column AB = T) and the input gradient's (not transposed, N). For each shape and thread count the two
 * arms alternate, REPS calls each after a warm-up; it prints each arm's min and median wall time per
 * call and its median process CPU time (all threads' CPU, which waiting for a core on a shared
 * machine does not count), and the ratios unfused / fused of the wall minima and of the CPU
 * medians. The two arms'
 * C must agree to 1e-5 of its largest value, or it exits 1.
 * Usage: lora_products [REPS] (default 30). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"
#include "rt_program.h"

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill(float *p, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 30;
    if (reps < 3) reps = 3;
    /* rows, din, rank, dout, transposed: 1 the forward's layout (A [r, k], B [n, r], PEFT's), 0 the
     * input gradient's (A = lora_B [k, r], B = lora_A [r, n]) */
    static const int64_t shapes[][5] = {{2048, 128, 8, 128, 1},     {2048, 128, 8, 128, 0},     {2048, 768, 16, 768, 1},
                                        {2048, 768, 16, 768, 0},     {4096, 2048, 16, 2048, 1}, {4096, 2048, 16, 2048, 0},
                                        {4096, 2048, 64, 2048, 1}};
    printf("lora_products: %d calls an arm; wall ms a call (min, median) and process CPU ms a call (median); unfused = 2\n"
           "rt_sgemm_batched calls, fused = rt_lora_f32; ratios unfused / fused of the wall minima and the CPU medians\n",
           reps);
    printf("%6s %6s %4s %6s %2s %3s  %9s %9s  %9s %9s  %9s %9s  %6s %6s\n", "rows", "din", "rank", "dout", "AB", "thr", "fused min", "med",
           "unfus min", "med", "fused cpu", "unfus cpu", "wall", "cpu");
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t M = shapes[si][0], K = shapes[si][1], R = shapes[si][2], N = shapes[si][3];
        int tr = (int)shapes[si][4];
        int64_t lda = tr ? K : R, ldb = tr ? R : N;
        float *x = malloc(sizeof(float) * M * K), *a = malloc(sizeof(float) * R * K), *b = malloc(sizeof(float) * N * R);
        float *d = malloc(sizeof(float) * M * N), *s = malloc(sizeof(float) * M * R);
        float *c1 = malloc(sizeof(float) * M * N), *c2 = malloc(sizeof(float) * M * N);
        fill(x, M * K, 1);
        fill(a, R * K, 2);
        fill(b, N * R, 3);
        fill(d, M * N, 4);
        for (int threads = 1; threads <= 2; threads++) {
            RtPool *pool = NULL;
            RtError e = {0};
            if (rt_pool_create(&pool, threads, &e) != RT_OK) {
                fprintf(stderr, "lora_products: %s\n", e.msg);
                return 1;
            }
            double *tf = malloc(sizeof(double) * reps), *tu = malloc(sizeof(double) * reps);
            double *cf = malloc(sizeof(double) * reps), *cu = malloc(sizeof(double) * reps);
            for (int r = -2; r < reps; r++) { /* two warm-up rounds */
                for (int arm = 0; arm < 2; arm++) {
                    int fused = (r & 1) ? arm : !arm; /* alternate which goes first */
                    double t0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
                    RtStatus st;
                    if (fused)
                        st = rt_lora_f32(pool, 1, M, K, R, N, K, 0, lda, 0, ldb, 0, tr, tr, 2.0f, x, a, b, d, s, c1, &e);
                    else {
                        st = rt_sgemm_batched(pool, 0, tr, M, R, K, 1.0f, x, K, 0, a, lda, 0, 0.0f, s, R, 0, 1, RT_GEMM_PLAIN, NULL, &e);
                        if (st == RT_OK)
                            st = rt_sgemm_batched(pool, 0, tr, M, N, R, 2.0f, s, R, 0, b, ldb, 0, 0.0f, c2, N, 0, 1, RT_GEMM_ADD, d, &e);
                    }
                    double t = clock_ms(CLOCK_MONOTONIC) - t0, cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
                    if (st != RT_OK) {
                        fprintf(stderr, "lora_products: %s\n", e.msg);
                        return 1;
                    }
                    if (r >= 0) {
                        (fused ? tf : tu)[r] = t;
                        (fused ? cf : cu)[r] = cpu;
                    }
                }
            }
            double big = 0, diff = 0;
            for (int64_t i = 0; i < M * N; i++) {
                if (fabs(c2[i]) > big) big = fabs(c2[i]);
                if (fabs(c1[i] - c2[i]) > diff) diff = fabs(c1[i] - c2[i]);
            }
            if (diff > 1e-5 * big) {
                fprintf(stderr, "lora_products: the arms differ: %g against values up to %g\n", diff, big);
                bad = 1;
            }
            qsort(tf, reps, sizeof *tf, cmp_d);
            qsort(tu, reps, sizeof *tu, cmp_d);
            qsort(cf, reps, sizeof *cf, cmp_d);
            qsort(cu, reps, sizeof *cu, cmp_d);
            printf("%6lld %6lld %4lld %6lld %2s %3d  %9.3f %9.3f  %9.3f %9.3f  %9.3f %9.3f  %6.3f %6.3f\n", (long long)M, (long long)K,
                   (long long)R, (long long)N, tr ? "T" : "N", threads, tf[0], tf[reps / 2], tu[0], tu[reps / 2], cf[reps / 2], cu[reps / 2],
                   tu[0] / tf[0], cu[reps / 2] / cf[reps / 2]);
            fflush(stdout);
            free(tf), free(tu), free(cf), free(cu);
            rt_pool_destroy(pool);
        }
        free(x), free(a), free(b), free(d), free(s), free(c1), free(c2);
    }
    return bad;
}
