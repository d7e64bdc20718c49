/* rng.c - counter-based random numbers for the runtime (see rt.h): Philox4x32-10, uniform floats,
 * Box-Muller normals, parameter initialisation and keyed permutations.
 *
 * Pipeline position: under parameter initialisation (rt_init_param), data shuffling (data.c's
 * window order is an RtPerm) and tools/gendata.c; later dropout and sampling. Everything is a
 * pure function of (key, counter), so a value never depends on which thread computed it, in
 * which order, or whether the run was interrupted and resumed: that is what makes resumed and
 * resharded runs draw exactly the numbers an uninterrupted run would have drawn.
 *
 * Philox4x32 is written from the description in Salmon, Moraes, Dror and Shaw, "Parallel Random
 * Numbers: As Easy as 1, 2, 3" (SC'11): a 4-word counter and a 2-word key; each round multiplies
 * words 0 and 2 by two constants, keeps the high and low halves of the 64-bit products and
 * XORs the high halves with the other two words and the key; the key is bumped by two Weyl
 * constants (the golden ratio and sqrt(3)-1 in 32-bit fixed point) between rounds.
 * tests/unit/test_rt_rng.c checks it against the Random123 distribution's known answers. */
#include <math.h>
#include <string.h>

#include "rt.h"

/* ---- Philox4x32 ------------------------------------------------------------------------------ */

#define RT_PHILOX_M0 UINT32_C(0xD2511F53) /* multipliers of words 0 and 2 */
#define RT_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define RT_PHILOX_W0 UINT32_C(0x9E3779B9) /* key bumps: golden ratio, sqrt(3) - 1 */
#define RT_PHILOX_W1 UINT32_C(0xBB67AE85)

static inline void rt_philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)RT_PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)RT_PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0];
    uint32_t n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void rt_philox4x32_r(const uint32_t ctr[4], const uint32_t key[2], int rounds, uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < rounds; r++) {
        if (r > 0) {
            k[0] += RT_PHILOX_W0;
            k[1] += RT_PHILOX_W1;
        }
        rt_philox_round(c, k);
    }
    memcpy(out, c, sizeof c);
}

void rt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) { rt_philox4x32_r(ctr, key, 10, out); }

/* ---- uniforms, normals, hashing ----------------------------------------------------------------- */

float rt_u01_f32(uint32_t bits) {
    /* 24 bits fill a float's mantissa exactly: 2^24 equally spaced values, 0 included, 1 not. */
    return (float)(bits >> 8) * 0x1p-24f;
}

double rt_u01_f64(uint32_t hi, uint32_t lo) {
    uint64_t m = ((uint64_t)hi << 21) | (lo >> 11); /* 53 bits */
    return (double)m * 0x1p-53;
}

void rt_box_muller(uint32_t a, uint32_t b, double *z0, double *z1) {
    /* u1 in (0, 1] keeps log() finite; with 32 bits the radius reaches sqrt(64 ln 2) = 6.66. */
    double u1 = ((double)a + 1.0) * 0x1p-32;
    double u2 = (double)b * 0x1p-32;
    double r = sqrt(-2.0 * log(u1));
    double t = 6.283185307179586476925286766559 * u2;
    *z0 = r * cos(t);
    *z1 = r * sin(t);
}

uint64_t rt_hash_name(const char *name) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static void rt_key_of(uint32_t key[2], uint64_t seed, uint64_t domain) {
    uint64_t k = seed ^ (domain << 32);
    key[0] = (uint32_t)k;
    key[1] = (uint32_t)(k >> 32);
}

/* ---- streams ----------------------------------------------------------------------------------- */

void rt_rng_init(RtRng *r, uint64_t seed, uint64_t domain, uint64_t stream) {
    rt_key_of(r->key, seed, domain);
    r->stream = stream;
    r->block = 0;
    memset(r->out, 0, sizeof r->out);
    r->used = 4;
}

uint32_t rt_rng_u32(RtRng *r) {
    if (r->used >= 4) {
        uint32_t ctr[4] = {(uint32_t)r->block, (uint32_t)(r->block >> 32), (uint32_t)r->stream, (uint32_t)(r->stream >> 32)};
        rt_philox4x32(ctr, r->key, r->out);
        r->block++;
        r->used = 0;
    }
    return r->out[r->used++];
}

uint64_t rt_rng_u64(RtRng *r) {
    uint64_t hi = rt_rng_u32(r);
    return (hi << 32) | rt_rng_u32(r);
}

double rt_rng_f64(RtRng *r) {
    uint32_t hi = rt_rng_u32(r);
    return rt_u01_f64(hi, rt_rng_u32(r));
}

uint64_t rt_rng_below(RtRng *r, uint64_t n) {
    if (n <= 1) return 0;
    /* Reject the lowest 2^64 mod n values so every residue is equally likely. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = rt_rng_u64(r);
        if (x >= threshold) return x % n;
    }
}

/* ---- parameter initialisation ------------------------------------------------------------------- */

RtStatus rt_init_param_range(float *dst, int64_t begin, int64_t end, uint64_t seed, uint64_t name_hash, RtInitKind kind, double a,
                             double b, RtError *err) {
    if (begin < 0 || end < begin)
        return rt_fail(err, RT_ERR_ARG, "cannot initialise elements [%lld, %lld): not a range", (long long)begin, (long long)end);
    if (end > begin && !dst) return rt_fail(err, RT_ERR_ARG, "cannot initialise a parameter: no destination");
    switch (kind) {
    case RT_INIT_ZEROS:
    case RT_INIT_ONES: break;
    case RT_INIT_CONSTANT:
        if (!isfinite(a)) return rt_fail(err, RT_ERR_ARG, "constant(%g): the value is not finite", a);
        break;
    case RT_INIT_NORMAL:
        if (!isfinite(a) || !isfinite(b)) return rt_fail(err, RT_ERR_ARG, "normal(%g, %g): not finite", a, b);
        if (b < 0) return rt_fail(err, RT_ERR_ARG, "normal(%g, %g): the standard deviation is negative", a, b);
        break;
    case RT_INIT_UNIFORM:
        if (!isfinite(a) || !isfinite(b)) return rt_fail(err, RT_ERR_ARG, "uniform(%g, %g): not finite", a, b);
        if (b < a) return rt_fail(err, RT_ERR_ARG, "uniform(%g, %g): the upper bound is below the lower", a, b);
        break;
    default: return rt_fail(err, RT_ERR_ARG, "unknown initialiser kind %d", (int)kind);
    }
    if (kind == RT_INIT_ZEROS || kind == RT_INIT_ONES || kind == RT_INIT_CONSTANT) {
        float v = kind == RT_INIT_ZEROS ? 0.0f : kind == RT_INIT_ONES ? 1.0f : (float)a;
        for (int64_t i = begin; i < end; i++) dst[i - begin] = v;
        return RT_OK;
    }
    uint32_t key[2];
    rt_key_of(key, seed, RT_RNG_DOMAIN_INIT);
    float hi = (float)b;
    uint32_t words[4];
    int64_t have = -1; /* the block words[] holds */
    double z[4];
    for (int64_t i = begin; i < end; i++) {
        int64_t blk = i >> 2;
        if (blk != have) {
            uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)((uint64_t)blk >> 32), (uint32_t)name_hash, (uint32_t)(name_hash >> 32)};
            rt_philox4x32(ctr, key, words);
            if (kind == RT_INIT_NORMAL) {
                rt_box_muller(words[0], words[1], &z[0], &z[1]);
                rt_box_muller(words[2], words[3], &z[2], &z[3]);
            }
            have = blk;
        }
        int w = (int)(i & 3);
        float v;
        if (kind == RT_INIT_NORMAL) {
            v = (float)(a + b * z[w]);
        } else {
            v = (float)(a + (b - a) * (double)rt_u01_f32(words[w]));
            /* Rounding to float may reach the upper bound; the interval is half-open. */
            if (b > a && (double)v >= b) v = nextafterf(hi, -INFINITY);
            if ((double)v < a) v = (float)a;
        }
        dst[i - begin] = v;
    }
    return RT_OK;
}

RtStatus rt_init_param(float *dst, int64_t n, uint64_t seed, const char *name, RtInitKind kind, double a, double b,
                       RtError *err) {
    if (n < 0)
        return rt_fail(err, RT_ERR_ARG, "cannot initialise parameter '%s': %lld elements", name ? name : "?", (long long)n);
    if (!name) return rt_fail(err, RT_ERR_ARG, "cannot initialise a parameter without a name");
    RtStatus st = rt_init_param_range(dst, 0, n, seed, rt_hash_name(name), kind, a, b, err);
    if (st != RT_OK) rt_error_context(err, "cannot initialise parameter '%s'", name);
    return st;
}

/* ---- keyed permutations ------------------------------------------------------------------------- */

#define RT_PERM_ROUNDS 6

void rt_perm_init(RtPerm *p, uint64_t n, uint64_t seed, uint64_t domain, uint32_t tweak0, uint32_t tweak1) {
    p->n = n;
    int bits = 0;
    while (bits < 64 && (UINT64_C(1) << bits) < n) bits++;
    p->half_bits = bits < 2 ? 1 : (bits + 1) / 2;
    rt_key_of(p->key, seed, domain);
    p->tweak[0] = tweak0;
    p->tweak[1] = tweak1;
}

/* One pass of the Feistel network over 2 * half_bits bits: a bijection of that domain. */
static uint64_t rt_feistel(const RtPerm *p, uint64_t x) {
    int h = p->half_bits;
    uint64_t mask = h >= 32 ? UINT64_C(0xFFFFFFFF) : (UINT64_C(1) << h) - 1;
    uint64_t l = (x >> h) & mask, r = x & mask;
    for (uint32_t round = 0; round < RT_PERM_ROUNDS; round++) {
        uint32_t ctr[4] = {(uint32_t)r, round, p->tweak[0], p->tweak[1]};
        uint32_t out[4];
        rt_philox4x32(ctr, p->key, out);
        uint64_t f = out[0] & mask;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
    }
    return (l << h) | r;
}

uint64_t rt_perm_apply(const RtPerm *p, uint64_t i) {
    if (p->n <= 1) return 0;
    /* Cycle walking: the network permutes a domain of at most 4n values; stepping along the
     * cycle of i until the value falls below n restricts it to a permutation of [0, n). */
    uint64_t y = rt_feistel(p, i);
    while (y >= p->n) y = rt_feistel(p, y);
    return y;
}
