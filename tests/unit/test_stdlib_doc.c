/* test_stdlib_doc.c - docs/stdlib.md against stdlib/MODULE.mbt, so that the reference cannot drift.
 *
 * The doc has a `## MODULE` section per stdlib file and a `### MODULE.NAME` entry per declaration,
 * whose code block holds the declaration's lines as the source writes them (the `model`, `fn` or
 * `optimizer` line and each of its `fn` lines, without the ` {`) and whose table rows
 * "| `NAME` | `DEFINITION` |" are the model's `NAME = DEFINITION` lines. Checked: every top-level
 * declaration of stdlib/MODULE.mbt has its entry with the same lines in the same order, every
 * `param` line of a model is in its table, every table row is a line of the model, and every
 * entry names a declaration that exists. Run from the repository root. */
#include "unit.h"
#include <ctype.h>
#include <dirent.h>

#define MAX_ENTRIES 64
#define MAX_LINES 48

typedef struct Entry {
    char mod[32], name[64];
    char *code[MAX_LINES]; /* the declaration's lines (doc: its code block) */
    int ncode;
    char *rows[MAX_LINES]; /* `NAME = DEFINITION` lines (source: param lines; doc: table rows) */
    int nrows;
    char *body[MAX_LINES * 2]; /* source only: every line of the body, normalised */
    int nbody;
} Entry;

typedef struct Side {
    Entry e[MAX_ENTRIES];
    int n;
} Side;

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    Buf b = {0};
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) buf_printf(&b, "%.*s", (int)got, chunk);
    fclose(f);
    return b.p ? b.p : strdup("");
}

/* A line with its `#` comment, its trailing ` {`, surrounding blanks and repeated blanks removed. */
static char *norm(const char *s, size_t n) {
    char *o = malloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n && s[i] != '#'; i++) {
        if (isspace((unsigned char)s[i])) {
            if (k > 0 && o[k - 1] != ' ') o[k++] = ' ';
        } else {
            o[k++] = s[i];
        }
    }
    while (k > 0 && o[k - 1] == ' ') k--;
    if (k >= 2 && o[k - 1] == '{' && o[k - 2] == ' ') k -= 2;
    o[k] = 0;
    return o;
}

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* The declaration's name: the identifier after `model `, `fn ` or `optimizer `. */
static void decl_name(const char *line, char *name, size_t cap) {
    const char *p = strchr(line, ' ') + 1;
    size_t k = 0;
    while ((isalnum((unsigned char)p[k]) || p[k] == '_') && k + 1 < cap) k++;
    snprintf(name, cap, "%.*s", (int)k, p);
}

static int is_decl(const char *line) { return starts(line, "model ") || starts(line, "fn ") || starts(line, "optimizer "); }

/* Reads stdlib/MOD.mbt's top-level declarations into s. */
static void read_source(Side *s, const char *mod, const char *text) {
    Entry *cur = NULL;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (is_decl(p) && s->n < MAX_ENTRIES) {
            cur = &s->e[s->n++];
            snprintf(cur->mod, sizeof cur->mod, "%s", mod);
            cur->code[cur->ncode++] = norm(p, n);
            decl_name(p, cur->name, sizeof cur->name);
        } else if (*p == '}') {
            cur = NULL;
        } else if (cur && n > 0) {
            char *l = norm(p, n);
            if (starts(p, "  fn ") && cur->ncode < MAX_LINES) cur->code[cur->ncode++] = strdup(l);
            if (strstr(l, " = param ") && cur->nrows < MAX_LINES) cur->rows[cur->nrows++] = strdup(l);
            if (cur->nbody < MAX_LINES * 2) cur->body[cur->nbody++] = l;
            else free(l);
        }
        p += n + (e ? 1 : 0);
    }
}

/* A table row "| `NAME` | `DEFINITION` |" as "NAME = DEFINITION", or NULL. */
static char *table_row(const char *p, size_t n) {
    char name[128], def[512];
    char *line = strndup(p, n);
    char *r = NULL;
    if (sscanf(line, "| `%127[^`]` | `%511[^`]` |", name, def) == 2) {
        size_t k = strlen(name) + strlen(def) + 4;
        r = malloc(k);
        snprintf(r, k, "%s = %s", name, def);
        char *nr = norm(r, strlen(r));
        free(r);
        r = nr;
    }
    free(line);
    return r;
}

/* Reads docs/stdlib.md's entries into d; problems with its own structure go to err. */
static void read_doc(Side *d, const char *text, Buf *err) {
    char mod[32] = "";
    Entry *cur = NULL;
    int in_code = 0, lineno = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        lineno++;
        if (starts(p, "```")) {
            in_code = !in_code;
        } else if (in_code) {
            if (cur && (is_decl(p) || starts(p, "  fn ")) && cur->ncode < MAX_LINES) cur->code[cur->ncode++] = norm(p, n);
        } else if (starts(p, "### ") && d->n < MAX_ENTRIES) {
            cur = &d->e[d->n++];
            snprintf(cur->mod, sizeof cur->mod, "%s", mod);
            char *h = norm(p + 4, n - 4);
            size_t ml = strlen(mod);
            if (strncmp(h, mod, ml) != 0 || h[ml] != '.')
                buf_printf(err, "docs/stdlib.md:%d: entry '%s' is not under its module's section (## %s)\n", lineno, h, mod);
            snprintf(cur->name, sizeof cur->name, "%s", strchr(h, '.') ? strchr(h, '.') + 1 : h);
            free(h);
        } else if (starts(p, "## ")) {
            char *h = norm(p + 3, n - 3);
            snprintf(mod, sizeof mod, "%s", h);
            free(h);
            cur = NULL;
        } else if (cur) {
            char *r = table_row(p, n);
            if (r && cur->nrows < MAX_LINES) cur->rows[cur->nrows++] = r;
            else free(r);
        }
        p += n + (e ? 1 : 0);
    }
}

static Entry *find(Side *s, const char *mod, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->e[i].mod, mod) == 0 && strcmp(s->e[i].name, name) == 0) return &s->e[i];
    return NULL;
}

static int has_line(char *const *lines, int n, const char *l) {
    for (int i = 0; i < n; i++)
        if (strcmp(lines[i], l) == 0) return 1;
    return 0;
}

/* One source declaration against its doc entry. */
static void compare_entry(const Entry *s, const Entry *d, Buf *err) {
    int n = s->ncode > d->ncode ? s->ncode : d->ncode;
    for (int i = 0; i < n; i++) {
        const char *a = i < s->ncode ? s->code[i] : "(nothing)", *b = i < d->ncode ? d->code[i] : "(nothing)";
        if (strcmp(a, b) != 0)
            buf_printf(err, "%s.%s: stdlib/%s.mbt has `%s`, docs/stdlib.md has `%s`\n", s->mod, s->name, s->mod, a, b);
    }
    for (int i = 0; i < s->nrows; i++)
        if (!has_line(d->rows, d->nrows, s->rows[i]))
            buf_printf(err, "%s.%s: `%s` is not in docs/stdlib.md's table\n", s->mod, s->name, s->rows[i]);
    for (int i = 0; i < d->nrows; i++)
        if (!has_line(s->body, s->nbody, d->rows[i]))
            buf_printf(err, "%s.%s: docs/stdlib.md's row `%s` is not a line of stdlib/%s.mbt\n", s->mod, s->name, d->rows[i],
                       s->mod);
}

static const char *MODS[] = {"nn", "optim", "lr"};
#define NMODS ((int)(sizeof MODS / sizeof MODS[0]))

/* Every difference between the sources (MODS[i]'s text in srcs[i]) and the doc, one a line. */
static void check_doc(const char *const *srcs, const char *doc, Buf *err) {
    static Side s, d;
    memset(&s, 0, sizeof s);
    memset(&d, 0, sizeof d);
    for (int i = 0; i < NMODS; i++) read_source(&s, MODS[i], srcs[i]);
    read_doc(&d, doc, err);
    for (int i = 0; i < s.n; i++) {
        Entry *de = find(&d, s.e[i].mod, s.e[i].name);
        if (!de)
            buf_printf(err, "%s.%s (stdlib/%s.mbt) is not documented in docs/stdlib.md\n", s.e[i].mod, s.e[i].name, s.e[i].mod);
        else compare_entry(&s.e[i], de, err);
    }
    for (int i = 0; i < d.n; i++)
        if (!find(&s, d.e[i].mod, d.e[i].name))
            buf_printf(err, "docs/stdlib.md documents %s.%s, which stdlib/%s.mbt does not define\n", d.e[i].mod, d.e[i].name,
                       d.e[i].mod);
}

static char *g_src[NMODS], *g_doc;

static void load(void) {
    for (int i = 0; i < NMODS; i++) {
        char path[64];
        snprintf(path, sizeof path, "stdlib/%s.mbt", MODS[i]);
        g_src[i] = read_all(path);
    }
    g_doc = read_all("docs/stdlib.md");
}

static int loaded(void) {
    for (int i = 0; i < NMODS; i++) CHECK(g_src[i], "cannot read stdlib/%s.mbt (run from the repository root)", MODS[i]);
    CHECK(g_doc, "cannot read docs/stdlib.md (run from the repository root)");
    if (!g_doc) return 0;
    for (int i = 0; i < NMODS; i++)
        if (!g_src[i]) return 0;
    return 1;
}

/* Each stdlib module is a file the table above names: a new one needs a section here too. */
static void t_stdlib_doc_modules(void) {
    DIR *dir = opendir("stdlib");
    CHECK(dir, "cannot open stdlib/ (run from the repository root)");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".mbt") != 0) continue;
        int known = 0;
        for (int i = 0; i < NMODS; i++) known |= strlen(MODS[i]) == n - 4 && strncmp(e->d_name, MODS[i], n - 4) == 0;
        CHECK(known, "stdlib/%s is not checked against docs/stdlib.md (add it to MODS)", e->d_name);
    }
    closedir(dir);
}

static void t_stdlib_doc_matches_sources(void) {
    if (!loaded()) return;
    Buf err = {0};
    check_doc((const char *const *)g_src, g_doc, &err);
    CHECK(err.n == 0, "docs/stdlib.md differs from stdlib/*.mbt");
    if (err.n) unit_detail("differences", err.p);
    static Side s;
    for (int i = 0; i < NMODS; i++) read_source(&s, MODS[i], g_src[i]);
    CHECK(s.n >= 20, "only %d declarations read from stdlib/*.mbt", s.n);
}

/* The doc with its first FROM replaced by TO (FROM must occur). */
static char *replaced(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    CHECK(at, "'%s' not found", from);
    if (!at) return strdup(text);
    Buf b = {0};
    buf_printf(&b, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return b.p;
}

/* check_doc on the doc (or one source) edited so: its report must contain WANT. */
static void drifted(int src, const char *from, const char *to, const char *want) {
    char *srcs[NMODS];
    for (int i = 0; i < NMODS; i++) srcs[i] = g_src[i];
    char *doc = g_doc;
    if (src < 0) doc = replaced(g_doc, from, to);
    else srcs[src] = replaced(g_src[src], from, to);
    Buf err = {0};
    check_doc((const char *const *)srcs, doc, &err);
    CHECK(err.p && strstr(err.p, want), "editing '%s' to '%s': no report containing '%s'", from, to, want);
    if (!err.p || !strstr(err.p, want)) unit_detail("report", err.p ? err.p : "(none)");
}

/* The check catches each kind of drift (so that a passing t_stdlib_doc_matches_sources means something). */
static void t_stdlib_doc_drift_caught(void) {
    if (!loaded()) return;
    /* a default changed in the source, or in the doc */
    drifted(2, "min_ratio = 0.1)", "min_ratio = 0.2)",
            "lr.cosine: stdlib/lr.mbt has `fn cosine(step, warmup, total, min_ratio = 0.2) -> f32`");
    drifted(-1, "eps = 1e-8,", "eps = 1e-7,", "optim.adamw: stdlib/optim.mbt has");
    /* a parameter renamed, or a forward's shape changed */
    drifted(0, "model MLP(d, hidden, pdrop = 0.0)", "model MLP(d, inner, pdrop = 0.0)",
            "nn.MLP: stdlib/nn.mbt has `model MLP(d, inner, pdrop = 0.0)`");
    drifted(0, "fn forward(idx: i32[B, T]) -> f32[B, T, d]", "fn forward(idx: i32[B, T]) -> f32[B, T, n]",
            "nn.Embedding: stdlib/nn.mbt has `fn forward(idx: i32[B, T]) -> f32[B, T, n]`");
    /* a weight's shape changed, a weight added */
    drifted(0, "weight = param f32[n, d]", "weight = param f32[d, n]",
            "nn.Embedding: `weight = param f32[d, n] ~ normal(0, 0.02)` is not in");
    drifted(0, "weight = param f32[d] ~ ones\n\n", "weight = param f32[d] ~ ones\n  shift = param f32[d] ~ zeros\n\n",
            "nn.RMSNorm: `shift = param f32[d] ~ zeros` is not in");
    /* a declaration added to the source; one documented that does not exist */
    drifted(2, "# The base lr throughout.",
            "fn step_decay(step, every = 100) -> f32 {\n  return 1.0\n}\n\n# The base lr throughout.",
            "lr.step_decay (stdlib/lr.mbt) is not documented");
    drifted(-1, "### lr.power", "### lr.exponential\n\n```\nfn exponential(step, gamma = 0.99) -> f32\n```\n\n### lr.power",
            "documents lr.exponential, which stdlib/lr.mbt does not define");
    drifted(-1, "### lr.power", "### lr.Power", "documents lr.Power");
}

int main(void) {
    load();
    RUN(t_stdlib_doc_modules);
    RUN(t_stdlib_doc_matches_sources);
    RUN(t_stdlib_doc_drift_caught);
    return unit_finish();
}
