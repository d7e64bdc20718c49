/* test_rt_rng.c - unit tests of runtime/rng.c: Philox4x32 against published known answers, the
 * uniform and normal transforms (moments over 10^6 draws), FNV-1a, streams, keyed permutations,
 * and parameter initialisation's independence from order, chunking and thread count.
 *
 * Build: make build/tests/test_rt_rng (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * Statistical checks use a fixed seed, so they are deterministic; each tolerance is stated as a
 * multiple of the estimator's standard error for n draws (5 sigma unless said otherwise), so a
 * correct generator passes with overwhelming probability for any seed. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "rt.h"
#include "unit.h"

/* ---- Philox known answers ------------------------------------------------------------------------ */

/* The known-answer vectors of the Random123 distribution (D. E. Shaw Research; Salmon et al.,
 * SC'11): github.com/DEShawResearch/random123, file tests/kat_vectors, lines 24-29 at commit
 * 9545ff6413f258be2f04c1d319d99aaef7521150 ("philox4x32 7 ..." and "philox4x32 10 ..."):
 * rounds, counter[4], key[2], expected output[4]. */
static const struct {
    int rounds;
    uint32_t ctr[4], key[2], out[4];
} philox_kat[] = {
    {7, {0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {7,
     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {7,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
    {10, {0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {10,
     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {10,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

static void philox_known_answers(void) {
    for (size_t v = 0; v < sizeof philox_kat / sizeof philox_kat[0]; v++) {
        uint32_t out[4];
        rt_philox4x32_r(philox_kat[v].ctr, philox_kat[v].key, philox_kat[v].rounds, out);
        for (int k = 0; k < 4; k++)
            CHECK(out[k] == philox_kat[v].out[k], "vector %zu (%d rounds) word %d: got %08x, expected %08x", v,
                  philox_kat[v].rounds, k, out[k], philox_kat[v].out[k]);
        if (philox_kat[v].rounds == 10) {
            uint32_t out10[4];
            rt_philox4x32(philox_kat[v].ctr, philox_kat[v].key, out10);
            CHECK(memcmp(out, out10, sizeof out) == 0, "rt_philox4x32 differs from rt_philox4x32_r(10) on vector %zu", v);
        }
    }
}

/* ---- transforms and hashing ----------------------------------------------------------------------- */

static void uniform_f32_is_24_bit(void) {
    CHECK(rt_u01_f32(0) == 0.0f, "0 -> %g", (double)rt_u01_f32(0));
    CHECK(rt_u01_f32(0xFF) == 0.0f, "the low 8 bits are dropped");
    CHECK(rt_u01_f32(0x100) == 0x1p-24f, "0x100 -> %a", (double)rt_u01_f32(0x100));
    CHECK(rt_u01_f32(0xFFFFFFFF) == 1.0f - 0x1p-24f, "max -> %a, expected 1 - 2^-24", (double)rt_u01_f32(0xFFFFFFFF));
    CHECK(rt_u01_f32(0x80000000) == 0.5f, "2^31 -> %g", (double)rt_u01_f32(0x80000000));
    CHECK(rt_u01_f64(0xFFFFFFFF, 0xFFFFFFFF) < 1.0, "f64 max reaches 1");
    CHECK(rt_u01_f64(0xFFFFFFFF, 0xFFFFFFFF) == 1.0 - 0x1p-53, "f64 max is %a", rt_u01_f64(0xFFFFFFFF, 0xFFFFFFFF));
    CHECK(rt_u01_f64(0, 0) == 0.0, "f64 of zeros is not 0");
}

static void fnv1a_known_values(void) {
    /* The FNV-1a 64-bit test values ("", "a", "foobar") published with the FNV algorithm
     * (isthe.com/chongo/tech/comp/fnv), also recomputed independently while writing this test. */
    CHECK(rt_hash_name("") == UINT64_C(0xcbf29ce484222325), "\"\" -> %016llx", (unsigned long long)rt_hash_name(""));
    CHECK(rt_hash_name("a") == UINT64_C(0xaf63dc4c8601ec8c), "\"a\" -> %016llx", (unsigned long long)rt_hash_name("a"));
    CHECK(rt_hash_name("foobar") == UINT64_C(0x85944171f73967e8), "\"foobar\" -> %016llx",
          (unsigned long long)rt_hash_name("foobar"));
}

#define NDRAW 1000000

static void uniform_moments(void) {
    RtRng r;
    rt_rng_init(&r, 1234, RT_RNG_DOMAIN_INIT, 7);
    double sum = 0, sum2 = 0;
    float lo = 1, hi = 0;
    long bins[64] = {0};
    for (int i = 0; i < NDRAW; i++) {
        float u = rt_u01_f32(rt_rng_u32(&r));
        sum += u;
        sum2 += (u - 0.5) * (u - 0.5);
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        bins[(int)(u * 64)]++;
    }
    double mean = sum / NDRAW, var = sum2 / NDRAW;
    /* mean: sd sqrt(1/12/n) = 2.9e-4; variance about 1/2: sd sqrt((1/80 - 1/144)/n) = 7.5e-5 */
    CHECK(fabs(mean - 0.5) < 5 * 2.9e-4, "mean %.6f, expected 0.5 within 1.45e-3", mean);
    CHECK(fabs(var - 1.0 / 12) < 5 * 7.5e-5, "variance %.6f, expected %.6f within 3.7e-4", var, 1.0 / 12);
    CHECK(lo >= 0 && hi < 1, "draws outside [0, 1): min %g max %g", (double)lo, (double)hi);
    double chi2 = 0, e = NDRAW / 64.0;
    for (int b = 0; b < 64; b++) chi2 += (bins[b] - e) * (bins[b] - e) / e;
    /* 63 degrees of freedom: mean 63, sd sqrt(126) = 11.2 */
    CHECK(chi2 < 63 + 5 * 11.2, "chi-square over 64 bins %.1f, expected below 119", chi2);
}

static void normal_moments(void) {
    RtRng r;
    rt_rng_init(&r, 99, RT_RNG_DOMAIN_INIT, 3);
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    long within1 = 0;
    for (int i = 0; i < NDRAW / 2; i++) {
        uint32_t a = rt_rng_u32(&r), b = rt_rng_u32(&r);
        double z[2];
        rt_box_muller(a, b, &z[0], &z[1]);
        for (int k = 0; k < 2; k++) {
            double x = z[k];
            CHECK(isfinite(x), "a normal draw is not finite");
            s1 += x;
            s2 += x * x;
            s3 += x * x * x;
            s4 += x * x * x * x;
            within1 += fabs(x) < 1;
        }
    }
    double n = NDRAW, mean = s1 / n, var = s2 / n - mean * mean, skew = s3 / n, kurt = s4 / n;
    double p1 = (double)within1 / n;
    /* standard errors for n = 10^6: mean 1e-3, variance sqrt(2/n) = 1.41e-3, third moment
     * sqrt(15/n) = 3.9e-3, fourth moment sqrt((105 - 9)/n) = 9.8e-3, P(|z| < 1) 4.7e-4 */
    CHECK(fabs(mean) < 5 * 1e-3, "mean %.5f, expected 0 within 5e-3", mean);
    CHECK(fabs(var - 1) < 5 * 1.41e-3, "variance %.5f, expected 1 within 7.1e-3", var);
    CHECK(fabs(skew) < 5 * 3.9e-3, "third moment %.5f, expected 0 within 0.02", skew);
    CHECK(fabs(kurt - 3) < 5 * 9.8e-3, "fourth moment %.5f, expected 3 within 0.049", kurt);
    CHECK(fabs(p1 - 0.682689) < 5 * 4.7e-4, "P(|z| < 1) = %.5f, expected 0.68269 within 2.4e-3", p1);
}

/* ---- streams -------------------------------------------------------------------------------------- */

static void stream_is_counter_based(void) {
    RtRng r;
    rt_rng_init(&r, 42, RT_RNG_DOMAIN_DATA, 5);
    uint32_t first[10];
    for (int i = 0; i < 10; i++) first[i] = rt_rng_u32(&r);
    /* word 4*b + w is word w of Philox(counter (b, 0, stream), key seed ^ domain << 32) */
    uint64_t k = 42 ^ (RT_RNG_DOMAIN_DATA << 32);
    uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    for (int b = 0; b < 2; b++) {
        uint32_t ctr[4] = {(uint32_t)b, 0, 5, 0}, out[4];
        rt_philox4x32(ctr, key, out);
        for (int w = 0; w < 4; w++) CHECK(first[4 * b + w] == out[w], "word %d of the stream is not Philox's", 4 * b + w);
    }
    /* Copying the struct saves the position exactly. */
    RtRng saved = r;
    uint32_t a = rt_rng_u32(&r), b2 = rt_rng_u32(&r);
    CHECK(rt_rng_u32(&saved) == a && rt_rng_u32(&saved) == b2, "a copied stream does not continue identically");
    /* rt_rng_u64 is two words, the first high. */
    RtRng x, y;
    rt_rng_init(&x, 1, 2, 3);
    rt_rng_init(&y, 1, 2, 3);
    uint64_t hi = rt_rng_u32(&y);
    CHECK(rt_rng_u64(&x) == (hi << 32 | rt_rng_u32(&y)), "u64 is not (first << 32) | second");
}

static void below_is_uniform(void) {
    RtRng r;
    rt_rng_init(&r, 5, RT_RNG_DOMAIN_DATA, 0);
    long c[7] = {0};
    int n = 700000;
    for (int i = 0; i < n; i++) {
        uint64_t v = rt_rng_below(&r, 7);
        CHECK(v < 7, "rt_rng_below(7) gave %llu", (unsigned long long)v);
        if (v < 7) c[v]++;
    }
    double chi2 = 0, e = n / 7.0;
    for (int k = 0; k < 7; k++) chi2 += (c[k] - e) * (c[k] - e) / e;
    CHECK(chi2 < 6 + 5 * 3.47, "chi-square %.1f over 7 values, expected below 23", chi2); /* 6 dof: sd sqrt(12) */
    CHECK(rt_rng_below(&r, 1) == 0, "below(1) is not 0");
    uint64_t big = UINT64_C(0xC000000000000001);
    for (int i = 0; i < 100; i++) CHECK(rt_rng_below(&r, big) < big, "below(big) out of range");
}

/* ---- permutations --------------------------------------------------------------------------------- */

static void perm_is_a_permutation(void) {
    const uint64_t sizes[] = {1, 2, 3, 5, 16, 17, 100, 1000, 4097, 65536};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint64_t n = sizes[s];
        unsigned char *seen = calloc(n, 1);
        RtPerm p;
        rt_perm_init(&p, n, 77, RT_RNG_DOMAIN_DATA, 3, 9);
        int ok = 1;
        uint64_t fixed = 0;
        for (uint64_t i = 0; i < n && ok; i++) {
            uint64_t v = rt_perm_apply(&p, i);
            if (v >= n || seen[v]) ok = 0;
            else seen[v] = 1;
            fixed += v == i;
        }
        CHECK(ok, "n = %llu: not a permutation", (unsigned long long)n);
        if (n >= 100)
            CHECK(fixed < n / 10, "n = %llu: %llu fixed points - not shuffled", (unsigned long long)n, (unsigned long long)fixed);
        free(seen);
    }
}

static void perm_depends_on_key(void) {
    RtPerm a, b, c, a2;
    rt_perm_init(&a, 1000, 1, RT_RNG_DOMAIN_DATA, 0, 0);
    rt_perm_init(&a2, 1000, 1, RT_RNG_DOMAIN_DATA, 0, 0);
    rt_perm_init(&b, 1000, 2, RT_RNG_DOMAIN_DATA, 0, 0);
    rt_perm_init(&c, 1000, 1, RT_RNG_DOMAIN_DATA, 1, 0);
    int same_b = 0, same_c = 0, same_a2 = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t v = rt_perm_apply(&a, i);
        same_a2 += v == rt_perm_apply(&a2, i);
        same_b += v == rt_perm_apply(&b, i);
        same_c += v == rt_perm_apply(&c, i);
    }
    CHECK(same_a2 == 1000, "the same key gives a different permutation");
    CHECK(same_b < 20, "another seed gives nearly the same permutation (%d equal)", same_b);
    CHECK(same_c < 20, "another tweak gives nearly the same permutation (%d equal)", same_c);
}

/* ---- parameter initialisation --------------------------------------------------------------------- */

typedef struct Param {
    const char *name;
    int64_t n;
    RtInitKind kind;
    double a, b;
} Param;

static const Param params[] = {
    {"wte", 1001, RT_INIT_NORMAL, 0, 0.02},
    {"h.0.attn.c_attn.weight", 777, RT_INIT_UNIFORM, -0.1, 0.1},
    {"h.0.ln_1.weight", 33, RT_INIT_ONES, 0, 0},
    {"lm_head.bias", 50, RT_INIT_CONSTANT, 0.25, 0},
    {"model.layers.3.mlp.gate_proj.weight", 4099, RT_INIT_NORMAL, 1.5, 3.0},
};
#define NPARAM (int)(sizeof params / sizeof params[0])

static float *fill_whole(const Param *p, uint64_t seed) {
    float *v = malloc((size_t)p->n * sizeof *v);
    RtError e;
    RtStatus st = rt_init_param(v, p->n, seed, p->name, p->kind, p->a, p->b, &e);
    CHECK(st == RT_OK, "init %s: %s", p->name, e.msg);
    return v;
}

static void init_order_and_chunking(void) {
    float *ref[NPARAM];
    for (int i = 0; i < NPARAM; i++) ref[i] = fill_whole(&params[i], 1337);
    /* Reverse order, in chunks of awkward sizes (not multiples of 4, crossing block boundaries). */
    static const int64_t chunks[] = {1, 3, 7, 2, 5, 11, 13, 6};
    for (int i = NPARAM - 1; i >= 0; i--) {
        const Param *p = &params[i];
        float *v = malloc((size_t)p->n * sizeof *v);
        int64_t at = 0;
        for (int c = 0; at < p->n; c++) {
            int64_t end = at + chunks[c % 8] > p->n ? p->n : at + chunks[c % 8];
            RtError e;
            CHECK(rt_init_param_range(v + at, at, end, 1337, rt_hash_name(p->name), p->kind, p->a, p->b, &e) == RT_OK,
                  "chunk: %s", e.msg);
            at = end;
        }
        CHECK(memcmp(v, ref[i], (size_t)p->n * sizeof *v) == 0, "%s: chunked fill in another order differs", p->name);
        free(v);
    }
    for (int i = 0; i < NPARAM; i++) free(ref[i]);
}

typedef struct Job {
    float *dst;
    int64_t begin, end;
    const Param *p;
    RtStatus st;
} Job;

static void *fill_job(void *arg) {
    Job *j = arg;
    /* Each thread fills every 4th chunk of 97 elements: interleaved, out of order. */
    for (int64_t at = j->begin; at < j->p->n; at += 4 * 97) {
        int64_t end = at + 97 > j->p->n ? j->p->n : at + 97;
        RtStatus st =
            rt_init_param_range(j->dst + at, at, end, 1337, rt_hash_name(j->p->name), j->p->kind, j->p->a, j->p->b, NULL);
        if (st != RT_OK) j->st = st;
    }
    return NULL;
}

static void init_thread_count(void) {
    const Param *p = &params[4];
    float *ref = fill_whole(p, 1337);
    float *v = calloc((size_t)p->n, sizeof *v);
    pthread_t th[4];
    Job jobs[4];
    for (int t = 3; t >= 0; t--) {
        jobs[t] = (Job){v, (int64_t)t * 97, p->n, p, RT_OK};
        CHECK(pthread_create(&th[t], NULL, fill_job, &jobs[t]) == 0, "pthread_create failed");
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].st == RT_OK, "thread %d failed", t);
    }
    CHECK(memcmp(v, ref, (size_t)p->n * sizeof *v) == 0, "4 threads fill differently from one");
    free(v);
    free(ref);
}

static void init_values(void) {
    RtError e;
    int64_t n = 1000000;
    float *v = malloc((size_t)n * sizeof *v);
    CHECK(rt_init_param(v, n, 7, "w", RT_INIT_NORMAL, 0.5, 0.02, &e) == RT_OK, "%s", e.msg);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    double mean = s / n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - mean) * (v[i] - mean);
    double sd = sqrt(s2 / n);
    /* mean: sd 0.02/sqrt(n) = 2e-5; sd: 0.02/sqrt(2n) = 1.4e-5 */
    CHECK(fabs(mean - 0.5) < 1e-4, "normal(0.5, 0.02): mean %.6f", mean);
    CHECK(fabs(sd - 0.02) < 7e-5, "normal(0.5, 0.02): sd %.6f", sd);
    CHECK(rt_init_param(v, n, 7, "w", RT_INIT_UNIFORM, -0.1, 0.3, &e) == RT_OK, "%s", e.msg);
    s = 0;
    float lo = 1, hi = -1;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    CHECK(lo >= -0.1f && hi < 0.3f, "uniform(-0.1, 0.3) drew outside: [%g, %g]", (double)lo, (double)hi);
    CHECK(fabs(s / n - 0.1) < 5 * 0.4 / sqrt(12.0 * n), "uniform(-0.1, 0.3): mean %.6f", s / n);
    CHECK(rt_init_param(v, 10, 7, "w", RT_INIT_CONSTANT, 0.25, 0, &e) == RT_OK && v[0] == 0.25f && v[9] == 0.25f, "constant");
    CHECK(rt_init_param(v, 10, 7, "w", RT_INIT_ZEROS, 0, 0, &e) == RT_OK && v[0] == 0 && v[9] == 0, "zeros");
    CHECK(rt_init_param(v, 10, 7, "w", RT_INIT_ONES, 0, 0, &e) == RT_OK && v[0] == 1 && v[9] == 1, "ones");
    CHECK(rt_init_param(v, 10, 7, "w", RT_INIT_UNIFORM, 2, 2, &e) == RT_OK && v[0] == 2 && v[9] == 2, "uniform(2, 2)");
    CHECK(rt_init_param(v, 0, 7, "w", RT_INIT_NORMAL, 0, 1, &e) == RT_OK, "an empty parameter is an error");
    free(v);
}

static void init_layout(void) {
    /* Element i is word i % 4 of Philox(counter (i / 4, 0, hash lo, hash hi), key seed ^ "init" << 32):
     * pinned here because checkpoints and bit-exact reruns depend on it. */
    float v[12];
    RtError e;
    CHECK(rt_init_param(v, 12, 1337, "wpe", RT_INIT_UNIFORM, 0, 1, &e) == RT_OK, "%s", e.msg);
    uint64_t h = rt_hash_name("wpe"), k = 1337 ^ (RT_RNG_DOMAIN_INIT << 32);
    uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    for (int i = 0; i < 12; i++) {
        uint32_t ctr[4] = {(uint32_t)(i / 4), 0, (uint32_t)h, (uint32_t)(h >> 32)}, out[4];
        rt_philox4x32(ctr, key, out);
        CHECK(v[i] == rt_u01_f32(out[i % 4]), "element %d is not the documented draw", i);
    }
    float z[4];
    CHECK(rt_init_param(z, 4, 1337, "wpe", RT_INIT_NORMAL, 0, 1, &e) == RT_OK, "%s", e.msg);
    uint32_t ctr[4] = {0, 0, (uint32_t)h, (uint32_t)(h >> 32)}, out[4];
    rt_philox4x32(ctr, key, out);
    double n0, n1, n2, n3;
    rt_box_muller(out[0], out[1], &n0, &n1);
    rt_box_muller(out[2], out[3], &n2, &n3);
    CHECK(z[0] == (float)n0 && z[1] == (float)n1 && z[2] == (float)n2 && z[3] == (float)n3,
          "normals are not Box-Muller of words (0,1), (2,3)");
    /* Another seed or another name gives other values. */
    float w[12];
    CHECK(rt_init_param(w, 12, 1338, "wpe", RT_INIT_UNIFORM, 0, 1, &e) == RT_OK && memcmp(v, w, sizeof v) != 0,
          "the seed does not matter");
    CHECK(rt_init_param(w, 12, 1337, "wte", RT_INIT_UNIFORM, 0, 1, &e) == RT_OK && memcmp(v, w, sizeof v) != 0,
          "the name does not matter");
}

static void init_errors(void) {
    float v[4];
    RtError e;
    CHECK(rt_init_param(v, 4, 1, "w", RT_INIT_NORMAL, 0, -1, &e) == RT_ERR_ARG, "negative std accepted");
    CHECK_STR(e.msg, "cannot initialise parameter 'w': normal(0, -1): the standard deviation is negative", "message");
    CHECK(rt_init_param(v, 4, 1, "w", RT_INIT_UNIFORM, 1, 0, &e) == RT_ERR_ARG, "reversed uniform accepted");
    CHECK_STR(e.msg, "cannot initialise parameter 'w': uniform(1, 0): the upper bound is below the lower", "message");
    CHECK(rt_init_param(v, -1, 1, "w", RT_INIT_ZEROS, 0, 0, &e) == RT_ERR_ARG, "negative size accepted");
    CHECK_STR(e.msg, "cannot initialise parameter 'w': -1 elements", "message");
    CHECK(rt_init_param(v, 4, 1, "w", (RtInitKind)99, 0, 0, &e) == RT_ERR_ARG, "unknown kind accepted");
    CHECK_STR(e.msg, "cannot initialise parameter 'w': unknown initialiser kind 99", "message");
    CHECK(rt_init_param(v, 4, 1, "w", RT_INIT_CONSTANT, NAN, 0, &e) == RT_ERR_ARG, "NaN constant accepted");
}

static void error_buffer(void) {
    RtError e;
    rt_error_clear(&e);
    CHECK(e.code == RT_OK && e.msg[0] == 0, "clear");
    CHECK(rt_fail_errno(&e, ENOENT, "cannot open data shard '%s'", "x.bin") == RT_ERR_IO, "errno status");
    CHECK_STR(e.msg, "cannot open data shard 'x.bin': No such file or directory", "errno message");
    rt_error_context(&e, "step %d", 3);
    CHECK_STR(e.msg, "step 3: cannot open data shard 'x.bin': No such file or directory", "context");
    CHECK(rt_fail_errno(&e, ENOMEM, "x") == RT_ERR_NOMEM, "ENOMEM is RT_ERR_NOMEM");
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    rt_fail(&e, RT_ERR_FORMAT, "%s", big);
    CHECK(strlen(e.msg) == RT_ERROR_MAX - 1 && strcmp(e.msg + RT_ERROR_MAX - 4, "...") == 0,
          "a long message is not cut with ...");
    CHECK(rt_fail(NULL, RT_ERR_ARG, "nobody listens") == RT_ERR_ARG, "a NULL buffer");
    CHECK_STR(rt_status_name(RT_ERR_FORMAT), "bad format", "status name");
}

/* error-message-newline-in-argument: an argument (or a file name) holding a newline or another
 * control character is quoted on one line (found by fuzz_cli: `prog $'a\nb'`). */
static void error_message_newline_in_argument(void) {
    RtError e;
    rt_fail(&e, RT_ERR_ARG, "unknown command '%s'", "tr\nain\r\x1b[2J\x7f");
    CHECK_STR(e.msg, "unknown command 'tr?ain??[2J?'", "a control character kept in a message");
    rt_fail_errno(&e, ENOENT, "cannot open '%s'", "a\nb");
    CHECK_STR(e.msg, "cannot open 'a?b': No such file or directory", "errno message");
    rt_error_context(&e, "file '%s'", "c\td");
    CHECK_STR(e.msg, "file 'c?d': cannot open 'a?b': No such file or directory", "context");
}

int main(void) {
    RUN(philox_known_answers);
    RUN(uniform_f32_is_24_bit);
    RUN(fnv1a_known_values);
    RUN(uniform_moments);
    RUN(normal_moments);
    RUN(stream_is_counter_based);
    RUN(below_is_uniform);
    RUN(perm_is_a_permutation);
    RUN(perm_depends_on_key);
    RUN(init_order_and_chunking);
    RUN(init_thread_count);
    RUN(init_values);
    RUN(init_layout);
    RUN(init_errors);
    RUN(error_buffer);
    RUN(error_message_newline_in_argument);
    return unit_finish();
}
