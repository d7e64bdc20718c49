/* ce_check.cc - the online cross-entropy statistics kernel and the classifier kernel
 * (compiler/backend/cuda/cuda_dedicated.c, CUDA_CE_STATS: each row's max m and sum s of exp(x - m)
 * in one pass and the target's logit; the classifier then writes the row's gradient, over the
 * logits when they are its parameter) against a float64 reference, on the emulated GPU.
 * tests/cudaemu/check_ce.sh builds a program's kernels (mbtc --emit=cuda) into a shared object with
 * tests/cudaemu/build.sh and runs this on its statistics or classifier kernel:
 *
 *   ce_check KERNELS.so NAME IN TGT OUT ROWS V STRIDE IN_OFF TGT_OFF IN_DT BLOCKS [GRAD GW GRAD_DT DLOSS N]
 *
 * (as `mbtc --emit=kernels` prints the kernel's `ce_stats:` and `ce_grad:` lines; IN_DT and GRAD_DT
 * f32 or bf16). Rows of random logits (a standard deviation of 8: the running max moves often, so
 * the rescaling is exercised), plus special rows: some -inf entries (they add nothing), one NaN (m
 * and s NaN), a +inf at the end and one early in a row (m = inf, s NaN, as the CPU's exp(inf - inf)),
 * all -inf (m = -inf, s = 0), a first half of -inf;
 * targets in [0, V) with one -1 and one V (clamped for the target's logit, matching no column for
 * the one-hot, as the CPU's kernel); the columns past V of each row (a padded vocabulary) hold NaN.
 * Checked:
 *   m   equal to the row's max (a max is exact)
 *   s   within 1e-5 relative of the float64 sum of exp(x - m) over the same (rounded) inputs: each
 *       thread adds ~V/256 terms and the tree 256 more, each with a few ulps (2^-24) of rounding
 *       and expf's 1-2 ulps
 *   xt  the target's (clamped) logit exactly
 *   the gradient, column j < V: within 1e-5 x (p_j + onehot_j) x dloss / N of the float64
 *       (exp(x_j - m) / s - onehot_j) x dloss / N (p_j = exp(x_j - m) / s: its error is s's and a
 *       few ulps, and the target's p - 1 cancels only what is exact), plus half a bf16 ulp of the
 *       value when stored as bf16; NaN where m or s is NaN; columns V .. GW exactly +0
 *   the launch at the header's block count and at 7 blocks byte-identical (a fixed tree per row).
 * A control: the gradient held to a reference without the one-hot must fail (the check can).
 * Prints `PASS name` / `FAIL name: why` lines and `N passed, M failed`; exit status 1 on a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "check_harness.h"

static unsigned long long rng = 0x2545f4914f6cdd1dULL;
static double uniform() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* The gradient's elements that differ from the float64 reference beyond the tolerance (hot = 0: the
 * control's reference without the one-hot). */
static long long grad_bad(const std::vector<float> &x, const std::vector<int> &t, const std::vector<float> &g, long long rows,
                          long long V, long long stride, long long off, long long gW, int gbf16, double scale, int hot,
                          double *worst, char *why, size_t whylen) {
    long long bad = 0;
    const float inf = INFINITY;
    for (long long r = 0; r < rows; r++) {
        const float *row = &x[(size_t)(off + r * stride)];
        float m = -inf;
        int nan = 0;
        for (long long j = 0; j < V; j++) {
            nan |= row[j] != row[j];
            if (row[j] > m) m = row[j];
        }
        double s = 0;
        for (long long j = 0; j < V; j++)
            if (row[j] != -inf) s += exp((double)row[j] - (double)m);
        int special = nan || m == inf || m == -inf;
        for (long long j = 0; j < gW; j++) {
            float got = g[(size_t)(r * gW + j)];
            int ok;
            double want = 0;
            if (j >= V) ok = got == 0.0f && !signbit(got);
            else if (special) ok = got != got;
            else {
                double p = (row[j] == -inf ? 0.0 : exp((double)row[j] - (double)m)) / s, oh = hot && j == t[(size_t)r] ? 1.0 : 0.0;
                want = (p - oh) * scale;
                double tol = 1e-5 * (p + oh) * fabs(scale) + (gbf16 ? fabs(want) / 256.0 : 0.0);
                double e = fabs((double)got - want);
                ok = e <= tol;
                if (ok && (p + oh) > 0 && e / ((p + oh) * fabs(scale)) > *worst) *worst = e / ((p + oh) * fabs(scale));
            }
            if (!ok) {
                if (!bad) snprintf(why, whylen, "row %lld column %lld: %.9g, want %.9g", r, j, got, want);
                bad++;
            }
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 13 && argc != 18) {
        fprintf(stderr, "usage: ce_check KERNELS.so NAME IN TGT OUT ROWS V STRIDE IN_OFF TGT_OFF IN_DT BLOCKS [GRAD GW GRAD_DT DLOSS N]\n");
        return 2;
    }
    LaunchFn launch;
    const char *name = argv[2];
    int kid = emu_kernel(argv[1], name, "ce", &launch);
    if (kid < 0) return 1;
    int pin = atoi(argv[3]), ptgt = atoi(argv[4]), pout = atoi(argv[5]), bf16 = strcmp(argv[11], "bf16") == 0;
    long long rows = atoll(argv[6]), V = atoll(argv[7]), stride = atoll(argv[8]), off = atoll(argv[9]), toff = atoll(argv[10]),
              blocks = atoll(argv[12]);
    int pgrad = argc == 18 ? atoi(argv[13]) : -1, gbf16 = argc == 18 && strcmp(argv[15], "bf16") == 0;
    long long gW = argc == 18 ? atoll(argv[14]) : 0;
    double scale = argc == 18 ? atof(argv[16]) / atof(argv[17]) : 0;
    int nparams = 1 + (pin > ptgt ? (pin > pout ? pin : pout) : (ptgt > pout ? ptgt : pout));
    if (pgrad + 1 > nparams) nparams = pgrad + 1;
    if (pin < 0 || ptgt < 0 || pout < 0 || nparams > 4 || rows < 7 || V < 2 || stride < V || (pgrad >= 0 && gW < V) ||
        (pgrad == pin && (gW != stride || gbf16 != bf16 || off != 0))) {
        printf("FAIL ce/setup: unexpected parameters\n0 passed, 1 failed\n");
        return 1;
    }
    size_t n = (size_t)(off + rows * stride);
    std::vector<float> x(n); /* the logits as the kernel sees them (rounded to bf16 when stored so) */
    for (size_t i = 0; i < n; i++) {
        double u1 = uniform(), u2 = uniform();
        x[i] = (float)(8.0 * sqrt(-2.0 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
    }
    const float inf = INFINITY;
    for (long long r = 0; r < rows; r++) /* a padded vocabulary's columns: never read */
        for (long long j = V; j < stride; j++) x[(size_t)(off + r * stride + j)] = NAN;
    for (long long j = 0; j < V; j += 3) x[(size_t)(off + 0 * stride + j)] = -inf; /* row 0: some -inf */
    x[(size_t)(off + 1 * stride + V / 2)] = NAN;                                 /* row 1: a NaN */
    x[(size_t)(off + 2 * stride + V - 1)] = inf;                                 /* row 2: a +inf */
    for (long long j = 0; j < V; j++) x[(size_t)(off + 3 * stride + j)] = -inf;  /* row 3: all -inf */
    /* row 4: a +inf early in the row, row 5: -inf for the first columns then values: the classifier
       reads 16 bytes at a time where the rows allow (docs/cuda.md), so these land inside a vector */
    x[(size_t)(off + 4 * stride + 9)] = inf;
    for (long long j = 0; j < V / 2; j++) x[(size_t)(off + 5 * stride + j)] = -inf;
    std::vector<unsigned char> in(n * (bf16 ? 2 : 4));
    for (size_t i = 0; i < n; i++) {
        if (bf16) {
            uint16_t h = bf16_bits(x[i]);
            memcpy(&in[i * 2], &h, 2);
            x[i] = bf16_float(h);
        } else memcpy(&in[i * 4], &x[i], 4);
    }
    std::vector<int> tg((size_t)(toff + rows));
    for (long long r = 0; r < rows; r++) tg[(size_t)(toff + r)] = (int)(uniform() * (double)V) % (int)V;
    tg[(size_t)(toff + 4)] = -1;       /* out of range: the target's logit is column 0, no column is hot */
    tg[(size_t)(toff + 5)] = (int)V;   /* out of range: column V - 1, no column is hot */
    std::vector<int> t(tg.begin() + toff, tg.end());
    std::vector<float> got[2];
    std::vector<unsigned char> grad[2];
    for (int run = 0; run < 2; run++) {
        got[run].assign((size_t)(rows * 3), 12345.0f);
        std::vector<unsigned char> inr = in; /* the classifier in place writes over it */
        if (pgrad >= 0 && pgrad != pin) grad[run].assign((size_t)(rows * gW * (gbf16 ? 2 : 4)), 0xff);
        void *bufs[4] = {NULL, NULL, NULL, NULL};
        bufs[pin] = inr.data();
        bufs[ptgt] = tg.data();
        bufs[pout] = got[run].data();
        if (pgrad >= 0 && pgrad != pin) bufs[pgrad] = grad[run].data();
        void *params[4] = {&bufs[0], &bufs[1], &bufs[2], &bufs[3]};
        long long nb = run == 0 ? blocks : 7;
        unsigned grid[3] = {(unsigned)nb, 1, 1}, block[3] = {256, 1, 1};
        char err[600];
        if (launch(kid, grid, block, params, err, sizeof err)) {
            printf("FAIL ce/%s: the launch on %lld blocks failed: %s\n0 passed, 1 failed\n", name, nb, err);
            return 1;
        }
        if (pgrad == pin) grad[run] = inr;
    }
    int failed = 0, passed = 0;
    char what[200];
    snprintf(what, sizeof what, "ce/%s/%s (rows %lld, V %lld, stride %lld%s%s%s)", name, argv[11], rows, V, stride,
             pgrad < 0 ? "" : pgrad == pin ? ", the gradient over the logits" : ", the gradient",
             pgrad >= 0 && atof(argv[16]) != 1.0 ? ", dloss " : "", pgrad >= 0 && atof(argv[16]) != 1.0 ? argv[16] : "");
    if (memcmp(got[0].data(), got[1].data(), got[0].size() * 4) != 0 || grad[0] != grad[1]) {
        printf("FAIL %s: %lld and 7 blocks give different bytes\n", what, blocks);
        failed++;
    }
    double worst = 0;
    for (long long r = 0; r < rows && !failed; r++) {
        const float *row = &x[(size_t)(off + r * stride)];
        float m = -inf;
        int nan = 0;
        for (long long j = 0; j < V; j++) {
            nan |= row[j] != row[j];
            if (row[j] > m) m = row[j];
        }
        double s = 0;
        for (long long j = 0; j < V; j++)
            if (row[j] != -inf) s += exp((double)row[j] - (double)m);
        long long tc = t[(size_t)r] < 0 ? 0 : t[(size_t)r] >= V ? V - 1 : t[(size_t)r];
        float gm = got[0][(size_t)(3 * r)], gs = got[0][(size_t)(3 * r + 1)], gx = got[0][(size_t)(3 * r + 2)];
        int ok = memcmp(&gx, &row[tc], 4) == 0;
        if (nan) ok &= gm != gm && gs != gs;
        else if (m == inf) ok &= gm == inf && gs != gs;
        else if (m == -inf) ok &= gm == -inf && gs == 0.0f;
        else {
            double e = fabs((double)gs - s) / s;
            if (e > worst) worst = e;
            ok &= gm == m && e <= 1e-5;
        }
        if (!ok) {
            printf("FAIL %s: row %lld: m %.9g s %.9g xt %.9g, want m %.9g s %.9g xt %.9g%s\n", what, r, gm, gs, gx, m, s, row[tc],
                   nan ? " (NaN row)" : "");
            failed++;
        }
    }
    if (!failed) {
        printf("PASS %s: max exact, sum within %.2e of float64 (<= 1e-5), the target's logit exact, NaN/+inf/-inf rows as "
               "specified, %lld and 7 blocks byte-identical\n",
               what, worst, blocks);
        passed++;
    }
    if (pgrad >= 0) {
        std::vector<float> g((size_t)(rows * gW));
        for (size_t i = 0; i < g.size(); i++) {
            if (gbf16) {
                uint16_t h;
                memcpy(&h, &grad[0][i * 2], 2);
                g[i] = bf16_float(h);
            } else memcpy(&g[i], &grad[0][i * 4], 4);
        }
        double gworst = 0, cworst = 0;
        char why[200] = "", cwhy[200] = "";
        long long bad = grad_bad(x, t, g, rows, V, stride, off, gW, gbf16, scale, 1, &gworst, why, sizeof why);
        if (bad) {
            printf("FAIL %s: the gradient: %lld elements off, first %s\n", what, bad, why);
            failed++;
        } else {
            printf("PASS %s: the gradient within %.2e of float64 (<= 1e-5 of (p + onehot) x dloss / N%s), NaN rows NaN, the "
                   "%lld padded columns +0\n",
                   what, gworst, gbf16 ? ", plus half a bf16 ulp" : "", gW - V);
            passed++;
        }
        long long cbad = grad_bad(x, t, g, rows, V, stride, off, gW, gbf16, scale, 0, &cworst, cwhy, sizeof cwhy);
        if (cbad < rows - 5) { /* every ordinary row's target column must be caught (rows 1 to 5 are special) */
            printf("FAIL %s/control: a reference without the one-hot passes but for %lld elements\n", what, cbad);
            failed++;
        } else {
            printf("PASS %s/control: a reference without the one-hot fails (%lld elements)\n", what, cbad);
            passed++;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
