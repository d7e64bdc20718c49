/* scatter_check.cc - the segmented scatter_add (the deterministic embedding backward: compiler/backend/
 * cuda/cuda.c, CUDA_SCATTER mode) against its definition, bit for bit, on the emulated GPU.
 * tests/cudaemu/check_scatter.sh builds a program's kernels (mbtc --emit=cuda) into a shared object
 * with tests/cudaemu/build.sh and runs this on one scatter kernel of it:
 *
 *   scatter_check KERNELS.so NAME NPARAMS OUT IDX UPD R W P DT UPD_DT IDX_OFF UPD_OFF BLOCKS
 *
 * (the parameters and sizes as `mbtc --emit=kernels` prints the kernel's `scatter_add:` line, BLOCKS
 * the launch's blocks as the CUDA header says; DT and UPD_DT f32 or bf16). The definition is
 * ref_bwd.c's ref_scatter_add in the kernel's types, which is also the kernel body the CPU runs:
 * out = 0, then for p = 0 .. P-1 in order out[clamp(idx[p], 0, R - 1)] += upd[p], each sum rounded to
 * DT. For each pattern of indices - drawn from a few rows (many repeats in one block), all one row
 * (the last, short group), and with indices out of range (clamped) - the kernel runs on an output
 * filled with NaNs, at the header's block count and at 7 blocks (the grid-stride loop), and both
 * results must equal the definition byte for byte. The definition in reverse order must differ
 * from it for the repeated-rows pattern, or the check could not see a wrong order.
 * Prints `PASS name` / `FAIL name: why` lines and `N passed, M failed`; exit status 1 on a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "check_harness.h"

static int passed, failed;

struct Shape {
    long long R, W, P, idx_off, upd_off;
    int bf16_out, bf16_upd;
};

static float get(const std::vector<unsigned char> &buf, int bf16, long long i) {
    if (bf16) {
        uint16_t h;
        memcpy(&h, &buf[(size_t)i * 2], 2);
        return bf16_float(h);
    }
    float x;
    memcpy(&x, &buf[(size_t)i * 4], 4);
    return x;
}
static void put(std::vector<unsigned char> &buf, int bf16, long long i, float x) {
    if (bf16) {
        uint16_t h = bf16_bits(x);
        memcpy(&buf[(size_t)i * 2], &h, 2);
    } else memcpy(&buf[(size_t)i * 4], &x, 4);
}

/* the definition, positions in order (reverse = 1: the other way round) */
static std::vector<unsigned char> reference(const Shape &s, const std::vector<int> &idx, const std::vector<unsigned char> &upd,
                                            int reverse) {
    std::vector<unsigned char> out((size_t)(s.R * s.W) * (s.bf16_out ? 2 : 4), 0);
    for (long long i = 0; i < s.P; i++) {
        long long p = reverse ? s.P - 1 - i : i, r = idx[(size_t)(s.idx_off + p)];
        r = r < 0 ? 0 : r > s.R - 1 ? s.R - 1 : r;
        for (long long c = 0; c < s.W; c++) {
            float sum = get(out, s.bf16_out, r * s.W + c) + get(upd, s.bf16_upd, s.upd_off + p * s.W + c);
            put(out, s.bf16_out, r * s.W + c, sum);
        }
    }
    return out;
}

static unsigned long long rng = 0x9e3779b97f4a7c15ULL;
static unsigned long long next() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc != 15) {
        fprintf(stderr, "usage: scatter_check KERNELS.so NAME NPARAMS OUT IDX UPD R W P DT UPD_DT IDX_OFF UPD_OFF BLOCKS\n");
        return 2;
    }
    LaunchFn launch;
    const char *name = argv[2];
    int kid = emu_kernel(argv[1], name, "scatter", &launch);
    if (kid < 0) return 1;
    int nparams = atoi(argv[3]), pout = atoi(argv[4]), pidx = atoi(argv[5]), pupd = atoi(argv[6]);
    Shape s = {atoll(argv[7]), atoll(argv[8]), atoll(argv[9]), atoll(argv[12]), atoll(argv[13]), strcmp(argv[10], "bf16") == 0,
               strcmp(argv[11], "bf16") == 0};
    long long blocks = atoll(argv[14]);
    if (nparams != 3 || pout < 0 || pidx < 0 || pupd < 0 || pout >= 3 || pidx >= 3 || pupd >= 3 || s.R < 2 || s.P < 1) {
        printf("FAIL scatter/setup: unexpected parameters\n0 passed, 1 failed\n");
        return 1;
    }
    std::vector<unsigned char> upd((size_t)(s.upd_off + s.P * s.W) * (s.bf16_upd ? 2 : 4));
    for (long long i = 0; i < s.upd_off + s.P * s.W; i++) { /* magnitudes over 2^-12 .. 2^12: the order of sums shows */
        double m = (double)(next() % 1000000) / 1000000.0, e = (double)(next() % 25) - 12.0;
        put(upd, s.bf16_upd, i, (float)((next() & 1 ? -1 : 1) * (0.5 + m) * ldexp(1.0, (int)e)));
    }
    const char *patterns[] = {"repeated-rows", "one-row", "out-of-range"};
    for (int pat = 0; pat < 3; pat++) {
        std::vector<int> idx((size_t)(s.idx_off + s.P));
        long long few[40];
        for (int i = 0; i < 40; i++) few[i] = (long long)(next() % (unsigned long long)s.R);
        for (long long p = 0; p < s.idx_off + s.P; p++) {
            if (pat == 0) idx[(size_t)p] = (int)(next() % 4 ? few[next() % 40] : (long long)(next() % (unsigned long long)s.R));
            else if (pat == 1) idx[(size_t)p] = (int)(s.R - 1);
            else {
                long long v = (long long)(next() % 5);
                idx[(size_t)p] = v == 0 ? -1 - (int)(next() % 7) : v == 1 ? (int)(s.R + (long long)(next() % 100)) : (int)(next() % s.R);
            }
        }
        std::vector<unsigned char> want = reference(s, idx, upd, 0);
        char what[160];
        snprintf(what, sizeof what, "scatter/%s/%s-%s/%s", name, argv[10], argv[11], patterns[pat]);
        if (pat == 0 && reference(s, idx, upd, 1) == want) {
            printf("FAIL %s: the definition in reverse order gives the same bytes: this check cannot see the order\n", what);
            failed++;
            continue;
        }
        std::vector<unsigned char> got[2];
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            got[run].assign(want.size(), 0xff); /* NaNs: every element must be written */
            void *bufs[3];
            bufs[pout] = got[run].data();
            bufs[pidx] = idx.data();
            bufs[pupd] = upd.data();
            void *params[3] = {&bufs[0], &bufs[1], &bufs[2]};
            long long nb = run == 0 ? blocks : 7;
            unsigned grid[3] = {(unsigned)nb, 1, 1}, block[3] = {256, 1, 1};
            char err[600];
            if (launch(kid, grid, block, params, err, sizeof err)) {
                printf("FAIL %s: the launch on %lld blocks failed: %s\n", what, nb, err);
                ok = 0;
                break;
            }
            if (got[run] != want) {
                long long n = (long long)want.size() / (s.bf16_out ? 2 : 4), bad = 0, first = -1;
                for (long long i = 0; i < n; i++) {
                    float a = get(want, s.bf16_out, i), b = get(got[run], s.bf16_out, i);
                    if (memcmp(&a, &b, 4) != 0) bad++, first = first < 0 ? i : first;
                }
                printf("FAIL %s: on %lld blocks %lld of %lld elements differ from the definition (first: row %lld, column "
                       "%lld: %.9g, want %.9g)\n",
                       what, nb, bad, n, first / s.W, first % s.W, get(got[run], s.bf16_out, first), get(want, s.bf16_out, first));
                ok = 0;
            }
        }
        if (ok) {
            printf("PASS %s (R %lld, W %lld, P %lld; %lld and 7 blocks: byte-identical to the definition)\n", what, s.R, s.W, s.P,
                   blocks);
            passed++;
        } else failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
