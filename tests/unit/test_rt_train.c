/* test_rt_train.c - end-to-end tests of the executable side of the runtime (cli.c, train.c,
 * log.c, weights.c, generate.c, main.c) through a hand-written program on the RtProgram ABI:
 * build/tests/bigram (tests/runtime/bigram_program.c, micro-batch 4 x accumulation 4) and
 * build/tests/bigram_micro16 (the same model, micro-batch 16, no accumulation).
 *
 * Build: make build/tests/test_rt_train (which builds both programs and build/mbt-gendata first).
 * It finds them beside itself (../mbt-gendata, ./bigram), writes a 200,000-token corpus with
 * mbt-gendata into a temporary directory, and runs the programs as a user would. Prints
 * `PASS name` or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * The loss bound. mbt-gendata's data come from an order-2 Markov chain; a bigram model sees one
 * token of context, so the best it can do is not the entropy rate H (0.881 nats) but the
 * conditional entropy H(x_t | x_t-1), which gendata prints ("bigram H(x_t | x_t-1) = 3.661598"
 * for these settings). The test parses it as H1 and requires the trained model's held-out loss,
 * and the mean training loss of its last 20 steps, to be below H1 + 0.03 nats (and the held-out
 * loss above H1 - 0.06, since far below the best bigram means the targets leaked). Why 0.03: a
 * bigram fitted to N = 200,000 tokens has an expected held-out excess of about V(V-1) / 2N =
 * 0.010 nats over H1 (the usual asymptotic count of free parameters over twice the sample); the
 * 20,000-token validation sample deviates from its expectation by about 0.01-0.02 (gendata's own
 * sample check shows 0.016 for H); 300 steps of AdamW leave the rest. A model that learnt less
 * than the bigram structure sits near the unigram entropy (4.149) and fails by far. Measured:
 * held-out 3.643, training 3.63. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "rt_exec.h"
#include "unit.h"

/* ---- fixtures: paths, running a program, reading files ------------------------------------------ */

#define DIRMAX 1024        /* directories; file paths below them get PATH_MAX */
static char g_dir[DIRMAX]; /* the directory of this binary: build/tests */
static char g_tmp[DIRMAX]; /* a temporary directory for data, weights and logs */
static char g_bigram[PATH_MAX], g_micro16[PATH_MAX], g_gendata[PATH_MAX];
static char g_train[PATH_MAX], g_val[PATH_MAX];
static double g_h1 = NAN; /* H(x_t | x_t-1) printed by gendata */
static double g_h0 = NAN; /* H(x_t) */
static int g_ready;       /* setup worked */

/* path = g_tmp/name */
static const char *tmp_path(char *buf, const char *name) {
    snprintf(buf, PATH_MAX, "%s/%s", g_tmp, name);
    return buf;
}

/* Reads a whole file (NUL-terminated; *n its length). NULL if it cannot. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    fclose(f);
    if (buf) buf[len] = 0;
    if (n) *n = len;
    return buf;
}

typedef struct Run {
    int status; /* exit status, or 128 + signal */
    char *out;  /* stdout */
    char *err;  /* stderr */
} Run;

static void run_free(Run *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Runs argv (argv[0] a path) with stdout and stderr captured; waits for it. */
static Run run_argv(char *const argv[]) {
    Run r = {-1, NULL, NULL};
    char out[PATH_MAX], err[PATH_MAX];
    tmp_path(out, "run.stdout");
    tmp_path(err, "run.stderr");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) _exit(120);
        execv(argv[0], argv);
        _exit(121);
    }
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    r.status = pid < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = slurp(out, NULL);
    r.err = slurp(err, NULL);
    if (!r.out) r.out = strdup("");
    if (!r.err) r.err = strdup("");
    return r;
}

/* run(prog, args..., NULL) */
#define MAXARGS 32
static Run run(const char *prog, ...) {
    char *argv[MAXARGS + 2];
    int n = 0;
    argv[n++] = (char *)prog;
    va_list ap;
    va_start(ap, prog);
    const char *a;
    while (n < MAXARGS && (a = va_arg(ap, const char *)) != NULL) argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return run_argv(argv);
}

/* Checks a run ended with status 0, showing its stderr if not. */
#define CHECK_OK(r, what)                                                                                                        \
    do {                                                                                                                         \
        CHECK((r).status == 0, "%s: exit status %d", (what), (r).status);                                                        \
        if ((r).status != 0) unit_detail("stderr", (r).err);                                                                     \
    } while (0)

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* The number after `key` in text (first occurrence), or NAN. */
static double number_after(const char *text, const char *key) {
    const char *p = text ? strstr(text, key) : NULL;
    if (!p) return NAN;
    return strtod(p + strlen(key), NULL);
}

/* ---- the JSONL log ------------------------------------------------------------------------------ */

typedef struct StepRec {
    int64_t step, tokens;
    double loss, lr, grad_norm, ms, tokens_per_s;
    int keys; /* how many of the 7 keys were found */
} StepRec;

static double json_num(const char *line, const char *key, int *found) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(line, k);
    if (!p) return NAN;
    (*found)++;
    return strtod(p + strlen(k), NULL);
}

/* Parses a --log file; returns the number of step records (at most max). */
static int read_log(const char *path, StepRec *rec, int max) {
    char *text = slurp(path, NULL);
    if (!text) return -1;
    int n = 0;
    for (char *line = text; *line && n < max;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (line[0] == '{' && strstr(line, "\"loss\"")) {
            StepRec *r = &rec[n++];
            memset(r, 0, sizeof *r);
            r->step = (int64_t)json_num(line, "step", &r->keys);
            r->loss = json_num(line, "loss", &r->keys);
            r->lr = json_num(line, "lr", &r->keys);
            r->grad_norm = json_num(line, "grad_norm", &r->keys);
            r->ms = json_num(line, "ms", &r->keys);
            r->tokens = (int64_t)json_num(line, "tokens", &r->keys);
            r->tokens_per_s = json_num(line, "tokens_per_s", &r->keys);
        }
        if (!nl) break;
        line = nl + 1;
    }
    free(text);
    return n;
}

/* ---- setup -------------------------------------------------------------------------------------- */

static int setup(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("FAIL setup: cannot read /proc/self/exe: %s\n", strerror(errno));
        return 0;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    *slash = 0;
    if (strlen(self) >= sizeof g_dir) {
        printf("FAIL setup: the build directory's path is longer than %d bytes\n", DIRMAX);
        return 0;
    }
    memcpy(g_dir, self, strlen(self) + 1);
    snprintf(g_bigram, sizeof g_bigram, "%s/bigram", g_dir);
    snprintf(g_micro16, sizeof g_micro16, "%s/bigram_micro16", g_dir);
    snprintf(g_gendata, sizeof g_gendata, "%s/../mbt-gendata", g_dir);
    const char *need[] = {g_bigram, g_micro16, g_gendata};
    for (int i = 0; i < 3; i++)
        if (access(need[i], X_OK) != 0) {
            printf("FAIL setup: %s is missing (make %s builds it)\n", need[i], "build/tests/test_rt_train");
            return 0;
        }
    const char *t = getenv("TMPDIR");
    if (!t || !*t || strlen(t) > DIRMAX - 32) t = "/tmp";
    snprintf(g_tmp, sizeof g_tmp, "%.*s/mbt-rt-train-XXXXXX", DIRMAX - 32, t);
    if (!mkdtemp(g_tmp)) {
        printf("FAIL setup: cannot create a temporary directory: %s\n", strerror(errno));
        return 0;
    }
    Run r = run(g_gendata, "--tokens", "200000", "--val-tokens", "20000", "--out-dir", g_tmp, "--name", "corpus", NULL);
    g_h1 = number_after(r.out, "bigram H(x_t | x_t-1) = ");
    g_h0 = number_after(r.out, "unigram H(x_t) = ");
    int ok = r.status == 0 && isfinite(g_h1) && isfinite(g_h0);
    if (!ok) {
        printf("FAIL setup: mbt-gendata failed (status %d) or printed no bigram entropy\n", r.status);
        unit_detail("stdout", r.out);
        unit_detail("stderr", r.err);
    }
    run_free(&r);
    snprintf(g_train, sizeof g_train, "%s/corpus_train.bin", g_tmp);
    snprintf(g_val, sizeof g_val, "%s/corpus_val.bin", g_tmp);
    return ok;
}

static void teardown(void) {
    if (!g_tmp[0]) return;
    DIR *d = opendir(g_tmp);
    if (d) {
        struct dirent *e;
        char p[PATH_MAX * 2];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(p, sizeof p, "%s/%s", g_tmp, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(g_tmp);
}

/* Trains the bigram (or another program) 300 steps with the given threads and seed, saving the
 * weights and the log under names derived from tag; returns the run (caller frees). */
static Run train(const char *prog, const char *tag, const char *threads, const char *seed, const char *steps) {
    char w[PATH_MAX], l[PATH_MAX], wn[64], ln[64];
    snprintf(wn, sizeof wn, "%s.safetensors", tag);
    snprintf(ln, sizeof ln, "%s.jsonl", tag);
    return run(prog, "train", "--data", g_train, "--threads", threads, "--seed", seed, "--steps", steps, "--save-weights",
               tmp_path(w, wn), "--log", tmp_path(l, ln), NULL);
}

/* ---- training ----------------------------------------------------------------------------------- */

static void reaches_bigram_loss(void) {
    Run r = train(g_bigram, "a", "2", "1337", "300");
    CHECK_OK(r, "train");
    CHECK(strstr(r.out, "train bigram: 4,160 parameters in 2 tensors; 300 steps of 16 sequences x 64 tokens "
                        "(micro-batch 4, accumulation 4); seed 1337"),
          "the banner is missing");
    CHECK(strstr(r.out, "saved 2 tensors to '"), "no 'saved' line");
    run_free(&r);
    char path[PATH_MAX];
    StepRec rec[400];
    int n = read_log(tmp_path(path, "a.jsonl"), rec, 400);
    CHECK(n == 300, "the log has %d step records, expected 300", n);
    if (n != 300) return;
    CHECK(fabs(rec[0].loss - log(64.0)) < 0.01, "step 1 loss %.6f, expected about ln 64 = %.6f (init std 0.02)", rec[0].loss,
          log(64.0));
    double tail = 0;
    for (int i = 280; i < 300; i++) tail += rec[i].loss / 20;
    CHECK(tail < g_h1 + 0.03, "mean training loss of the last 20 steps %.6f, not below H1 + 0.03 = %.6f", tail, g_h1 + 0.03);
    Run ev = run(g_bigram, "eval", "--weights", tmp_path(path, "a.safetensors"), "--data", g_val, "--steps", "1000", NULL);
    CHECK_OK(ev, "eval");
    double val = number_after(ev.out, "eval bigram: loss ");
    CHECK(val < g_h1 + 0.03 && val > g_h1 - 0.06, "held-out loss %.6f, expected within [H1 - 0.06, H1 + 0.03] = [%.6f, %.6f]",
          val, g_h1 - 0.06, g_h1 + 0.03);
    CHECK(strstr(ev.out, "on 78 batches of 4 x 64 tokens"), "eval should read all 78 batches of the val file");
    printf("    (H1 %.6f, H0 %.6f; trained: last-20 training loss %.6f, held-out %.6f)\n", g_h1, g_h0, tail, val);
    run_free(&ev);
    /* the untrained model is near uniform */
    ev = run(g_bigram, "eval", "--data", g_val, NULL);
    CHECK_OK(ev, "eval without weights");
    double init = number_after(ev.out, "eval bigram: loss ");
    CHECK(fabs(init - log(64.0)) < 0.02, "the initialised model's loss %.6f, expected about ln 64", init);
    /* eval { steps = 20 } global batches of 16 = 80 micro-batches of 4, more than the 78 there are */
    CHECK(strstr(ev.out, "on 78 batches"), "eval's default is the program's eval steps (20 global batches, capped at 78)");
    run_free(&ev);
    ev = run(g_bigram, "eval", "--data", g_val, "--steps", "2", NULL);
    CHECK_OK(ev, "eval --steps 2");
    CHECK(strstr(ev.out, "on 8 batches of 4 x 64 tokens"), "eval --steps 2: two global batches of 16, 8 micro-batches");
    run_free(&ev);
}

static void log_records(void) {
    char path[PATH_MAX];
    StepRec rec[400];
    int n = read_log(tmp_path(path, "a.jsonl"), rec, 400);
    if (n < 0) {
        Run r = train(g_bigram, "a", "2", "1337", "300");
        run_free(&r);
        n = read_log(path, rec, 400);
    }
    CHECK(n == 300, "%d records", n);
    for (int i = 0; i < n; i++) {
        CHECK(rec[i].keys == 7, "record %d has %d of the 7 keys", i + 1, rec[i].keys);
        CHECK(rec[i].step == i + 1, "record %d says step %lld", i + 1, (long long)rec[i].step);
        CHECK(rec[i].tokens == 1024, "record %d: %lld tokens, expected 16 x 64", i + 1, (long long)rec[i].tokens);
        CHECK(rec[i].ms > 0 && rec[i].tokens_per_s > 0 && rec[i].grad_norm > 0, "record %d: a timing or norm is not positive",
              i + 1);
        /* lr = 0.05 x cosine(step - 1, warmup 10, total 300, min 0.1) */
        int64_t s = i;
        double mult =
            s < 10 ? (double)(s + 1) / 10 : 0.1 + 0.9 * 0.5 * (1 + cos(3.14159265358979323846 * (double)(s - 10) / 290.0));
        if (i < 3 || i == 10 || i == 150 || i == 299)
            CHECK(fabs(rec[i].lr - 0.05 * mult) <= 1e-8 * 0.05, "step %d: lr %.9g, expected %.9g", i + 1, rec[i].lr, 0.05 * mult);
    }
    /* clip = 0.05: the log shows the norm before clipping, above 0.05 on some steps */
    int above = 0;
    for (int i = 0; i < n; i++) above += rec[i].grad_norm > 0.05;
    CHECK(above > 0, "no step had a gradient norm above the clip (0.05): the clip path is untested");
}

static void same_seed_same_bits(void) {
    Run r = train(g_bigram, "b", "2", "1337", "300");
    CHECK_OK(r, "second run");
    run_free(&r);
    char a[PATH_MAX], b[PATH_MAX];
    tmp_path(a, "a.safetensors");
    if (access(a, R_OK) != 0) {
        r = train(g_bigram, "a", "2", "1337", "300");
        run_free(&r);
    }
    CHECK(same_file(a, tmp_path(b, "b.safetensors")), "two runs with seed 1337 wrote different weights");
    r = train(g_bigram, "s2", "2", "7", "300");
    CHECK_OK(r, "seed 7");
    run_free(&r);
    CHECK(!same_file(a, tmp_path(b, "s2.safetensors")), "seeds 1337 and 7 wrote the same weights");
}

static void threads_do_not_matter(void) {
    char a[PATH_MAX], b[PATH_MAX];
    Run r = train(g_bigram, "t1", "1", "1337", "300");
    CHECK_OK(r, "1 thread");
    run_free(&r);
    r = train(g_bigram, "t2", "2", "1337", "300");
    CHECK_OK(r, "2 threads");
    run_free(&r);
    r = train(g_bigram, "t3", "3", "1337", "300");
    CHECK_OK(r, "3 threads");
    run_free(&r);
    CHECK(same_file(tmp_path(a, "t1.safetensors"), tmp_path(b, "t2.safetensors")), "1 and 2 threads differ");
    CHECK(same_file(tmp_path(a, "t1.safetensors"), tmp_path(b, "t3.safetensors")), "1 and 3 threads differ");
}

/* micro 4 x accumulation 4 against micro 16 x 1: the same global batch of the same windows, so
 * the same loss and gradient up to float rounding - if and only if the loss is normalised over the
 * global batch (the gradient norm would be 4x otherwise, and the loss too). */
static void accumulation_equals_one_batch(void) {
    Run r = train(g_bigram, "acc4", "2", "1337", "300");
    CHECK_OK(r, "micro 4 x 4");
    run_free(&r);
    r = train(g_micro16, "acc1", "2", "1337", "300");
    CHECK_OK(r, "micro 16 x 1");
    CHECK(strstr(r.out, "(micro-batch 16, accumulation 1)"), "bigram_micro16's banner");
    run_free(&r);
    char path[PATH_MAX];
    StepRec a[400], b[400];
    int na = read_log(tmp_path(path, "acc4.jsonl"), a, 400), nb = read_log(tmp_path(path, "acc1.jsonl"), b, 400);
    CHECK(na == 300 && nb == 300, "%d and %d records", na, nb);
    double worst_loss = 0, worst_norm = 0;
    for (int i = 0; i < na && i < nb; i++) {
        double dl = fabs(a[i].loss - b[i].loss) / fabs(b[i].loss), dn = fabs(a[i].grad_norm - b[i].grad_norm) / b[i].grad_norm;
        if (dl > worst_loss) worst_loss = dl;
        if (dn > worst_norm) worst_norm = dn;
    }
    CHECK(worst_loss <= 1e-6, "the losses differ by up to %.3g relative (limit 1e-6)", worst_loss);
    CHECK(worst_norm <= 1e-6, "the gradient norms differ by up to %.3g relative (limit 1e-6)", worst_norm);
    CHECK(na == 300 && fabs(a[299].loss - b[299].loss) <= 1e-6 * b[299].loss, "step 300: %.9g vs %.9g", a[299].loss, b[299].loss);
    printf("    (step 300 loss %.9g vs %.9g; worst relative differences: loss %.2g, gradient norm %.2g)\n", a[299].loss,
           b[299].loss, worst_loss, worst_norm);
}

/* ---- weights ------------------------------------------------------------------------------------ */

static void weights_round_trip(void) {
    char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX];
    tmp_path(a, "rt_a.safetensors");
    Run r = run(g_bigram, "train", "--data", g_train, "--steps", "50", "--save-weights", a, NULL);
    CHECK_OK(r, "train 50 steps");
    run_free(&r);
    /* --init-weights then --steps 0 --save-weights writes the same bytes */
    r = run(g_bigram, "train", "--data", g_train, "--steps", "0", "--init-weights", a, "--save-weights",
            tmp_path(b, "rt_b.safetensors"), NULL);
    CHECK_OK(r, "train --steps 0");
    run_free(&r);
    CHECK(same_file(a, b), "--init-weights then --save-weights changed the file");
    /* the file: two F32 tensors with the dotted names and shapes, metadata format = pt */
    RtStFile *f = NULL;
    RtError e;
    CHECK(rt_st_open(&f, a, &e) == RT_OK, "open: %s", e.msg);
    if (f) {
        const RtStTensor *w = rt_st_find(f, "wte.weight"), *bias = rt_st_find(f, "head.bias");
        CHECK(rt_st_count(f) == 2, "%lld tensors", (long long)rt_st_count(f));
        CHECK(w && w->dtype == RT_F32 && w->rank == 2 && w->shape[0] == 64 && w->shape[1] == 64, "wte.weight");
        CHECK(bias && bias->dtype == RT_F32 && bias->rank == 1 && bias->shape[0] == 64, "head.bias");
        CHECK_STR(rt_st_meta_get(f, "format"), "pt", "metadata format");
        rt_st_close(f);
    }
    /* continuing from the weights trains on (a different file), and eval reads them */
    r = run(g_bigram, "train", "--data", g_train, "--steps", "5", "--init-weights", a, "--save-weights",
            tmp_path(c, "rt_c.safetensors"), NULL);
    CHECK_OK(r, "train on from the weights");
    run_free(&r);
    CHECK(!same_file(a, c), "5 more steps did not change the weights");
    Run e1 = run(g_bigram, "eval", "--weights", a, "--data", g_val, NULL),
        e2 = run(g_bigram, "eval", "--weights", b, "--data", g_val, NULL);
    CHECK_OK(e1, "eval a");
    CHECK(strcmp(e1.out, e2.out) == 0, "eval of identical weights differs: '%s' vs '%s'", e1.out, e2.out);
    run_free(&e1);
    run_free(&e2);
}

/* --steps 0 saves the initialisation: rt_init_param of (seed, dotted name). */
static void initialisation_is_seed_and_name(void) {
    char a[PATH_MAX];
    Run r = run(g_bigram, "train", "--data", g_train, "--steps", "0", "--seed", "99", "--save-weights",
                tmp_path(a, "init.safetensors"), NULL);
    CHECK_OK(r, "train --steps 0");
    run_free(&r);
    float want[64 * 64], got[64 * 64];
    RtError e;
    CHECK(rt_init_param(want, 64 * 64, 99, "wte.weight", RT_INIT_NORMAL, 0, 0.02, &e) == RT_OK, "init: %s", e.msg);
    RtStFile *f = NULL;
    CHECK(rt_st_open(&f, a, &e) == RT_OK, "open: %s", e.msg);
    if (!f) return;
    const RtStTensor *w = rt_st_find(f, "wte.weight"), *b = rt_st_find(f, "head.bias");
    CHECK(w && rt_st_read_f32(f, w, got, 64 * 64, &e) == RT_OK, "read wte.weight");
    CHECK(memcmp(want, got, sizeof got) == 0, "wte.weight is not rt_init_param(99, \"wte.weight\", normal(0, 0.02))");
    CHECK(b && rt_st_read_f32(f, b, got, 64, &e) == RT_OK, "read head.bias");
    int zeros = 1;
    for (int i = 0; i < 64; i++) zeros &= got[i] == 0.0f;
    CHECK(zeros, "head.bias is not zeros");
    rt_st_close(f);
}

/* ---- generation --------------------------------------------------------------------------------- */

/* Space-separated ids into v; returns how many. */
static int parse_tokens(const char *s, int *v, int max) {
    int n = 0;
    char *end;
    while (n < max) {
        long t = strtol(s, &end, 10);
        if (end == s) break;
        v[n++] = (int)t;
        s = end;
    }
    return n;
}

static void generate_greedy_follows_argmax(void) {
    char a[PATH_MAX];
    tmp_path(a, "gen.safetensors");
    Run r = run(g_bigram, "train", "--data", g_train, "--steps", "100", "--save-weights", a, NULL);
    CHECK_OK(r, "train");
    run_free(&r);
    r = run(g_bigram, "generate", "--weights", a, "--prompt-tokens", "3,5", "--max-tokens", "20", "--temperature", "0", NULL);
    CHECK_OK(r, "generate");
    int got[64];
    int n = parse_tokens(r.out, got, 64);
    CHECK(n == 20, "%d tokens generated, expected 20: '%s'", n, r.out);
    run_free(&r);
    /* the expected chain: the argmax (lowest id on ties) of row a of wte plus the bias */
    RtStFile *f = NULL;
    RtError e;
    float w[64 * 64], b[64];
    CHECK(rt_st_open(&f, a, &e) == RT_OK, "open: %s", e.msg);
    if (!f) return;
    rt_st_read_f32(f, rt_st_find(f, "wte.weight"), w, 64 * 64, &e);
    rt_st_read_f32(f, rt_st_find(f, "head.bias"), b, 64, &e);
    rt_st_close(f);
    int prev = 5;
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int c = 1; c < 64; c++)
            if (w[prev * 64 + c] + b[c] > w[prev * 64 + best] + b[best]) best = c;
        CHECK(got[i] == best, "token %d is %d, the argmax after %d is %d", i + 1, got[i], prev, best);
        prev = got[i];
    }
}

static void generate_sampling_is_seeded(void) {
    char a[PATH_MAX];
    tmp_path(a, "gen.safetensors");
    if (access(a, R_OK) != 0) {
        Run r = run(g_bigram, "train", "--data", g_train, "--steps", "100", "--save-weights", a, NULL);
        run_free(&r);
    }
    Run s1 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "200", "--seed", "5", NULL);
    Run s2 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "200", "--seed", "5", NULL);
    Run s3 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "200", "--seed", "6", NULL);
    Run k1 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "30", "--top-k", "1", "--seed", "9", NULL);
    Run g0 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "30", "--temperature", "0", NULL);
    Run t1 = run(g_bigram, "generate", "--weights", a, "--max-tokens", "200", "--seed", "5", "--threads", "1", NULL);
    CHECK_OK(s1, "generate seed 5");
    CHECK(strcmp(s1.out, s2.out) == 0, "seed 5 twice gave different tokens");
    CHECK(strcmp(s1.out, s3.out) != 0, "seeds 5 and 6 gave the same 200 tokens");
    CHECK(strcmp(s1.out, t1.out) == 0, "1 thread sampled differently");
    CHECK(strcmp(k1.out, g0.out) == 0, "--top-k 1 is not greedy: '%s' vs '%s'", k1.out, g0.out);
    int v[256];
    int n = parse_tokens(s1.out, v, 256), bad = 0;
    for (int i = 0; i < n; i++) bad += v[i] < 0 || v[i] >= 64;
    CHECK(n == 200 && bad == 0, "%d tokens, %d outside the vocabulary", n, bad);
    run_free(&s1);
    run_free(&s2);
    run_free(&s3);
    run_free(&k1);
    run_free(&g0);
    run_free(&t1);
}

/* --print-logits: one line per prefix of the prompt, the logits forward_logits wrote for it (the
 * bigram's: row prompt[len - 1] of wte plus the bias), exactly as floats; nothing generated. */
static void generate_print_logits(void) {
    char a[PATH_MAX];
    tmp_path(a, "gen.safetensors");
    if (access(a, R_OK) != 0) {
        Run r = run(g_bigram, "train", "--data", g_train, "--steps", "100", "--save-weights", a, NULL);
        run_free(&r);
    }
    Run r = run(g_bigram, "generate", "--weights", a, "--prompt-tokens", "3,5,3", "--print-logits", "--max-tokens", "7", NULL);
    CHECK_OK(r, "generate --print-logits");
    RtStFile *f = NULL;
    RtError e;
    float w[64 * 64], b[64];
    CHECK(rt_st_open(&f, a, &e) == RT_OK, "open: %s", e.msg);
    if (!f) {
        run_free(&r);
        return;
    }
    rt_st_read_f32(f, rt_st_find(f, "wte.weight"), w, 64 * 64, &e);
    rt_st_read_f32(f, rt_st_find(f, "head.bias"), b, 64, &e);
    rt_st_close(f);
    static const int prompt[3] = {3, 5, 3};
    const char *p = r.out;
    int lines = 0, bad = 0;
    for (int len = 1; len <= 3 && *p; len++, lines++) {
        for (int c = 0; c < 64; c++) {
            char *end;
            float got = strtof(p, &end);
            bad += end == p || got != w[prompt[len - 1] * 64 + c] + b[c];
            p = end;
        }
        bad += *p != '\n';
        if (*p) p++;
    }
    CHECK(lines == 3 && bad == 0 && *p == 0, "--print-logits printed %d lines, %d numbers wrong, then '%.40s'", lines, bad, p);
    run_free(&r);
}

/* rt_sample_token directly: inverse-CDF sampling over the sorted candidates. */
static void sampler_distribution(void) {
    float logits[4] = {logf(0.2f), logf(0.5f), logf(0.3f), -INFINITY}; /* p = .2 .5 .3 0 */
    float scratch[16];
    /* sorted by probability: 1 (.5), 2 (.3), 0 (.2): u < .5 -> 1, u < .8 -> 2, else 0 */
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.0, scratch) == 1, "u 0");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.49, scratch) == 1, "u 0.49");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.51, scratch) == 2, "u 0.51");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.79, scratch) == 2, "u 0.79");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.81, scratch) == 0, "u 0.81");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 1.0, 0.999999, scratch) == 0, "u near 1");
    /* top-2 renormalises .5/.8 and .3/.8 */
    CHECK(rt_sample_token(logits, 4, 1.0, 2, 1.0, 0.62, scratch) == 1, "top-2, u 0.62");
    CHECK(rt_sample_token(logits, 4, 1.0, 2, 1.0, 0.63, scratch) == 2, "top-2, u 0.63");
    CHECK(rt_sample_token(logits, 4, 1.0, 2, 1.0, 0.999999, scratch) == 2, "top-2 never picks the third");
    /* temperature 0 and top-k 1: the argmax; ties go to the lower id */
    float tie[3] = {1.0f, 2.0f, 2.0f};
    CHECK(rt_sample_token(tie, 3, 0.0, 0, 1.0, 0.9, scratch) == 1, "greedy tie");
    CHECK(rt_sample_token(tie, 3, 1.0, 1, 1.0, 0.9, scratch) == 1, "top-1 tie");
    /* a low temperature sharpens: with T = 0.1, p(1) = .5^10 / (.2^10 + .5^10 + .3^10) > .99 */
    CHECK(rt_sample_token(logits, 4, 0.1, 0, 1.0, 0.99, scratch) == 1, "temperature 0.1");
    /* top-p 0.6: 1 (.5) then 2 (.3) reach it, so the nucleus is top-2's; top-p 0.5: 1 alone */
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 0.6, 0.62, scratch) == 1, "top-p .6, u 0.62");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 0.6, 0.63, scratch) == 2, "top-p .6, u 0.63");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 0.6, 0.999999, scratch) == 2, "top-p .6 never picks the third");
    CHECK(rt_sample_token(logits, 4, 1.0, 0, 0.5, 0.999999, scratch) == 1, "top-p .5 is the likeliest alone");
    /* the uniform is keyed by (seed, position) alone */
    CHECK(rt_sample_u(7, 3) == rt_sample_u(7, 3), "same seed and position, same u");
    CHECK(rt_sample_u(7, 3) != rt_sample_u(7, 4) && rt_sample_u(7, 3) != rt_sample_u(8, 3), "another position or seed");
}

/* ---- the command line --------------------------------------------------------------------------- */

static void help_lists_every_flag(void) {
    Run r = run(g_bigram, "--help", NULL);
    CHECK_OK(r, "--help");
    static const char *want[] = {
        "usage: bigram COMMAND [options]",
        "train [bigram]",
        "eval [bigram]",
        "generate ",
        "--steps N                      optimizer steps (default 300)",
        "--device auto|cpu|cuda",
        "--seed S                       seeds initialisation and the data order (default 1337)",
        "--data GLOB                    training token shards (llm.c or nanoGPT format); once a data set (default 'data/tiny_train.bin')",
        "--log FILE.jsonl",
        "--init-weights F.safetensors",
        "--save-weights F.safetensors",
        "--threads N                    CPU threads (default ",
        "--dump-step F.safetensors      write step 1's weights, batches, loss and gradients (for mbtc --verify-step) (default none)",
        "--arena-high-water             measure the arena bytes step 1's micro-batches write and print them beside the plan's step "
        "peak (default off)",
        "--weights F.safetensors        the weights to evaluate (default none: the initialised model)",
        "--data GLOB                    held-out token shards (default 'data/tiny_val.bin')",
        "--steps N                      batches of 16 sequences (fewer if the data hold fewer) (default 20)",
        "--weights F.safetensors        the model's weights (default none: required)",
        "--prompt-tokens 1,2,3          the prompt, as token ids (default 0)",
        "--max-tokens N                 tokens to generate (default 32)",
        "--temperature T",
        "(default 1)",
        "--top-k K                      sample among the K likeliest tokens (default 0: all)",
        "--print-logits                 instead of generating, print the logits after each prefix of the prompt (default off)",
        "--ckpt-every N                 write a checkpoint every N steps, and at the end (default 0: only on SIGTERM or SIGINT)",
        "--resume latest|DIR            go on from a checkpoint of this program, bit-exactly (default none)",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK(strstr(r.out, want[i]), "--help lacks '%s'", want[i]);
    /* every flag line carries its default */
    int lines = 0, with_default = 0;
    for (const char *p = r.out; (p = strstr(p, "\n  --")) != NULL; p++) {
        if (strncmp(p, "\n  --help", 9) == 0) continue;
        lines++;
        const char *nl = strchr(p + 1, '\n');
        const char *d = strstr(p + 1, "(default ");
        with_default += d && (!nl || d < nl);
    }
    CHECK(lines == 40 && with_default == lines,
          "%d flag lines, %d with a default (expected 40: train 16, eval 6, generate 11, serve 7)", lines, with_default);
    Run r2 = run(g_bigram, "train", "--help", NULL);
    CHECK(r2.status == 0 && strcmp(r.out, r2.out) == 0, "'train --help' differs from '--help'");
    run_free(&r);
    run_free(&r2);
}

typedef struct ErrCase {
    const char *args[8];
    const char *message; /* the whole of stderr; %T is the temporary directory */
} ErrCase;

static void cli_errors(void) {
    char w[PATH_MAX], bad_name[PATH_MAX], bad_shape[PATH_MAX], inf_w[PATH_MAX];
    tmp_path(w, "cli.safetensors");
    tmp_path(bad_name, "badname.safetensors");
    tmp_path(bad_shape, "badshape.safetensors");
    tmp_path(inf_w, "inf.safetensors");
    Run t = run(g_bigram, "train", "--data", g_train, "--steps", "1", "--save-weights", w, NULL);
    CHECK_OK(t, "train 1 step");
    run_free(&t);
    /* weights files that do not fit the program */
    static float zeros[64 * 64], infs[64 * 64];
    for (int i = 0; i < 64 * 64; i++) infs[i] = INFINITY;
    int64_t s64x64[2] = {64, 64}, s64x32[2] = {64, 32}, s64[1] = {64};
    RtError e;
    RtStEntry nm[2] = {{"wte", RT_F32, 2, s64x64, zeros, 1}, {"head.bias", RT_F32, 1, s64, zeros, 1}};
    RtStEntry sh[2] = {{"wte.weight", RT_F32, 2, s64x32, zeros, 1}, {"head.bias", RT_F32, 1, s64, zeros, 1}};
    RtStEntry in[2] = {{"wte.weight", RT_F32, 2, s64x64, infs, 1}, {"head.bias", RT_F32, 1, s64, zeros, 1}};
    CHECK(rt_st_write(bad_name, nm, 2, NULL, 0, &e) == RT_OK && rt_st_write(bad_shape, sh, 2, NULL, 0, &e) == RT_OK &&
              rt_st_write(inf_w, in, 2, NULL, 0, &e) == RT_OK,
          "writing test weights: %s", e.msg);
    char missing_glob[PATH_MAX], missing_log[PATH_MAX], msg[8][PATH_MAX * 2];
    snprintf(missing_glob, sizeof missing_glob, "%s/*.nothing", g_tmp);
    snprintf(missing_log, sizeof missing_log, "%s/no/such/dir/x.jsonl", g_tmp);
    snprintf(msg[0], sizeof msg[0], "bigram: no data files match '%s'\n", missing_glob);
    snprintf(msg[1], sizeof msg[1],
             "bigram: weights file '%s' does not fit the program (1 problem): missing 'wte.weight' [64, 64]\n", bad_name);
    snprintf(msg[2], sizeof msg[2],
             "bigram: weights file '%s' does not fit the program (1 problem): 'wte.weight' is [64, 32] but the parameter "
             "is [64, 64]\n",
             bad_shape);
    snprintf(msg[3], sizeof msg[3], "bigram: cannot open the log file '%s': No such file or directory\n", missing_log);
    ErrCase cases[] = {
        {{NULL}, "bigram: no command given; 'bigram --help' lists the commands\n"},
        {{"trian"}, "bigram: unknown command 'trian' (did you mean 'train'?)\n"},
        {{"fit"}, "bigram: unknown command 'fit'; the commands are train, eval, generate and serve\n"},
        {{"serve"}, "bigram: serve needs --weights F.safetensors (the program names no weights file)\n"},
        {{"serve", "--port", "70000"}, "bigram: --port needs a whole number from 0 to 65535, not '70000'\n"},
        {{"serve", "--top-p", "0"}, "bigram: --top-p needs a fraction in (0, 1], not '0'\n"},
        {{"--steps", "3"}, "bigram: '--steps' before a command; the commands are train, eval, generate and serve (see --help)\n"},
        {{"train", "--stpes", "5"}, "bigram: unknown option '--stpes' for train (did you mean '--steps'?)\n"},
        {{"train", "--bogus"}, "bigram: unknown option '--bogus' for train (see --help)\n"},
        {{"train", "--prompt-tokens", "1"}, "bigram: option '--prompt-tokens' is not for train (it is for generate)\n"},
        {{"eval", "--log", "x"}, "bigram: option '--log' is not for eval (it is for train)\n"},
        {{"train", "--steps"}, "bigram: --steps needs a value\n"},
        {{"train", "--steps", "abc"}, "bigram: --steps needs a whole number from 0 to 9223372036854775807, not 'abc'\n"},
        {{"train", "--steps=-3"}, "bigram: --steps needs a whole number from 0 to 9223372036854775807, not '-3'\n"},
        {{"train", "--steps", "1e3"}, "bigram: --steps needs a whole number from 0 to 9223372036854775807, not '1e3'\n"},
        {{"eval", "--steps", "0"}, "bigram: --steps needs a whole number from 1 to 9223372036854775807, not '0'\n"},
        {{"train", "--threads", "0"}, "bigram: --threads needs a whole number from 1 to 64, not '0'\n"},
        {{"train", "--threads", "65"}, "bigram: --threads needs a whole number from 1 to 64, not '65'\n"},
        {{"train", "--seed", "-1"}, "bigram: --seed needs a whole number from 0 to 18446744073709551615, not '-1'\n"},
        {{"train", "--seed", "18446744073709551616"},
         "bigram: --seed needs a whole number from 0 to 18446744073709551615, not '18446744073709551616'\n"},
        {{"train", "--device", "tpu"}, "bigram: --device must be auto, cpu or cuda, not 'tpu'\n"},
        {{"train", "--device", "cuda"}, "bigram: --device cuda: the program was built without CUDA\n"},
        {{"train", "--data="}, "bigram: --data needs a value\n"},
        {{"train", "gpt2"}, "bigram: no train block 'gpt2' in this program (it has 'bigram')\n"},
        {{"train", "bigram", "extra"}, "bigram: unexpected argument 'extra' for train\n"},
        {{"generate", "--temperature", "-1"}, "bigram: --temperature needs a number of at least 0, not '-1'\n"},
        {{"generate", "--temperature", "nan"}, "bigram: --temperature needs a number of at least 0, not 'nan'\n"},
        {{"generate", "--top-k", "x"}, "bigram: --top-k needs a whole number from 0 to 9223372036854775807, not 'x'\n"},
        {{"generate", "--prompt-tokens", "1,x"}, "bigram: --prompt-tokens needs token ids separated by commas, not '1,x'\n"},
        {{"generate", "--prompt-tokens", "1,,2"}, "bigram: --prompt-tokens needs token ids separated by commas, not '1,,2'\n"},
        {{"generate", "--prompt-tokens", "99"}, "bigram: --prompt-tokens: token 99 is not below the vocabulary size 64\n"},
        {{"generate", "--print-logits=1"}, "bigram: --print-logits takes no value, not '1'\n"},
        {{"eval", "--print-logits"}, "bigram: option '--print-logits' is not for eval (it is for generate)\n"},
        {{"generate"}, "bigram: generate needs --weights F.safetensors (the program names no weights file)\n"},
        {{"generate", "--weights", "/nonexistent/w.safetensors"},
         "bigram: cannot open safetensors file '/nonexistent/w.safetensors': No such file or directory\n"},
        {{"train", "--data", "/nonexistent/x.bin"},
         "bigram: cannot open data shard '/nonexistent/x.bin': No such file or directory\n"},
        {{"train", "--data", missing_glob}, msg[0]},
        {{"train", "--data", g_train, "--init-weights", bad_name}, msg[1]},
        {{"eval", "--data", g_val, "--weights", bad_shape}, msg[2]},
        {{"train", "--data", g_train, "--log", missing_log}, msg[3]},
        {{"train", "--data", g_train, "--init-weights", inf_w}, "bigram: step 1, micro-batch 1: the loss is nan; stopping\n"},
        {{"train", "--data", g_train, "--log", "/dev/full"},
         "bigram: cannot write the log file '/dev/full': No space left on device\n"},
        {{"train", "--data", g_train, "--save-weights", "/nonexistent/dir/w.safetensors"},
         "bigram: cannot write the weights file '/nonexistent/dir/w.safetensors': directory '/nonexistent/dir': No such file or directory\n"},
        {{"eval"}, "bigram: cannot open data shard 'data/tiny_val.bin': No such file or directory\n"},
    };
    /* `eval` without --data reads the program's own val glob, relative to the working directory: make
     * sure it does not exist there (the tests run from the repository root, whose data/ may hold it) */
    int has_default_val = access("data/tiny_val.bin", F_OK) == 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ErrCase *c = &cases[i];
        if (has_default_val && c->args[0] && strcmp(c->args[0], "eval") == 0 && !c->args[1]) continue;
        char *argv[12];
        int n = 0;
        argv[n++] = g_bigram;
        for (int k = 0; k < 8 && c->args[k]; k++) argv[n++] = (char *)c->args[k];
        argv[n] = NULL;
        Run r = run_argv(argv);
        char what[256];
        snprintf(what, sizeof what, "case %zu (%s %s %s)", i, c->args[0] ? c->args[0] : "", c->args[1] ? c->args[1] : "",
                 c->args[2] ? c->args[2] : "");
        CHECK(r.status == 1, "%s: exit status %d, expected 1", what, r.status);
        CHECK_STR(r.err, c->message, what);
        run_free(&r);
    }
}

/* On a terminal the progress is one line redrawn with \r, ended by a newline. */
static void terminal_progress_line(void) {
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    CHECK(m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0, "cannot open a pseudo-terminal: %s", strerror(errno));
    if (m < 0) return;
    const char *slave = ptsname(m);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int s = open(slave, O_RDWR | O_NOCTTY);
        int devnull = open("/dev/null", O_WRONLY);
        if (s < 0 || devnull < 0 || dup2(s, 1) < 0 || dup2(devnull, 2) < 0) _exit(120);
        close(m);
        execl(g_bigram, g_bigram, "train", "--data", g_train, "--steps", "300", (char *)NULL);
        _exit(121);
    }
    /* read until the child's side closes (EIO on Linux once it exited and the data are drained) */
    Buf out = {0};
    char buf[4096];
    for (;;) {
        ssize_t n = read(m, buf, sizeof buf - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        buf[n] = 0;
        buf_printf(&out, "%s", buf);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    close(m);
    const char *o = buf_str(&out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK(strstr(o, "\rstep 300/300 | loss "), "no redrawn line for the last step");
    CHECK(strstr(o, " tok/s | ") && strstr(o, " ms/step | ETA "), "the line lacks tok/s, ms/step or ETA");
    CHECK(!strstr(o, "step 1/300: loss"), "plain lines on a terminal");
    CHECK(strstr(o, "\ndone: 300 steps") || strstr(o, "\r\ndone: 300 steps"), "the line is not ended before the summary");
    buf_free(&out);
}

int main(void) {
    g_ready = setup();
    if (!g_ready) {
        teardown();
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(reaches_bigram_loss);
    RUN(log_records);
    RUN(same_seed_same_bits);
    RUN(threads_do_not_matter);
    RUN(accumulation_equals_one_batch);
    RUN(weights_round_trip);
    RUN(initialisation_is_seed_and_name);
    RUN(generate_greedy_follows_argmax);
    RUN(generate_sampling_is_seeded);
    RUN(generate_print_logits);
    RUN(sampler_distribution);
    RUN(help_lists_every_flag);
    RUN(cli_errors);
    /* Without pseudo-terminals (some containers) the case cannot run: say so, never count it. */
    int pt = posix_openpt(O_RDWR | O_NOCTTY);
    if (pt >= 0) {
        close(pt);
        RUN(terminal_progress_line);
    } else {
        printf("SKIP terminal_progress_line: no pseudo-terminal (%s)\n", strerror(errno));
    }
    teardown();
    return unit_finish();
}
