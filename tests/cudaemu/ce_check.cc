/* ce_check.cc - the online cross-entropy statistics kernel (compiler/backend/cuda/cuda.c,
 * CUDA_CE_STATS: each row's max m and sum s of exp(x - m) in one pass) against a float64 reference,
 * on the emulated GPU. tests/cudaemu/check_ce.sh builds a program's kernels (mbtc --emit=cuda) into a
 * shared object with tests/cudaemu/build.sh and runs this on its statistics kernel:
 *
 *   ce_check KERNELS.so NAME IN OUT ROWS V STRIDE IN_OFF IN_DT BLOCKS
 *
 * (as `mbtc --emit=kernels` prints the kernel's `ce_stats:` line; IN_DT f32 or bf16). Rows of
 * random logits (a standard deviation of 8: the running max moves often, so the rescaling is
 * exercised), plus special rows: some -inf entries (they add nothing), one NaN (m and s NaN), one
 * +inf (m = inf, s NaN, as the CPU's exp(inf - inf)), all -inf (m = -inf, s = 0). Checked:
 *   m   equal to the row's max (a max is exact)
 *   s   within 1e-5 relative of the float64 sum of exp(x - m) over the same (rounded) inputs: each
 *       thread adds ~V/256 terms and the tree 256 more, each with a few ulps (2^-24) of rounding
 *       and expf's 1-2 ulps
 * and the launch at the header's block count and at 7 blocks byte-identical (a fixed tree per row).
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

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: ce_check KERNELS.so NAME IN OUT ROWS V STRIDE IN_OFF IN_DT BLOCKS\n");
        return 2;
    }
    LaunchFn launch;
    const char *name = argv[2];
    int kid = emu_kernel(argv[1], name, "ce", &launch);
    if (kid < 0) return 1;
    int pin = atoi(argv[3]), pout = atoi(argv[4]), bf16 = strcmp(argv[9], "bf16") == 0;
    long long rows = atoll(argv[5]), V = atoll(argv[6]), stride = atoll(argv[7]), off = atoll(argv[8]), blocks = atoll(argv[10]);
    if (pin < 0 || pin > 1 || pout != 1 - pin || rows < 5 || V < 2 || stride < V) {
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
    for (long long j = 0; j < V; j += 3) x[(size_t)(off + 0 * stride + j)] = -inf; /* row 0: some -inf */
    x[(size_t)(off + 1 * stride + V / 2)] = NAN;                                 /* row 1: a NaN */
    x[(size_t)(off + 2 * stride + V - 1)] = inf;                                 /* row 2: a +inf */
    for (long long j = 0; j < V; j++) x[(size_t)(off + 3 * stride + j)] = -inf;  /* row 3: all -inf */
    std::vector<unsigned char> in(n * (bf16 ? 2 : 4));
    for (size_t i = 0; i < n; i++) {
        if (bf16) {
            uint16_t h = bf16_bits(x[i]);
            memcpy(&in[i * 2], &h, 2);
            x[i] = bf16_float(h);
        } else memcpy(&in[i * 4], &x[i], 4);
    }
    std::vector<float> got[2];
    for (int run = 0; run < 2; run++) {
        got[run].assign((size_t)(rows * 2), 12345.0f);
        void *bufs[2];
        bufs[pin] = in.data();
        bufs[pout] = got[run].data();
        void *params[2] = {&bufs[0], &bufs[1]};
        long long nb = run == 0 ? blocks : 7;
        unsigned grid[3] = {(unsigned)nb, 1, 1}, block[3] = {256, 1, 1};
        char err[600];
        if (launch(kid, grid, block, params, err, sizeof err)) {
            printf("FAIL ce/%s: the launch on %lld blocks failed: %s\n0 passed, 1 failed\n", name, nb, err);
            return 1;
        }
    }
    int failed = 0;
    char what[160];
    snprintf(what, sizeof what, "ce/%s/%s (rows %lld, V %lld)", name, argv[9], rows, V);
    if (memcmp(got[0].data(), got[1].data(), got[0].size() * 4) != 0) {
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
        float gm = got[0][(size_t)(2 * r)], gs = got[0][(size_t)(2 * r + 1)];
        int ok;
        if (nan) ok = gm != gm && gs != gs;
        else if (m == inf) ok = gm == inf && gs != gs;
        else if (m == -inf) ok = gm == -inf && gs == 0.0f;
        else {
            double e = fabs((double)gs - s) / s;
            if (e > worst) worst = e;
            ok = gm == m && e <= 1e-5;
        }
        if (!ok) {
            printf("FAIL %s: row %lld: m %.9g s %.9g, want m %.9g s %.9g%s\n", what, r, gm, gs, m, s, nan ? " (NaN row)" : "");
            failed++;
        }
    }
    if (!failed)
        printf("PASS %s: max exact, sum within %.2e of float64 (<= 1e-5), NaN/+inf/-inf rows as specified, %lld and 7 blocks "
               "byte-identical\n",
               what, worst, blocks);
    printf("%d passed, %d failed\n", failed ? 0 : 1, failed ? 1 : 0);
    return failed ? 1 : 0;
}
