/* sema.c - the semantic checker's driver: modules and imports, top-level declarations, scopes
 * and name lookup, diagnostics reported once each, "did you mean" suggestions.
 *
 * Pipeline position: AST (parse.h) -> [sema] -> graph IR. sema_check walks the main module:
 * each module's declarations are collected into its scope (imports are checked first, once
 * each), then every model, function and optimizer is checked on its own with its constants
 * symbolic (eval.c), then every train and serve block instantiates its model with concrete
 * constants and checks its settings (settings.c). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sema_internal.h"

/* ---- hashing ---- */

static uint32_t hash_bytes(const char *p, uint32_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (uint32_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* ---- scopes ---- */

Scope *scope_new(Sema *s, Scope *parent, ScopeKind kind, const char *name, Module *m) {
    Scope *sc = arena_alloc(s->ar, sizeof(Scope));
    sc->parent = parent;
    sc->kind = kind;
    sc->name = name ? name : "";
    sc->module = m ? m : parent ? parent->module : NULL;
    return sc;
}

/* Rebuilds the hash index over sc->e[0..n) with at least 2n slots. */
static void scope_reindex(Sema *s, Scope *sc, int want) {
    int icap = 16;
    while (icap < want * 2) icap *= 2;
    sc->index = arena_alloc(s->ar, sizeof(int) * (size_t)icap);
    sc->icap = icap;
    for (int i = 0; i < sc->n; i++) {
        uint32_t h = hash_bytes(sc->e[i].name.p, sc->e[i].name.len) & (uint32_t)(icap - 1);
        while (sc->index[h]) h = (h + 1) & (uint32_t)(icap - 1);
        sc->index[h] = i + 1;
    }
}

/* Most scopes (a call's locals, a small model) hold a handful of names: they are searched
 * linearly, and a hash index is built only past SCOPE_LINEAR entries. */
#define SCOPE_LINEAR 8

Entry *scope_find(Scope *sc, Str name) {
    if (!sc) return NULL;
    if (!sc->icap) {
        for (int i = 0; i < sc->n; i++)
            if (str_eq(sc->e[i].name, name)) return &sc->e[i];
        return NULL;
    }
    uint32_t h = hash_bytes(name.p, name.len) & (uint32_t)(sc->icap - 1);
    while (sc->index[h]) {
        Entry *e = &sc->e[sc->index[h] - 1];
        if (str_eq(e->name, name)) return e;
        h = (h + 1) & (uint32_t)(sc->icap - 1);
    }
    return NULL;
}

Entry *scope_lookup(Scope *sc, Str name, Scope **where) {
    for (int guard = 0; sc && guard < 1000; sc = sc->parent, guard++) {
        Entry *e = scope_find(sc, name);
        if (e) {
            if (where) *where = sc;
            return e;
        }
    }
    return NULL;
}

Entry *scope_define(Sema *s, Scope *sc, Str name, Value *v, EntryKind k, Span decl) {
    Entry *e = scope_find(sc, name);
    if (e) {
        e->v = v;
        e->kind = k;
        e->decl = decl;
        return e;
    }
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 4;
        Entry *ne = arena_alloc(s->ar, sizeof(Entry) * (size_t)cap);
        if (sc->n) memcpy(ne, sc->e, sizeof(Entry) * (size_t)sc->n);
        sc->e = ne;
        sc->cap = cap;
    }
    sc->e[sc->n] = (Entry){name, v, k, decl};
    sc->n++;
    if (sc->n <= SCOPE_LINEAR && !sc->icap) return &sc->e[sc->n - 1];
    if (sc->n * 2 > sc->icap) scope_reindex(s, sc, sc->n);
    else {
        uint32_t h = hash_bytes(name.p, name.len) & (uint32_t)(sc->icap - 1);
        while (sc->index[h]) h = (h + 1) & (uint32_t)(sc->icap - 1);
        sc->index[h] = sc->n;
    }
    return &sc->e[sc->n - 1];
}

ScopeSnap scope_snapshot(Sema *s, Scope *sc) {
    ScopeSnap snap = {NULL, sc->n};
    if (sc->n) snap.e = arena_dup(s->ar, sc->e, sizeof(Entry) * (size_t)sc->n);
    return snap;
}

void scope_restore(Sema *s, Scope *sc, ScopeSnap snap) {
    if (snap.n > sc->cap) {
        sc->e = arena_alloc(s->ar, sizeof(Entry) * (size_t)snap.n);
        sc->cap = snap.n;
    }
    if (snap.n) memcpy(sc->e, snap.e, sizeof(Entry) * (size_t)snap.n);
    sc->n = snap.n;
    if (sc->n <= SCOPE_LINEAR) {
        sc->index = NULL;
        sc->icap = 0;
    } else {
        scope_reindex(s, sc, sc->n);
    }
}

/* ---- node bookkeeping ---- */

void **ptrmap_slot(Arena *ar, PtrMap *m, const void *key, int *fresh) {
    if (m->n * 2 >= m->cap) { /* grow and rehash */
        int cap = m->cap ? m->cap * 2 : 64;
        const void **keys = arena_alloc(ar, sizeof(void *) * (size_t)cap);
        void **val = arena_alloc(ar, sizeof(void *) * (size_t)cap);
        for (int i = 0; i < m->cap; i++) {
            if (!m->key[i]) continue;
            uint32_t h = hash_ptr(m->key[i]) & (uint32_t)(cap - 1);
            while (keys[h]) h = (h + 1) & (uint32_t)(cap - 1);
            keys[h] = m->key[i];
            val[h] = m->val[i];
        }
        m->key = keys;
        m->val = val;
        m->cap = cap;
    }
    uint32_t h = hash_ptr(key) & (uint32_t)(m->cap - 1);
    *fresh = 0;
    while (m->key[h]) {
        if (m->key[h] == key) return &m->val[h];
        h = (h + 1) & (uint32_t)(m->cap - 1);
    }
    m->key[h] = key;
    m->n++;
    *fresh = 1;
    return &m->val[h];
}

NodeInfo *sema_info(Sema *s, const Node *n) {
    int fresh;
    void **slot = ptrmap_slot(s->keep, &s->info, n, &fresh);
    if (fresh) *slot = arena_alloc(s->keep, sizeof(NodeInfo));
    return *slot;
}

/* ---- diagnostics ---- */

/* Adds key to the set; returns 0 when it was there already. */
static int strset_add(Sema *s, StrSet *set, const char *key) {
    if (set->n * 2 >= set->cap) {
        int cap = set->cap ? set->cap * 2 : 64;
        const char **v = arena_alloc(s->keep, sizeof(char *) * (size_t)cap);
        for (int i = 0; i < set->cap; i++) {
            if (!set->v[i]) continue;
            uint32_t h = hash_bytes(set->v[i], (uint32_t)strlen(set->v[i])) & (uint32_t)(cap - 1);
            while (v[h]) h = (h + 1) & (uint32_t)(cap - 1);
            v[h] = set->v[i];
        }
        set->v = v;
        set->cap = cap;
    }
    uint32_t h = hash_bytes(key, (uint32_t)strlen(key)) & (uint32_t)(set->cap - 1);
    while (set->v[h]) {
        if (strcmp(set->v[h], key) == 0) return 0;
        h = (h + 1) & (uint32_t)(set->cap - 1);
    }
    set->v[h] = key;
    set->n++;
    return 1;
}

static char *vformat(Sema *s, const char *fmt, va_list ap) {
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (n < 0) n = 0;
    char *q = arena_alloc(s->ar, (size_t)n + 1);
    vsnprintf(q, (size_t)n + 1, fmt, ap);
    return q;
}

/* The same body is evaluated several times (checked on its own, then inline at every call with
 * other arguments), so the same mistake can be found more than once: only the first is shown. */
int sema_error(Sema *s, Span at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(s, fmt, ap);
    va_end(ap);
    char *key = arena_printf(s->keep, "%u:%u:%s", at.file, at.off, msg);
    if (!strset_add(s, &s->reported, key)) {
        s->muted = 1;
        s->muted_at = diag_error_count();
        return 0;
    }
    s->muted = 0;
    diag_error(at, "%s", msg);
    return 1;
}

/* Notes and hints belong to the last error: dropped when that was a repeat of ours (an error
 * reported since by another part of the compiler un-mutes). */
static int sema_is_muted(Sema *s) { return s->muted && s->muted_at == diag_error_count(); }

void sema_note(Sema *s, Span at, const char *fmt, ...) {
    if (sema_is_muted(s)) return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(s, fmt, ap);
    va_end(ap);
    diag_note(at, "%s", msg);
}

void sema_hint(Sema *s, const char *fmt, ...) {
    if (sema_is_muted(s)) return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(s, fmt, ap);
    va_end(ap);
    diag_hint("%s", msg);
}

/* ---- suggestions ---- */

void suggest_init(Suggest *g, Str name) {
    g->name = name;
    g->limit = name.len <= 3 ? 1 : 2;
    g->best = g->limit + 1;
    g->pick = NULL;
    g->picklen = 0;
}

void suggest_try(Suggest *g, const char *cand, uint32_t len) {
    if (!cand || len == 0) return;
    if (len == g->name.len && memcmp(cand, g->name.p, len) == 0) return; /* the name itself */
    int d = diag_edit_distance(g->name.p, g->name.len, cand, len, g->limit);
    if (d >= (int)g->name.len) return; /* nothing in common: 'c' is no typo of 'a' */
    if (d < g->best) {                 /* first seen wins ties: the innermost scope comes first */
        g->best = d;
        g->pick = cand;
        g->picklen = len;
    }
}

void suggest_scope(Suggest *g, Scope *sc, int chain) {
    for (int guard = 0; sc && guard < 1000; sc = sc->parent, guard++) {
        for (int i = 0; i < sc->n; i++)
            if (sc->e[i].kind != ENT_BLOCK) suggest_try(g, sc->e[i].name.p, sc->e[i].name.len);
        if (!chain) break;
    }
}

void suggest_builtins(Suggest *g) {
    int n = builtin_count();
    for (int i = 0; i < n; i++) {
        const char *b = builtin_name_at(i);
        if (b) suggest_try(g, b, (uint32_t)strlen(b));
    }
    suggest_try(g, "pi", 2);
}

void sema_hint_suggest(Sema *s, const Suggest *g) {
    if (g->pick) sema_hint(s, "did you mean '%.*s'?", (int)g->picklen, g->pick);
}

/* ---- text for messages ---- */

char *sema_cstr(Sema *s, Str x) { return arena_strndup(s->ar, x.p ? x.p : "", x.p ? x.len : 0); }

Span sema_span_of(const Node *n, Str piece) {
    uint32_t len;
    const char *text = diag_source_text(n->span.file, &len);
    if (!piece.p || n->span.file == 0 || piece.p < text || piece.p + piece.len > text + len) return n->span;
    uint32_t off = (uint32_t)(piece.p - text);
    if (off < n->span.off) return n->span;
    Span sp = n->span;
    for (uint32_t i = n->span.off; i < off; i++) {
        if (text[i] == '\n') {
            sp.line++;
            sp.col = 1;
        } else {
            sp.col++;
        }
    }
    sp.off = off;
    sp.len = piece.len;
    return sp;
}

/* ---- evaluation limits ---- */

/* Both limits grow with the source, so that checking stays linear in its size: a large program
 * of ordinary declarations is never refused (the step budget allows 8 times what such code takes,
 * and each declaration's values are dropped once it is checked), while a loop of loops or a
 * chain of calls that multiplies the work is refused where it runs out, in bounded time and
 * memory (docs/cli.md, Limits). */
static long step_budget(const Sema *s) { return SEMA_STEP_BUDGET + SEMA_STEPS_PER_BYTE * (long)s->ld->bytes; }

/* Bytes evaluation may hold beyond the sources and syntax trees there were at the start. */
static size_t eval_budget(const Sema *s) {
    return ((size_t)SEMA_MAX_EVAL_MIB << 20) + (size_t)SEMA_EVAL_BYTES_PER_BYTE * s->ld->bytes;
}

int sema_enter(Sema *s, Span at) {
    if (s->over_budget) return 0;
    if (++s->steps > step_budget(s)) {
        s->over_budget = 1;
        sema_error(s, at, "this program is too large to check: more than %ld evaluation steps", step_budget(s));
        diag_hint("the checker evaluates every loop and call: a loop of loops or calls that multiply take a step each "
                  "(the limit is %ld steps plus %ld a source byte)",
                  SEMA_STEP_BUDGET, SEMA_STEPS_PER_BYTE);
        return 0;
    }
    if (arena_live_bytes() > s->mem0 + eval_budget(s)) {
        s->over_budget = 1;
        sema_error(s, at, "this program is too large to check: evaluating it needs more than %zu MiB", eval_budget(s) >> 20);
        diag_hint("the checker evaluates every loop and call: a loop of loops or calls that multiply hold values for "
                  "each (the limit is %ld MiB plus %ld bytes a source byte, beyond the sources' syntax trees)",
                  SEMA_MAX_EVAL_MIB, SEMA_EVAL_BYTES_PER_BYTE);
        return 0;
    }
    if (s->nest >= SEMA_MAX_NEST) {
        if (!s->nest_reported)
            sema_error(s, at, "expressions and calls are nested too deeply here (more than %d levels)", SEMA_MAX_NEST);
        s->nest_reported = 1;
        return 0;
    }
    s->nest++;
    return 1;
}

void sema_leave(Sema *s) {
    if (s->nest > 0) s->nest--;
}

/* ---- modules ---- */

static void sema_check_module(Sema *s, Module *m);

/* Records the functions of a model or optimizer body as owned by it. */
static void register_members(Sema *s, const Node *owner, Scope *modscope, Module *m) {
    for (int i = 0; i < owner->list2.n; i++) {
        const Node *it = owner->list2.v[i];
        if (!it || it->kind != N_FN) continue;
        NodeInfo *inf = sema_info(s, it);
        inf->owner = owner;
        inf->defscope = modscope;
        inf->module = m;
    }
}

static void collect_decl(Sema *s, Module *m, const Node *d) {
    Str name = d->name;
    Span name_at = sema_span_of(d, d->name);
    Value *v = NULL;
    EntryKind kind = ENT_DECL;
    switch (d->kind) {
    case N_IMPORT: {
        if (d->alias.len) {
            name = d->alias;
            name_at = sema_span_of(d, d->alias);
        }
        Span mod_at = sema_span_of(d, d->name);
        Module *im = loader_import(s->ld, m, d->name, mod_at);
        if (im && im->state == 1) {
            /* Still being checked: this import closes a cycle. */
            const char *chain = "";
            int k = s->module_depth - 1;
            while (k > 0 && s->modules[k] != im) k--;
            for (int i = k; i < s->module_depth; i++) chain = arena_printf(s->ar, "%s%s -> ", chain, s->modules[i]->name);
            if (sema_error(s, mod_at, "import cycle: %s%s", chain, im->name))
                sema_hint(s, "move what the modules share into a module that imports neither");
            im = NULL;
        } else if (im && im->broken) {
            im = NULL; /* its syntax errors are reported; what it defines is unknown, not missing */
        } else if (im && im->state == 0) {
            if (s->module_depth >= SEMA_MAX_MODULE_DEPTH) {
                sema_error(s, mod_at, "imports are nested more than %d deep", SEMA_MAX_MODULE_DEPTH);
                im = NULL;
            } else {
                sema_check_module(s, im);
            }
        }
        if (im && im->scope) {
            v = value_new(s->ar, V_MODULE, d->span);
            v->scope = im->scope;
            v->s = im->scope->name;
        } else {
            v = value_unknown(s->ar, d->span);
        }
        kind = ENT_IMPORT;
        break;
    }
    case N_MODEL:
    case N_OPTIMIZER:
    case N_FN: {
        v = value_new(s->ar, d->kind == N_MODEL ? V_MODEL_DEF : d->kind == N_FN ? V_FN : V_OPTIMIZER_DEF, d->span);
        v->node = d;
        v->scope = m->scope;
        NodeInfo *inf = sema_info(s, d);
        inf->defscope = m->scope;
        inf->module = m;
        if (d->kind != N_FN) register_members(s, d, m->scope, m);
        break;
    }
    case N_TRAIN:
    case N_SERVE: kind = ENT_BLOCK; break;
    default: return; /* the parser produces nothing else at top level */
    }
    if (!name.len) return;
    Entry *old = scope_find(m->scope, name);
    if (old) {
        if (sema_error(s, name_at, "redefinition of '%.*s'", STR_ARG(name)))
            sema_note(s, old->decl, "'%.*s' was first defined here", STR_ARG(name));
        return;
    }
    scope_define(s, m->scope, name, v, kind, name_at);
}

/* Checks one declaration on its own in a scratch arena: what it allocates (instances, values,
 * dims, scopes) is garbage once it is done - later calls only need its NodeInfo - and a large
 * program would otherwise keep all of it. */
static void check_decl_on_its_own(Sema *s, const Node *d) {
    Arena scratch = {0};
    Arena *outer = s->ar;
    s->ar = &scratch;
    if (d->kind == N_MODEL) eval_check_model(s, d);
    else if (d->kind == N_FN) eval_check_fn(s, d);
    else if (d->kind == N_OPTIMIZER) eval_check_optimizer(s, d);
    s->ar = outer;
    arena_free(&scratch);
}

static void sema_check_module(Sema *s, Module *m) {
    if (!m || m->state != 0) return; /* checked, or being checked (an import cycle) */
    if (s->module_depth >= SEMA_MAX_MODULE_DEPTH) return;
    m->state = 1;
    s->modules[s->module_depth++] = m;
    Arena *outer = s->ar;
    s->ar = s->keep; /* module scopes and settings live as long as the program */
    m->scope = scope_new(s, NULL, SC_MODULE, m->name, m);
    const Node *prog = m->ast;
    if (!prog) {
        m->state = 2;
        s->module_depth--;
        s->ar = outer;
        return;
    }
    /* 1: names first (imports are checked as they come), so declarations may use each other
     * in any order. */
    for (int i = 0; i < prog->list.n; i++)
        if (prog->list.v[i]) collect_decl(s, m, prog->list.v[i]);
    /* 2: every model, function and optimizer on its own. */
    for (int i = 0; i < prog->list.n; i++) {
        const Node *d = prog->list.v[i];
        if (d && (d->kind == N_MODEL || d->kind == N_FN || d->kind == N_OPTIMIZER) && !sema_info(s, d)->generic)
            check_decl_on_its_own(s, d);
    }
    /* 3: train and serve blocks instantiate and check the whole step. */
    for (int i = 0; i < prog->list.n; i++) {
        const Node *d = prog->list.v[i];
        if (!d) continue;
        if (d->kind == N_TRAIN) settings_check_train(s, m, d);
        else if (d->kind == N_SERVE) settings_check_serve(s, m, d);
    }
    m->state = 2;
    s->module_depth--;
    s->ar = outer;
}

/* ---- entry points ---- */

int sema_run_build(Loader *ld, Module *main, SemaResult *out, GraphBuilder *gb, const Node *train) {
    int before = diag_error_count();
    Sema s;
    memset(&s, 0, sizeof s);
    s.ar = ld->ar;
    s.keep = ld->ar;
    s.ld = ld;
    s.mem0 = arena_live_bytes();
    s.out = out;
    s.gb_want = gb;
    s.gb_train = train;
    sema_check_module(&s, main);
    return diag_error_count() - before;
}

int sema_run(Loader *ld, Module *main, SemaResult *out) { return sema_run_build(ld, main, out, NULL, NULL); }

int sema_check(Loader *ld, Module *main) {
    SemaResult res;
    memset(&res, 0, sizeof res);
    return sema_run(ld, main, &res);
}
