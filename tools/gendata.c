/* gendata.c - mbt-gendata: writes a synthetic token corpus whose entropy rate is known exactly,
 * for the demo and the end-to-end training tests (see docs/runtime.md).
 *
 * Pipeline position: a tool beside the compiler, built on libmbtrt (the Philox RNG and the
 * llm.c shard writer). It writes <out-dir>/<name>_train.bin and <name>_val.bin, which a program
 * reads with `data = tokens("data/tiny_train.bin", seq = 64, val = "data/tiny_val.bin")`.
 *
 * The process is an order-2 Markov chain over a vocabulary of V tokens: the next token depends on
 * the previous two. Each of the V^2 contexts has `branch` distinct likely successors with peaked
 * random weights, mixed with a small uniform floor (`noise` spread over all V tokens):
 *
 *     P(c | a, b) = (1 - noise) * q_ab(c) + noise / V
 *
 * The floor makes every transition possible, so the chain on pairs is irreducible and aperiodic
 * and has one stationary distribution pi, found by power iteration. The entropy rate - the lowest
 * cross-entropy any model can reach on this data, in nats per token - is then exact:
 *
 *     H = sum over contexts (a, b) of pi(a, b) * H(P(. | a, b))
 *
 * As a check the tool also prints the sample's own average -log P(x_t | x_t-2, x_t-1) under the
 * true chain, which converges to H as the sample grows. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt.h"

/* ---- options ---------------------------------------------------------------------------------- */

typedef struct Opts {
    int64_t vocab, tokens, val_tokens, branch;
    uint64_t seed;
    double noise;
    const char *out_dir, *name;
    const char *score; /* --score FILE: score token ids instead of writing a corpus */
} Opts;

static void usage(FILE *f) {
    fprintf(f, "usage: mbt-gendata [options]\n"
               "  writes OUT/NAME_train.bin and OUT/NAME_val.bin (llm.c shards) from a seeded order-2 Markov\n"
               "  chain and prints its entropy rate (the best achievable cross-entropy) in nats/token\n"
               "  --vocab V         vocabulary size, 2..1024 (default 64)\n"
               "  --tokens N        training tokens (default 1000000)\n"
               "  --val-tokens N    held-out tokens, 0 for none (default 100000)\n"
               "  --seed S          seed of the chain and of the samples (default 1337)\n"
               "  --out-dir DIR     where to write (default data; created if missing)\n"
               "  --name NAME       file name prefix (default tiny)\n"
               "  --branch K        likely successors of each context, 1..V (default 4)\n"
               "  --noise E         probability spread uniformly over all tokens, in (0, 1] (default 0.02)\n"
               "  --score FILE      write nothing: read token ids (whitespace- or comma-separated; - is stdin)\n"
               "                    and print their mean -log p under the chain the other options define,\n"
               "                    each token given the two before it (how plausible generated text is)\n");
}

static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "mbt-gendata: %s needs a whole number from %lld to %lld, not '%s'\n", opt, (long long)lo, (long long)hi,
                s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_opts(int argc, char **argv, Opts *o) {
    *o = (Opts){64, 1000000, 100000, 4, 1337, 0.02, "data", "tiny", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        const char *eq = strchr(a, '=');
        char key[64];
        const char *val;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "mbt-gendata: unexpected argument '%s'\n", a);
            usage(stderr);
            return 0;
        }
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(key, sizeof key, "%s", a);
            if (i + 1 >= argc) {
                fprintf(stderr, "mbt-gendata: %s needs a value\n", a);
                return 0;
            }
            val = argv[++i];
        }
        int64_t v;
        if (strcmp(key, "--vocab") == 0) {
            if (!parse_int(key, val, 2, 1024, &o->vocab)) return 0;
        } else if (strcmp(key, "--tokens") == 0) {
            if (!parse_int(key, val, 3, INT32_MAX, &o->tokens)) return 0;
        } else if (strcmp(key, "--val-tokens") == 0) {
            if (!parse_int(key, val, 0, INT32_MAX, &o->val_tokens)) return 0;
            if (o->val_tokens > 0 && o->val_tokens < 3) {
                fprintf(stderr, "mbt-gendata: --val-tokens must be 0 or at least 3\n");
                return 0;
            }
        } else if (strcmp(key, "--seed") == 0) {
            if (!parse_int(key, val, 0, INT64_MAX, &v)) return 0;
            o->seed = (uint64_t)v;
        } else if (strcmp(key, "--branch") == 0) {
            if (!parse_int(key, val, 1, 1024, &o->branch)) return 0;
        } else if (strcmp(key, "--noise") == 0) {
            char *end;
            errno = 0;
            o->noise = strtod(val, &end);
            if (errno || end == val || *end || !(o->noise > 0 && o->noise <= 1)) {
                fprintf(stderr, "mbt-gendata: --noise needs a number in (0, 1], not '%s'\n", val);
                return 0;
            }
        } else if (strcmp(key, "--out-dir") == 0) {
            o->out_dir = val;
        } else if (strcmp(key, "--name") == 0) {
            o->name = val;
        } else if (strcmp(key, "--score") == 0) {
            o->score = val;
        } else {
            fprintf(stderr, "mbt-gendata: unknown option '%s'\n", key);
            usage(stderr);
            return 0;
        }
    }
    if (o->branch > o->vocab) {
        fprintf(stderr, "mbt-gendata: --branch %lld exceeds --vocab %lld\n", (long long)o->branch, (long long)o->vocab);
        return 0;
    }
    if (!*o->name || strchr(o->name, '/')) {
        fprintf(stderr, "mbt-gendata: --name must be a plain file name prefix, not '%s'\n", o->name);
        return 0;
    }
    return 1;
}

/* ---- the chain -------------------------------------------------------------------------------- */

/* Context s = a * V + b has successors succ[s*K .. s*K+K) with probabilities
 * p[...] = (1 - noise) * q + noise / V; every other token has probability noise / V. */
typedef struct Chain {
    int64_t V, K;
    double noise;
    uint16_t *succ;
    double *q;  /* the peaked part, summing to 1 over a context's successors */
    double *p;  /* the full probability of each successor */
    double *pi; /* stationary distribution over contexts */
    double H;   /* entropy rate, nats/token */
    double H1;  /* H(x_t | x_t-1): the best a bigram model can do, nats/token */
    double H0;  /* H(x_t): the best a unigram model can do */
    int iterations;
    double residual;
} Chain;

static int chain_build(Chain *c, const Opts *o) {
    int64_t V = o->vocab, K = o->branch, S = V * V;
    c->V = V;
    c->K = K;
    c->noise = o->noise;
    c->succ = malloc((size_t)(S * K) * sizeof *c->succ);
    c->q = malloc((size_t)(S * K) * sizeof *c->q);
    c->p = malloc((size_t)(S * K) * sizeof *c->p);
    c->pi = malloc((size_t)S * sizeof *c->pi);
    if (!c->succ || !c->q || !c->p || !c->pi) {
        fprintf(stderr, "mbt-gendata: cannot build a chain over %lld contexts: out of memory\n", (long long)S);
        return 0;
    }
    RtRng r;
    rt_rng_init(&r, o->seed, RT_RNG_DOMAIN_GENDATA, 0);
    for (int64_t s = 0; s < S; s++) {
        uint16_t *sc = c->succ + s * K;
        double *q = c->q + s * K, sum = 0;
        for (int64_t k = 0; k < K; k++) {
            int fresh;
            do { /* distinct successors */
                sc[k] = (uint16_t)rt_rng_below(&r, (uint64_t)V);
                fresh = 1;
                for (int64_t j = 0; j < k; j++) fresh &= sc[j] != sc[k];
            } while (!fresh);
            /* u^4 with u uniform in (0, 1]: a few successors take most of the mass. */
            double u = 1.0 - rt_rng_f64(&r);
            q[k] = u * u * u * u;
            sum += q[k];
        }
        for (int64_t k = 0; k < K; k++) {
            q[k] /= sum;
            c->p[s * K + k] = (1 - c->noise) * q[k] + c->noise / (double)V;
        }
    }
    return 1;
}

/* pi by power iteration on the chain over contexts: (a, b) -> (b, c) with P(c | a, b). */
static int chain_stationary(Chain *c) {
    int64_t V = c->V, K = c->K, S = V * V;
    double *next = malloc((size_t)S * sizeof *next), *marg = malloc((size_t)V * sizeof *marg);
    if (!next || !marg) {
        free(next);
        free(marg);
        fprintf(stderr, "mbt-gendata: out of memory\n");
        return 0;
    }
    for (int64_t s = 0; s < S; s++) c->pi[s] = 1.0 / (double)S;
    double floor = c->noise / (double)V;
    c->iterations = 0;
    c->residual = 1;
    while (c->iterations < 100000 && c->residual > 1e-15) {
        memset(next, 0, (size_t)S * sizeof *next);
        memset(marg, 0, (size_t)V * sizeof *marg);
        for (int64_t s = 0; s < S; s++) {
            double m = c->pi[s];
            int64_t b = s % V;
            marg[b] += m;
            for (int64_t k = 0; k < K; k++) next[b * V + c->succ[s * K + k]] += m * (1 - c->noise) * c->q[s * K + k];
        }
        double total = 0;
        for (int64_t b = 0; b < V; b++)
            for (int64_t x = 0; x < V; x++) {
                next[b * V + x] += marg[b] * floor;
                total += next[b * V + x];
            }
        double diff = 0;
        for (int64_t s = 0; s < S; s++) {
            next[s] /= total; /* keeps rounding from drifting the mass */
            diff += fabs(next[s] - c->pi[s]);
        }
        memcpy(c->pi, next, (size_t)S * sizeof *next);
        c->residual = diff;
        c->iterations++;
    }
    free(next);
    free(marg);
    /* The entropy rate: each context's entropy, weighted by how often it occurs. */
    c->H = 0;
    for (int64_t s = 0; s < S; s++) {
        double h = -(double)(V - K) * floor * log(floor);
        for (int64_t k = 0; k < K; k++) h -= c->p[s * K + k] * log(c->p[s * K + k]);
        c->H += c->pi[s] * h;
    }
    return 1;
}

/* What models that see less context can reach at best, under the stationary distribution: a
 * bigram model's best is H(x_t | x_t-1), from P(b, c) = sum_a pi(a, b) P(c | a, b); a unigram
 * model's is H(x_t). Both are above the entropy rate (conditioning never raises entropy). */
static int chain_short_entropies(Chain *c) {
    int64_t V = c->V, K = c->K;
    double *row = malloc((size_t)V * sizeof *row), *marg = calloc((size_t)V, sizeof *marg);
    if (!row || !marg) {
        free(row);
        free(marg);
        fprintf(stderr, "mbt-gendata: out of memory\n");
        return 0;
    }
    c->H1 = 0;
    for (int64_t b = 0; b < V; b++) {
        double pb = 0;
        for (int64_t a = 0; a < V; a++) pb += c->pi[a * V + b];
        for (int64_t x = 0; x < V; x++) row[x] = pb * c->noise / (double)V; /* the uniform floor */
        for (int64_t a = 0; a < V; a++) {
            int64_t s = a * V + b;
            for (int64_t k = 0; k < K; k++) row[c->succ[s * K + k]] += c->pi[s] * (1 - c->noise) * c->q[s * K + k];
        }
        for (int64_t x = 0; x < V; x++) {
            marg[x] += row[x];
            if (row[x] > 0 && pb > 0) c->H1 -= row[x] * log(row[x] / pb);
        }
    }
    c->H0 = 0;
    for (int64_t x = 0; x < V; x++)
        if (marg[x] > 0) c->H0 -= marg[x] * log(marg[x]);
    free(row);
    free(marg);
    return 1;
}

static double chain_prob(const Chain *c, int64_t s, uint32_t x) {
    for (int64_t k = 0; k < c->K; k++)
        if (c->succ[s * c->K + k] == x) return c->p[s * c->K + k];
    return c->noise / (double)c->V;
}

/* n tokens from the chain, starting in a context drawn from pi; returns the mean -log P of
 * tokens 3..n given their two predecessors. */
static double chain_sample(const Chain *c, uint64_t seed, uint64_t stream, uint32_t *out, int64_t n) {
    RtRng r;
    rt_rng_init(&r, seed, RT_RNG_DOMAIN_GENDATA, stream);
    int64_t V = c->V, S = V * V, K = c->K;
    double u = rt_rng_f64(&r), acc = 0;
    int64_t s = S - 1;
    for (int64_t i = 0; i < S; i++) {
        acc += c->pi[i];
        if (u < acc) {
            s = i;
            break;
        }
    }
    out[0] = (uint32_t)(s / V);
    out[1] = (uint32_t)(s % V);
    double nll = 0;
    for (int64_t t = 2; t < n; t++) {
        double v = rt_rng_f64(&r);
        uint32_t x;
        if (v < c->noise) {
            x = (uint32_t)rt_rng_below(&r, (uint64_t)V);
        } else {
            double w = (v - c->noise) / (1 - c->noise), cum = 0;
            int64_t k = 0;
            for (; k < K - 1; k++) {
                cum += c->q[s * K + k];
                if (w < cum) break;
            }
            x = c->succ[s * K + k];
        }
        out[t] = x;
        nll -= log(chain_prob(c, s, x));
        s = (s % V) * V + x;
    }
    return n > 2 ? nll / (double)(n - 2) : 0;
}

/* ---- main ------------------------------------------------------------------------------------- */

static int make_dirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        fprintf(stderr, "mbt-gendata: output directory name too long\n");
        return 0;
    }
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || !*p) {
            char save = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "mbt-gendata: cannot create directory '%s': %s\n", buf, strerror(errno));
                return 0;
            }
            *p = save;
            if (!save) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "mbt-gendata: '%s' is not a directory\n", path);
        return 0;
    }
    return 1;
}

static int write_split(const Chain *c, const Opts *o, const char *split, uint64_t stream, int64_t n, double *nll) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s_%s.bin", o->out_dir, o->name, split) >= (int)sizeof path) {
        fprintf(stderr, "mbt-gendata: output path too long\n");
        return 0;
    }
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) {
        fprintf(stderr, "mbt-gendata: cannot hold %lld tokens: out of memory\n", (long long)n);
        return 0;
    }
    *nll = chain_sample(c, o->seed, stream, tok, n);
    RtError e;
    RtStatus st = rt_shard_write(path, RT_SHARD_LLMC, tok, n, &e);
    free(tok);
    if (st != RT_OK) {
        fprintf(stderr, "mbt-gendata: %s\n", e.msg);
        return 0;
    }
    printf("wrote %s: %lld tokens (llm.c shard)\n", path, (long long)n);
    return 1;
}

/* --score: the mean -log p of each token given the two before it, over every line of token ids
 * in the file (a line is one sequence: its first two tokens are context only). */
static int score_file(const Chain *c, const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "mbt-gendata: cannot read '%s': %s\n", path, strerror(errno));
        return 0;
    }
    double nll = 0;
    int64_t n = 0, seen = 0, line = 1;
    uint32_t prev[2] = {0, 0};
    int ok = 1, ch;
    while (ok && (ch = fgetc(f)) != EOF) {
        if (ch == '\n') {
            line++;
            seen = 0;
            continue;
        }
        if (ch == ' ' || ch == '\t' || ch == ',' || ch == '\r') continue;
        if (ch < '0' || ch > '9') {
            fprintf(stderr, "mbt-gendata: %s:%lld: '%c' is not part of a token id\n", path, (long long)line, ch);
            ok = 0;
            break;
        }
        int64_t v = 0;
        for (; ch >= '0' && ch <= '9'; ch = fgetc(f)) v = v < c->V ? v * 10 + (ch - '0') : v;
        if (ch == '\n') ungetc(ch, f);
        if (v >= c->V) {
            fprintf(stderr, "mbt-gendata: %s:%lld: token id %lld is not below the vocabulary size %lld\n", path, (long long)line,
                    (long long)v, (long long)c->V);
            ok = 0;
            break;
        }
        if (seen >= 2) {
            nll -= log(chain_prob(c, (int64_t)prev[0] * c->V + prev[1], (uint32_t)v));
            n++;
        }
        prev[0] = prev[1];
        prev[1] = (uint32_t)v;
        seen++;
    }
    if (f != stdin) fclose(f);
    if (!ok) return 0;
    if (n == 0) {
        fprintf(stderr, "mbt-gendata: '%s' has no token with two before it to score\n", path);
        return 0;
    }
    printf("score: %.6f nats/token over %lld tokens (entropy rate %.6f, bigram %.6f, unigram %.6f, uniform %.6f)\n",
           nll / (double)n, (long long)n, c->H, c->H1, c->H0, log((double)c->V));
    return 1;
}

int main(int argc, char **argv) {
    Opts o;
    if (!parse_opts(argc, argv, &o)) return 1;
    Chain c = {0};
    if (o.score) {
        int ok = chain_build(&c, &o) && chain_stationary(&c) && chain_short_entropies(&c) && score_file(&c, o.score);
        free(c.succ);
        free(c.q);
        free(c.p);
        free(c.pi);
        return ok ? 0 : 1;
    }
    int ok = make_dirs(o.out_dir) && chain_build(&c, &o) && chain_stationary(&c) && chain_short_entropies(&c);
    double nll_train = 0, nll_val = 0;
    if (ok) {
        printf("order-2 Markov chain: vocab %lld, %lld likely successors per context, noise %g, seed %llu\n", (long long)o.vocab,
               (long long)o.branch, o.noise, (unsigned long long)o.seed);
        ok = write_split(&c, &o, "train", 1, o.tokens, &nll_train);
        if (ok && o.val_tokens > 0) ok = write_split(&c, &o, "val", 2, o.val_tokens, &nll_val);
    }
    if (ok) {
        printf("entropy rate: %.6f nats/token (%.4f bits); uniform guessing: log(vocab) = %.6f nats\n", c.H, c.H / log(2.0),
               log((double)o.vocab));
        printf("best with less context: bigram H(x_t | x_t-1) = %.6f nats/token, unigram H(x_t) = %.6f\n", c.H1, c.H0);
        printf("stationary distribution: %d power iterations, L1 change in the last %.1e\n", c.iterations, c.residual);
        printf("sample check (mean -log p of each token given the two before, under the true chain): train %.6f", nll_train);
        if (o.val_tokens > 0) printf(", val %.6f", nll_val);
        printf(" nats/token\n");
        if (c.residual > 1e-12)
            fprintf(stderr, "mbt-gendata: warning: the power iteration did not converge (L1 change %.1e)\n", c.residual);
    }
    free(c.succ);
    free(c.q);
    free(c.p);
    free(c.pi);
    return ok ? 0 : 1;
}
