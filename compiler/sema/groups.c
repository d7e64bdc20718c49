/* groups.c - parameter groups: the parameters a train block freezes and the parameters its
 * optimizer does not decay.
 *
 * Pipeline position: sema (settings.c checks the train block and calls in here) -> the graph
 * builder, which gets each parameter's group as bits on its G_PARAM (graph.h: GP_FROZEN,
 * GP_NO_DECAY) and lays the parameters out by group (graph_build.c, gb_update_begin).
 *
 * Three ways in, all checked at --check:
 *   - `freeze = ["h.0.*", "wte"]` in a train block: the parameters matched are frozen;
 *   - `trainable = false` in any model's instantiation (`nn.Linear(d, d, trainable = false)`,
 *     eval_call.c): every parameter under that instance is frozen;
 *   - `no_decay = ["@1d", "wte"]` in any optimizer call that has a hyper-parameter weight_decay
 *     (eval_call.c keeps the list on the V_OPTIMIZER): the parameters matched get weight_decay 0.
 * A pattern is a glob over a parameter's dotted name, matched against the whole name: `*` is any
 * run of characters (dots included), `?` one character; `h.*.attn.*` matches every attention
 * parameter of every block. A kind starts with `@`: `@1d` is every parameter with fewer than two
 * dimensions (biases and the norms' gains and biases), nanoGPT's and llm.c's rule for what is not
 * decayed. A pattern or kind that matches no parameter is an error: a typo must not quietly
 * leave the setting without effect. */
#include <string.h>

#include "eval_internal.h"
#include "sema_internal.h"

typedef struct GParam {
    const char *name; /* the dotted path, as the graph builder names it */
    int rank;
    Value *v; /* the parameter's value (its graph_id is the builder's node) */
    int frozen;
} GParam;

typedef struct GList {
    GParam *p;
    int n, cap;
} GList;

static void glist_push(Arena *ar, GList *l, GParam p) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        GParam *np = arena_alloc(ar, sizeof(GParam) * (size_t)cap);
        if (l->n) memcpy(np, l->p, sizeof(GParam) * (size_t)l->n);
        l->p = np;
        l->cap = cap;
    }
    l->p[l->n++] = p;
}

/* A parameter of the walk (sema_walk_models: the paths build.c names them by), with the frozen
 * inherited from an instance made with trainable = false. */
static void collect(SemaWalk *w, Entry *e, const char *name, int frozen) {
    if (e->v->kind == V_TENSOR) glist_push(w->s->ar, w->ctx, (GParam){name, e->v->t.rank, e->v, frozen});
}

static GList params_of(Sema *s, Value *model) {
    GList l = {0};
    SemaWalk w = {.s = s, .ctx = &l, .param = collect};
    sema_walk_models(&w, model);
    return l;
}

/* ---- patterns ---- */

static const char *const kinds[] = {"@1d"};
enum { NKINDS = sizeof kinds / sizeof *kinds };

/* Glob match of the whole name: `*` any run (dots included), `?` one character. */
static int glob_match(const char *pat, const char *name) {
    const char *star = NULL, *resume = NULL;
    while (*name) {
        if (*pat == '?' || (*pat && *pat != '*' && *pat == *name)) {
            pat++;
            name++;
        } else if (*pat == '*') {
            star = pat++;
            resume = name;
        } else if (star) {
            pat = star + 1;
            name = ++resume;
        } else return 0;
    }
    while (*pat == '*') pat++;
    return *pat == 0;
}

static int pattern_matches(const char *pat, const GParam *p) {
    if (pat[0] == '@') return strcmp(pat, "@1d") == 0 && p->rank < 2;
    return glob_match(pat, p->name);
}

/* 1 when item (a string of the list `what`) is a well-formed pattern or a known kind; else reported. */
static int pattern_ok(Sema *s, const Value *item, const char *what) {
    if (!item || item->kind == V_UNKNOWN) return 0;
    if (item->kind != V_STRING || !item->s) {
        if (sema_error(s, item->origin, "each entry of '%s' must be a string, but this is %s", what, value_describe(s->ar, item)))
            sema_hint(s, "a name pattern such as \"h.*.attn.*\", or a kind such as \"@1d\"");
        return 0;
    }
    const char *p = item->s;
    if (!*p) {
        sema_error(s, item->origin, "an empty pattern in '%s' matches no parameter", what);
        return 0;
    }
    if (p[0] == '@') {
        for (int k = 0; k < NKINDS; k++)
            if (strcmp(p, kinds[k]) == 0) return 1;
        if (sema_error(s, item->origin,
                       "'%s' is not a kind of parameter; the kinds are: @1d (fewer than two dimensions: biases and norms)", p)) {
            Suggest g;
            suggest_init(&g, str_from(p));
            for (int k = 0; k < NKINDS; k++) suggest_try(&g, kinds[k], (uint32_t)strlen(kinds[k]));
            sema_hint_suggest(s, &g);
        }
        return 0;
    }
    for (const char *c = p; *c; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '.' ||
                 *c == '*' || *c == '?';
        if (!ok) {
            if (sema_error(s, item->origin, "pattern \"%s\" in '%s' has '%c', which no parameter name holds", p, what,
                           (*c >= 0x20 && *c < 0x7f) ? *c : '?'))
                sema_hint(s, "names are dotted paths such as h.0.attn.c_attn.weight; '*' matches any run of characters, "
                             "'?' one character");
            return 0;
        }
    }
    return 1;
}

int groups_check_list(Sema *s, const Value *list, const char *what) {
    if (!list || list->kind == V_UNKNOWN) return 0;
    if (list->kind != V_LIST) {
        if (sema_error(s, list->origin, "'%s' must be a list of name patterns or kinds, but it is %s", what,
                       value_describe(s->ar, list)))
            sema_hint(s, "for example: %s",
                      strcmp(what, "freeze") == 0 ? "freeze = [\"h.0.*\", \"wte.weight\"]"
                                                  : "no_decay = [\"@1d\", \"wte.weight\"]");
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < list->n; i++) ok &= pattern_ok(s, list->items[i], what);
    return ok;
}

/* ---- applying them ---- */

/* Marks (through gb) with bits each parameter of model that a pattern of list matches; a pattern
 * that matches none is an error. Frozen parameters (trainable = false, freeze) are marked too
 * when bits is GP_FROZEN, and skipped by no_decay's count of what it leaves to decay. Returns the
 * number of parameters marked, -1 after an error. */
static int apply(Sema *s, GList *ps, const Value *list, const char *what, int bits, GraphBuilder *gb, char *marked) {
    int errors = 0;
    for (int i = 0; i < list->n; i++) {
        const Value *it = list->items[i];
        int hits = 0;
        for (int j = 0; j < ps->n; j++)
            if (pattern_matches(it->s, &ps->p[j])) {
                hits++;
                marked[j] = 1;
            }
        if (hits == 0) {
            errors++;
            if (sema_error(s, it->origin, "\"%s\" in '%s' matches no parameter of the model", it->s, what)) {
                Suggest g;
                suggest_init(&g, str_from(it->s));
                for (int j = 0; j < ps->n; j++) suggest_try(&g, ps->p[j].name, (uint32_t)strlen(ps->p[j].name));
                if (g.pick) sema_hint_suggest(s, &g);
                else if (ps->n > 0) {
                    const char *names = "";
                    for (int j = 0; j < ps->n && j < 6; j++)
                        names = arena_printf(s->ar, "%s%s%s", names, j ? ", " : "", ps->p[j].name);
                    if (ps->n > 6) names = arena_printf(s->ar, "%s and %d more", names, ps->n - 6);
                    sema_hint(s, "the model's parameters are %s; '*' matches any run of characters", names);
                }
            }
        }
    }
    if (errors) return -1;
    int n = 0;
    for (int j = 0; j < ps->n; j++)
        if (marked[j]) {
            n++;
            if (gb) gb_param_group(gb, ps->p[j].v, bits);
        }
    return n;
}

void groups_freeze(Sema *s, Value *model, const Value *list, Span at, GraphBuilder *gb) {
    if (!model || model->kind != V_MODEL) return;
    int ok = !list || groups_check_list(s, list, "freeze");
    GList ps = params_of(s, model);
    char *marked = arena_alloc(s->ar, (size_t)ps.n + 1);
    for (int j = 0; j < ps.n; j++) marked[j] = (char)ps.p[j].frozen;
    if (list && ok && apply(s, &ps, list, "freeze", GP_FROZEN, gb, marked) < 0) return;
    int frozen = 0;
    for (int j = 0; j < ps.n; j++) {
        frozen += marked[j];
        if (marked[j] && gb) gb_param_group(gb, ps.p[j].v, GP_FROZEN);
    }
    if (ps.n > 0 && frozen == ps.n) {
        if (sema_error(s, list ? list->origin : at, "every parameter of the model is frozen, so nothing is left to train"))
            sema_hint(s, "freeze part of it: freeze = [\"h.0.*\"] or trainable = false on a sub-model");
    }
}

void groups_no_decay(Sema *s, Value *model, Value *opt, GraphBuilder *gb) {
    if (!model || model->kind != V_MODEL || !opt || opt->kind != V_OPTIMIZER || opt->n != 1) return;
    const Value *list = opt->items[0];
    if (!list || list->kind != V_LIST) return; /* reported where the optimizer was called */
    for (int i = 0; i < list->n; i++)
        if (!list->items[i] || list->items[i]->kind != V_STRING) return;
    GList ps = params_of(s, model);
    char *marked = arena_alloc(s->ar, (size_t)ps.n + 1);
    if (apply(s, &ps, list, "no_decay", GP_NO_DECAY, gb, marked) < 0) return;
    Entry *wd = scope_find(opt->scope, str_from("weight_decay"));
    double x;
    if (wd && wd->v && value_number(wd->v, &x) && x == 0)
        diag_warning(list->origin, "'no_decay' has no effect: the optimizer's weight_decay is 0");
}

/* ---- LoRA adapters, for `./prog train --save-adapter DIR` ---- */

typedef struct Adapter {
    const char *path; /* the LoRALinear's dotted path: "h.0.attn.q" */
    int64_t rank;
    double alpha;
    int64_t adapters; /* a MultiLoRALinear's adapters; 0 for a LoRALinear */
} Adapter;

typedef struct AList {
    Adapter *a;
    int n, cap;
} AList;

/* An instance of the stdlib's nn.LoRALinear: PEFT's LoraLayer. Recognised by its model and module
 * name, so that the adapter written is exactly what that model computes (base + lora_B(lora_A(x)) *
 * alpha / rank, docs/stdlib.md); a model of one's own with the same shape is not guessed at. */
static int is_nn_model(const Value *v, const char *name) {
    const Scope *sc = v->scope;
    return sc && sc->name && strcmp(sc->name, name) == 0 && sc->parent && sc->parent->module && sc->parent->module->name &&
           strcmp(sc->parent->module->name, "nn") == 0;
}

/* A model instance of the walk (sema_walk_models): an nn.LoRALinear or nn.MultiLoRALinear is
 * listed under its path, and its members are not walked. */
static int adapter_at(SemaWalk *w, Value *v, const char *prefix, int frozen) {
    (void)frozen;
    Sema *s = w->s;
    AList *out = w->ctx;
    Scope *sc = v->scope;
    int multi = is_nn_model(v, "MultiLoRALinear");
    if (multi || is_nn_model(v, "LoRALinear")) {
        Entry *r = scope_find(sc, str_from("rank")), *a = scope_find(sc, str_from("alpha"));
        Entry *na = multi ? scope_find(sc, str_from("adapters")) : NULL;
        int64_t rank, adapters = 0;
        double alpha;
        if (!r || !r->v || r->v->kind != V_INT || !dim_const(r->v->dim, &rank) || !a || !a->v || !value_number(a->v, &alpha))
            return 1; /* not known here: the model is reported elsewhere */
        if (multi && (!na || !na->v || na->v->kind != V_INT || !dim_const(na->v->dim, &adapters) || adapters < 1)) return 1;
        size_t len = strlen(prefix);
        if (len == 0) return 1; /* the whole model is one LoRALinear: PEFT needs a module name */
        if (out->n == out->cap) {
            int cap = out->cap ? out->cap * 2 : 8;
            Adapter *na = arena_alloc(s->ar, sizeof(Adapter) * (size_t)cap);
            if (out->n) memcpy(na, out->a, sizeof(Adapter) * (size_t)out->n);
            out->a = na;
            out->cap = cap;
        }
        out->a[out->n++] = (Adapter){arena_printf(s->ar, "%.*s", (int)(len - 1), prefix), rank, alpha, adapters};
        return 1;
    }
    return 0;
}

/* Appends s to the arena-grown buffer *buf (length *len). */
static void cat(Arena *ar, char **buf, size_t *len, const char *s) {
    size_t n = strlen(s);
    char *nb = arena_alloc(ar, *len + n + 1);
    if (*len) memcpy(nb, *buf, *len);
    memcpy(nb + *len, s, n + 1);
    *buf = nb;
    *len += n;
}

/* PEFT's adapter_config.json for the LoRALinear (or MultiLoRALinear) instances of the model, and
 * their paths one a line, each followed by a blank and its adapters (0 for a LoRALinear: the
 * runtime then writes one PEFT directory; N: one for each of the N adapters, the same config);
 * both NULL when it has none. A model that mixes the two, or MultiLoRALinear layers of different
 * adapter counts, has no PEFT form: config NULL, modules "" (the runtime says why). The first adapter's rank and alpha are `r` and `lora_alpha`;
 * an adapter with another rank or alpha is listed in rank_pattern / alpha_pattern under its full
 * path, which PEFT (get_pattern_key) matches as `(.*\.)?PATH$` (dots in a path match themselves
 * too). target_modules
 * are the full paths: PEFT adapts a module whose name is one of them or ends in "." and one. */
void groups_adapters(Sema *s, Value *model, const char **config, const char **modules) {
    *config = *modules = NULL;
    if (!model || model->kind != V_MODEL) return;
    AList l = {0};
    SemaWalk w = {.s = s, .ctx = &l, .model = adapter_at};
    sema_walk_models(&w, model);
    if (l.n == 0) return;
    for (int i = 1; i < l.n; i++)
        if (l.a[i].adapters != l.a[0].adapters) {
            *modules = "";
            return;
        }
    char *c = NULL, *m = NULL;
    size_t cl = 0, ml = 0;
    cat(s->ar, &c, &cl,
        arena_printf(s->ar,
                     "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": null,\n  \"base_model_name_or_path\": null,\n"
                     "  \"r\": %lld,\n  \"lora_alpha\": %.17g,\n  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n"
                     "  \"fan_in_fan_out\": false,\n  \"use_rslora\": false,\n  \"init_lora_weights\": true,\n"
                     "  \"inference_mode\": true,\n  \"modules_to_save\": null,\n  \"target_modules\": [",
                     (long long)l.a[0].rank, l.a[0].alpha));
    for (int i = 0; i < l.n; i++) {
        cat(s->ar, &c, &cl, arena_printf(s->ar, "%s\"%s\"", i ? ", " : "", l.a[i].path));
        cat(s->ar, &m, &ml, arena_printf(s->ar, "%s %lld\n", l.a[i].path, (long long)l.a[i].adapters));
    }
    /* A pattern key P also matches every path that ends in ".P" (`(.*\.)?P$`): where another
     * adapted layer's path does, the key is "^P", which the optional group cannot skip past. */
    const char **key = arena_alloc(s->ar, sizeof(char *) * (size_t)l.n);
    for (int i = 0; i < l.n; i++) {
        key[i] = l.a[i].path;
        size_t pl = strlen(l.a[i].path);
        for (int j = 0; j < l.n; j++) {
            size_t ql = strlen(l.a[j].path);
            if (j != i && ql > pl && l.a[j].path[ql - pl - 1] == '.' && strcmp(l.a[j].path + ql - pl, l.a[i].path) == 0)
                key[i] = arena_printf(s->ar, "^%s", l.a[i].path);
        }
    }
    cat(s->ar, &c, &cl, "],\n  \"rank_pattern\": {");
    for (int i = 0, k = 0; i < l.n; i++)
        if (l.a[i].rank != l.a[0].rank)
            cat(s->ar, &c, &cl, arena_printf(s->ar, "%s\"%s\": %lld", k++ ? ", " : "", key[i], (long long)l.a[i].rank));
    cat(s->ar, &c, &cl, "},\n  \"alpha_pattern\": {");
    for (int i = 0, k = 0; i < l.n; i++)
        if (l.a[i].alpha != l.a[0].alpha)
            cat(s->ar, &c, &cl, arena_printf(s->ar, "%s\"%s\": %.17g", k++ ? ", " : "", key[i], l.a[i].alpha));
    cat(s->ar, &c, &cl, "}\n}\n");
    *config = c;
    *modules = m;
}
