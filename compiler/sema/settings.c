/* settings.c - checking train blocks, and resolving their numbers; the readers of a block's keys and
 * values that settings_serve.c (the serve blocks) shares (settings_internal.h).
 *
 * Pipeline position: AST -> [sema: sema.c drives, eval.c evaluates, settings.c checks the
 * blocks] -> graph IR. A train block instantiates its model with concrete constants, builds
 * the data source (x, y = i32[micro, seq]), evaluates the loss over both, binds the optimizer
 * and the learning-rate schedule, and checks the batch arithmetic and the parallel layout. A
 * serve block instantiates its model and checks the serving limits. Every error names the key,
 * what was given and what is allowed; the numbers end up in TrainSettings / ServeSettings for
 * the stages after sema. For the train block being built (sema_build_train_graph), the graph
 * builder listens while the model is instantiated and the data and loss are evaluated, and for
 * sema_build_train also while the optimizer's update runs (the hooks marked "graph builder hook"). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "settings_internal.h"

/* ---- keys ---- */

enum {
    T_MODEL,
    T_DATA,
    T_LOSS,
    T_OPTIMIZER,
    T_LR,
    T_BATCH,
    T_PARALLEL,
    T_PRECISION,
    T_RECOMPUTE,
    T_OFFLOAD,
    T_CHECKPOINT,
    T_STEPS,
    T_EVAL,
    T_SEED,
    T_CLIP,
    T_FREEZE,
    T_NKEYS
};
static const KeySpec train_keys[T_NKEYS] = {
    {"model", SK_VALUE},     {"data", SK_VALUE},    {"loss", SK_VALUE},       {"optimizer", SK_VALUE},
    {"lr", SK_VALUE},        {"batch", SK_BLOCK},   {"parallel", SK_BLOCK},   {"precision", SK_VALUE},
    {"recompute", SK_VALUE}, {"offload", SK_BLOCK}, {"checkpoint", SK_BLOCK}, {"steps", SK_VALUE},
    {"eval", SK_BLOCK},      {"seed", SK_VALUE},    {"clip", SK_VALUE},       {"freeze", SK_VALUE},
};

enum { B_GLOBAL, B_MICRO, B_TOKENS, B_RAMP, B_BUCKETS, B_CURRICULUM, B_NKEYS };
static const KeySpec batch_keys[B_NKEYS] = {{"global", SK_VALUE}, {"micro", SK_VALUE},   {"tokens", SK_VALUE},
                                            {"ramp", SK_VALUE},   {"buckets", SK_VALUE}, {"curriculum", SK_VALUE}};

enum { P_DATA, P_TENSOR, P_PIPELINE, P_SEQUENCE, P_EXPERT, P_ZERO, P_SCHEDULE, P_NKEYS };
static const KeySpec parallel_keys[P_NKEYS] = {{"data", SK_VALUE},     {"tensor", SK_VALUE}, {"pipeline", SK_VALUE},
                                               {"sequence", SK_VALUE}, {"expert", SK_VALUE}, {"zero", SK_VALUE},
                                               {"schedule", SK_VALUE}};

enum { O_ACTIVATIONS, O_OPTIMIZER, O_NKEYS };
static const KeySpec offload_keys[O_NKEYS] = {{"activations", SK_VALUE}, {"optimizer", SK_VALUE}};

enum { C_EVERY, C_DIR, C_KEEP, C_ON_ERROR, C_NKEYS };
static const KeySpec checkpoint_keys[C_NKEYS] = {
    {"every", SK_VALUE}, {"dir", SK_VALUE}, {"keep", SK_VALUE}, {"on_error", SK_VALUE}};

enum { E_EVERY, E_STEPS, E_NKEYS };
static const KeySpec eval_keys[E_NKEYS] = {{"every", SK_VALUE}, {"steps", SK_VALUE}};

Span set_key_span(const Node *item) { return sema_span_of(item, item->name); }

/* Setting values are evaluated in the block's scope (the module's names, plus model and data). */
Frame set_frame(Sema *s, Scope *bs) {
    Frame f;
    memset(&f, 0, sizeof f);
    f.s = s;
    f.kind = FR_BLOCK;
    f.scope = bs;
    f.fname = bs->name;
    return f;
}

/* Files each setting under its key: unknown keys (with the nearest known one suggested),
 * repeated keys, and a value given for a block (or the reverse) are errors. A key written in
 * the wrong form, or misspelt close enough to be suggested, counts as present (bit k of
 * *present), so that it is not also reported missing. */
void set_gather(Sema *s, const NodeList *items, const KeySpec *spec, int nspec, const char *where, const Node **out,
                unsigned *present) {
    for (int i = 0; i < items->n; i++) {
        const Node *it = items->v[i];
        if (!it || (it->kind != N_SETTING && it->kind != N_SETTING_BLOCK)) continue;
        int j = -1;
        for (int k = 0; k < nspec; k++)
            if (str_eqc(it->name, spec[k].name)) j = k;
        if (j < 0) {
            Suggest g;
            suggest_init(&g, it->name);
            for (int k = 0; k < nspec; k++) suggest_try(&g, spec[k].name, (uint32_t)strlen(spec[k].name));
            if (sema_error(s, set_key_span(it), "unknown setting '%.*s' in %s", STR_ARG(it->name), where))
                sema_hint_suggest(s, &g);
            for (int k = 0; k < nspec && g.pick; k++)
                if (strlen(spec[k].name) == g.picklen && memcmp(spec[k].name, g.pick, g.picklen) == 0) *present |= 1u << k;
            continue;
        }
        *present |= 1u << j;
        if (out[j]) {
            if (sema_error(s, set_key_span(it), "setting '%.*s' is given twice", STR_ARG(it->name)))
                sema_note(s, set_key_span(out[j]), "first given here");
            continue;
        }
        if (spec[j].kind == SK_VALUE && it->kind == N_SETTING_BLOCK) {
            sema_error(s, set_key_span(it), "'%s' takes a value, not a block: write %s = ...", spec[j].name, spec[j].name);
            continue;
        }
        if (spec[j].kind == SK_BLOCK && it->kind == N_SETTING) {
            sema_error(s, set_key_span(it), "'%s' is a block of settings: write %s { ... }", spec[j].name, spec[j].name);
            continue;
        }
        out[j] = it;
    }
}

/* ---- values ---- */

Span set_value_span(const Node *item) { return item->a ? item->a->span : item->span; }

/* An integer setting in [lo, hi]; 0 (with an error unless the value is unknown) otherwise. */
int set_int(Frame *f, const Node *item, const char *key, int64_t lo, int64_t hi, const char *allowed, int64_t *out) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return 0;
    int64_t k;
    if (v->kind == V_INT && v->dim && dim_const(v->dim, &k)) {
        if (k >= lo && k <= hi) {
            *out = k;
            return 1;
        }
        if (k > hi && hi == INT32_MAX) /* the implicit limit: say it, `allowed` does not */
            sema_error(s, set_value_span(item), "'%s' must be at most %lld (2^31 - 1), but it is %lld", key, (long long)hi,
                       (long long)k);
        else sema_error(s, set_value_span(item), "'%s' must be %s, but it is %lld", key, allowed, (long long)k);
        return 0;
    }
    sema_error(s, set_value_span(item), "'%s' must be %s, but it is %s", key, allowed, value_describe(s->ar, v));
    return 0;
}

/* A number setting in the interval from lo to hi (open ends when lo_open / hi_open). */
int set_num(Frame *f, const Node *item, const char *key, double lo, int lo_open, double hi, int hi_open, const char *allowed,
            double *out) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return 0;
    double x;
    int64_t k;
    int known = 0;
    if (v->kind == V_INT && v->dim && dim_const(v->dim, &k)) {
        x = (double)k;
        known = 1;
    } else if (v->kind == V_FLOAT && v->fknown) {
        x = v->f;
        known = 1;
    }
    if (!known) {
        sema_error(s, set_value_span(item), "'%s' must be %s, but it is %s", key, allowed, value_describe(s->ar, v));
        return 0;
    }
    if ((lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi) || x != x) {
        sema_error(s, set_value_span(item), "'%s' must be %s, but it is %g", key, allowed, x);
        return 0;
    }
    *out = x;
    return 1;
}

static int get_string(Frame *f, const Node *item, const char *key, const char *allowed, const char **out) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return 0;
    if (v->kind == V_STRING && v->s) {
        *out = v->s;
        return 1;
    }
    sema_error(s, set_value_span(item), "'%s' must be %s, but it is %s", key, allowed, value_describe(s->ar, v));
    return 0;
}

/* A path: a string that is not empty (an empty path names no file; the executable would fail on it, or
   silently fall back to a default). names: what the path names ("a directory"). */
int set_path(Frame *f, const Node *item, const char *key, const char *names, const char **out) {
    char allowed[96];
    snprintf(allowed, sizeof allowed, "a string (the path of %s)", names);
    const char *str;
    if (!get_string(f, item, key, allowed, &str)) return 0;
    if (!*str) {
        sema_error(f->s, set_value_span(item), "'%s' must not be empty: it is the path of %s", key, names);
        return 0;
    }
    *out = str;
    return 1;
}

/* The key as written inside its block: "schedule" for "parallel.schedule". */
static const char *key_leaf(const char *key) {
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

/* "a, b or c" */
static const char *choices_text(Sema *s, const char *const *choices, int n, int quoted) {
    const char *out = "";
    for (int i = 0; i < n; i++)
        out = arena_printf(s->ar, "%s%s%s%s%s", out,
                           i == 0       ? ""
                           : i == n - 1 ? " or "
                                        : ", ",
                           quoted ? "\"" : "", choices[i], quoted ? "\"" : "");
    return out;
}

/* A bare identifier from a fixed set (precision = bf16): not evaluated as a name. */
int set_ident(Frame *f, const Node *item, const char *key, const char *const *choices, int n, int *out) {
    Sema *s = f->s;
    const Node *v = item->a;
    if (!v) return 0;
    const char *allowed = choices_text(s, choices, n, 0);
    if (v->kind == N_NAME) {
        for (int i = 0; i < n; i++)
            if (str_eqc(v->name, choices[i])) {
                *out = i;
                return 1;
            }
        if (sema_error(s, v->span, "'%s' must be %s, but it is '%.*s'", key, allowed, STR_ARG(v->name))) {
            Suggest g;
            suggest_init(&g, v->name);
            for (int i = 0; i < n; i++) suggest_try(&g, choices[i], (uint32_t)strlen(choices[i]));
            sema_hint_suggest(s, &g);
        }
        return 0;
    }
    if (v->kind == N_STRING && v->sval) {
        for (int i = 0; i < n; i++)
            if (strcmp(v->sval, choices[i]) == 0) {
                if (sema_error(s, v->span, "'%s' must be %s, but it is the string \"%s\"", key, allowed, v->sval))
                    sema_hint(s, "write it without quotes: %s = %s", key_leaf(key), choices[i]);
                return 0;
            }
    }
    sema_error(s, v->span, "'%s' must be %s, but it is '%s'", key, allowed, diag_span_text(s->ar, v->span));
    return 0;
}

/* A string from a fixed set (schedule = "1f1b"). */
static int get_choice_string(Frame *f, const Node *item, const char *key, const char *const *choices, int n, int *out) {
    Sema *s = f->s;
    const Node *vn = item->a;
    if (!vn) return 0;
    const char *allowed = choices_text(s, choices, n, 1);
    if (vn->kind == N_NAME) {
        for (int i = 0; i < n; i++)
            if (str_eqc(vn->name, choices[i])) {
                if (sema_error(s, vn->span, "'%s' must be %s, but it is the name '%s'", key, allowed, choices[i]))
                    sema_hint(s, "write it as a string: %s = \"%s\"", key_leaf(key), choices[i]);
                return 0;
            }
    }
    const char *str;
    if (!get_string(f, item, key, allowed, &str)) return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(str, choices[i]) == 0) {
            *out = i;
            return 1;
        }
    sema_error(s, set_value_span(item), "'%s' must be %s, but it is \"%s\"", key, allowed, str);
    return 0;
}

static int get_bool(Frame *f, const Node *item, const char *key, int *out) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return 0;
    if (v->kind == V_BOOL && v->bknown) {
        *out = v->b;
        return 1;
    }
    sema_error(s, set_value_span(item), "'%s' must be true or false, but it is %s", key, value_describe(s->ar, v));
    return 0;
}

/* The block's model: an instance, not a definition. */
Value *set_model(Frame *f, const Node *item) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_MODEL || v->kind == V_UNKNOWN) return v;
    if (v->kind == V_MODEL_DEF) {
        if (sema_error(s, set_value_span(item), "'model' must be a model instance, but it is %s", value_describe(s->ar, v)))
            sema_hint(s, "call it: model = %s()", diag_span_text(s->ar, set_value_span(item)));
    } else {
        sema_error(s, set_value_span(item), "'model' must be a model instance, e.g. GPT2(), but it is %s",
                   value_describe(s->ar, v));
    }
    return value_unknown(s->ar, set_value_span(item));
}

static void missing_key(Sema *s, Span at, const char *block, const char *key, const char *example) {
    if (sema_error(s, at, "%s has no '%s' setting", block, key)) sema_hint(s, "add %s", example);
}

void set_required(Sema *s, unsigned present, int idx, const KeySpec *spec, Span at, const char *block, const char *example) {
    if (!(present & (1u << idx))) missing_key(s, at, block, spec[idx].name, example);
}

/* ---- the data source ---- */

/* tokens([PATH_A, PATH_B, ...]): a list of at least 2 non-empty strings without newlines,
 * joined one a line into *out (the runtime opens one source a line: runtime/io/data.c). */
static int tokens_list(Frame *f, const Node *expr, const char *what, const char **out, int64_t *n) {
    Sema *s = f->s;
    Value *l = eval_expr(f, expr);
    if (l->kind == V_UNKNOWN) return 0;
    int64_t len;
    if (l->kind != V_LIST || !l->len || !dim_const(l->len, &len) || len != l->n) {
        sema_error(s, expr->span, "'%s' of 'tokens' must be a string or a list of strings, but it is %s", what,
                   value_describe(s->ar, l));
        return 0;
    }
    if (len < 2) {
        if (sema_error(s, expr->span, "a list of %lld data set%s in '%s' of 'tokens'", (long long)len, len == 1 ? "" : "s", what))
            sema_hint(s, "one data set is a plain string: tokens(\"data/train_*.bin\", ...); a list names two or more");
        return 0;
    }
    size_t total = 0;
    for (int i = 0; i < l->n; i++) {
        const Value *it = l->items[i];
        if (it->kind == V_UNKNOWN) return 0;
        if (it->kind != V_STRING || !it->s) {
            sema_error(s, expr->span, "item %d of '%s' in 'tokens' must be a string (a glob of token shards), but it is %s",
                       i + 1, what, value_describe(s->ar, it));
            return 0;
        }
        if (!*it->s || strchr(it->s, '\n')) {
            sema_error(s, expr->span, "item %d of '%s' in 'tokens' %s", i + 1, what,
                       *it->s ? "holds a newline, which no glob of files may" : "is empty: it names no file");
            return 0;
        }
        total += strlen(it->s) + 1;
    }
    char *joined = arena_alloc(s->ar, total);
    size_t k = 0;
    for (int i = 0; i < l->n; i++) {
        size_t m = strlen(l->items[i]->s);
        memcpy(joined + k, l->items[i]->s, m);
        k += m;
        joined[k++] = i + 1 < l->n ? '\n' : 0;
    }
    *out = joined;
    *n = len;
    return 1;
}

/* data = tokens(PATH, seq = T, shuffle = true, val = PATH). Fills the paths and seq. */
static int check_tokens(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    const Node *v = item->a;
    if (!v || v->kind != N_CALL || !v->a || v->a->kind != N_NAME || !str_eqc(v->a->name, "tokens")) {
        Value *got = eval_expr(f, item->a);
        if (got->kind != V_UNKNOWN &&
            sema_error(s, set_value_span(item), "'data' must be a token source, but it is %s", value_describe(s->ar, got)))
            sema_hint(s, "write data = tokens(\"data/train_*.bin\", seq = 1024)");
        return 0;
    }
    static const char *const names[] = {"path", "seq", "shuffle", "val", "docs"};
    enum { NNAMES = 5 };
    const Node *given[NNAMES] = {0};
    int ok = 1, npos = 0;
    for (int i = 0; i < v->list.n; i++) {
        const Node *a = v->list.v[i];
        if (!a) continue;
        if (a->kind != N_KWARG) {
            if (npos++ == 0) given[0] = a;
            else if (npos == 2) {
                sema_error(s, a->span,
                           "'tokens' takes 1 positional argument (the path of the token shards), but more were given");
                ok = 0;
            }
            continue;
        }
        int j = -1;
        for (int k = 1; k < NNAMES; k++)
            if (str_eqc(a->name, names[k])) j = k;
        if (j < 0) {
            if (sema_error(s, sema_span_of(a, a->name), "'tokens' has no parameter '%.*s'", STR_ARG(a->name))) {
                Suggest g;
                suggest_init(&g, a->name);
                for (int k = 1; k < NNAMES; k++) suggest_try(&g, names[k], (uint32_t)strlen(names[k]));
                sema_hint_suggest(s, &g);
            }
            ok = 0;
        } else if (given[j]) {
            if (sema_error(s, sema_span_of(a, a->name), "argument '%.*s' of 'tokens' is given twice", STR_ARG(a->name)))
                sema_note(s, given[j]->span, "first given here");
            ok = 0;
        } else {
            given[j] = a;
        }
    }
    if (!given[0]) {
        if (sema_error(s, v->span, "missing argument 'path' in the call to 'tokens'"))
            sema_hint(s, "the path of the token shards comes first: tokens(\"data/train_*.bin\", seq = 1024)");
        ok = 0;
    } else if (given[0]->kind == N_LIST || eval_expr(f, given[0])->kind == V_LIST) {
        ok &= tokens_list(f, given[0], "path", &ts->cfg.data_glob, &ts->cfg.data_sets);
        ts->cfg.data_sets_at = given[0]->span;
    } else {
        Value *p = eval_expr(f, given[0]);
        if (p->kind == V_STRING && p->s && !*p->s) {
            if (sema_error(s, given[0]->span, "the path of 'tokens' must not be empty"))
                sema_hint(s, "name the token shards: tokens(\"data/train_*.bin\", seq = 1024)");
            ok = 0;
        } else if (p->kind == V_STRING && p->s) ts->cfg.data_glob = p->s;
        else if (p->kind != V_UNKNOWN) {
            sema_error(s, given[0]->span, "the path of 'tokens' must be a string, but it is %s", value_describe(s->ar, p));
            ok = 0;
        }
    }
    if (!given[1]) {
        sema_error(s, v->span, "missing argument 'seq' in the call to 'tokens'");
        ok = 0;
    } else {
        Value *q = eval_expr(f, given[1]->a);
        int64_t k;
        if (q->kind == V_INT && q->dim && dim_const(q->dim, &k) && k > 0) ts->cfg.seq = k;
        else if (q->kind != V_UNKNOWN) {
            if (q->kind == V_INT && q->dim && dim_const(q->dim, &k))
                sema_error(s, set_value_span(given[1]), "'seq' must be a positive integer, but it is %lld", (long long)k);
            else
                sema_error(s, set_value_span(given[1]), "'seq' must be a positive integer, but it is %s",
                           value_describe(s->ar, q));
            ok = 0;
        } else {
            ok = 0;
        }
    }
    if (given[2] && !get_bool(f, given[2], "shuffle", &ts->cfg.shuffle)) ok = 0;
    if (given[3] && (given[3]->a->kind == N_LIST || eval_expr(f, given[3]->a)->kind == V_LIST)) {
        int64_t n = 0;
        if (!tokens_list(f, given[3]->a, "val", &ts->cfg.val_glob, &n)) ok = 0;
        else if (n != ts->cfg.data_sets) {
            if (sema_error(s, set_value_span(given[3]), "'val' names %lld data sets but the path names %lld", (long long)n,
                           (long long)ts->cfg.data_sets))
                sema_hint(s, "give one held-out glob per training data set, in the same order");
            ok = 0;
        }
    } else if (given[3] && !set_path(f, given[3], "val", "the validation shards", &ts->cfg.val_glob)) ok = 0;
    else if (given[3] && ts->cfg.data_sets > 1) {
        if (sema_error(s, set_value_span(given[3]), "'val' is one glob but the path names %lld data sets",
                       (long long)ts->cfg.data_sets))
            sema_hint(s, "give a list of held-out globs, one per training data set");
        ok = 0;
    }
    if (given[4]) { /* docs = EOT: the id that ends a document; a token id, so below 2^31 */
        if (set_int(f, given[4], "docs", 0, INT32_MAX, "a token id (the end-of-text id, e.g. 50256 for GPT-2)", &ts->cfg.docs))
            ts->cfg.docs_at = set_value_span(given[4]);
        else {
            ts->cfg.docs = -2; /* given but wrong: data.pos still exists, so no second error about it */
            ok = 0;
        }
    }
    return ok;
}

/* Several data sets: each micro-batch is dealt out between them in equal blocks, so micro must
 * be a multiple of their number; and a model whose nn.MultiLoRALinear layers stack N adapters
 * trains adapter n on block n, so N must be their number (an adapter without data, or data
 * without an adapter, would be a silent mistake). */
static void check_data_sets(Sema *s, TrainSettings *ts) {
    int64_t n = ts->cfg.data_sets;
    if (n <= 1) return;
    if (ts->cfg.micro > 0 && ts->cfg.micro % n != 0) {
        if (sema_error(s, ts->cfg.data_sets_at,
                       "%lld data sets cannot share a micro-batch of %lld sequences evenly (each micro-batch holds the same "
                       "number of rows from each)",
                       (long long)n, (long long)ts->cfg.micro))
            sema_hint(s, "make batch.micro a multiple of %lld", (long long)n);
        return;
    }
    for (const char *m = ts->cfg.adapter_modules; m && *m;) { /* "PATH N\n" a layer */
        const char *sp = strchr(m, ' '), *nl = strchr(m, '\n');
        if (!sp || !nl) break;
        long long a = strtoll(sp + 1, NULL, 10);
        if (a > 0 && a != n) {
            if (sema_error(s, ts->cfg.data_sets_at, "%lld data sets, but the model's nn.MultiLoRALinear '%.*s' has %lld adapters",
                           (long long)n, (int)(sp - m), m, a))
                sema_hint(s, "give one data set per adapter: data set n trains adapter n");
            return;
        }
        m = nl + 1;
    }
}

/* ---- the model's blocks (for pipeline stages) ---- */

/* The length of the longest list of sub-models anywhere in an instance; *name is its member. */
static int64_t longest_list(const Value *inst, Str *name, int depth) {
    if (!inst || inst->kind != V_MODEL || !inst->scope || depth > 16) return 0;
    int64_t best = 0;
    Scope *sc = inst->scope;
    for (int i = 0; i < sc->n; i++) {
        Entry *e = &sc->e[i];
        if (!e->v || e->kind != ENT_SUB) continue;
        Str sub;
        int64_t k;
        if (e->v->kind == V_LIST) {
            if (e->v->len && dim_const(e->v->len, &k) && k > best) {
                best = k;
                *name = e->name;
            }
            for (int j = 0; j < e->v->n && j < 1; j++) { /* the items are alike: look inside one */
                int64_t in = longest_list(e->v->items[j], &sub, depth + 1);
                if (in > best) {
                    best = in;
                    *name = sub;
                }
            }
        } else if (e->v->kind == V_MODEL) {
            int64_t in = longest_list(e->v, &sub, depth + 1);
            if (in > best) {
                best = in;
                *name = sub;
            }
        }
    }
    return best;
}

/* ---- train ---- */

/* global must be a multiple of unit = micro x data; the hint offers the nearest valid values. */
static int check_multiple(Sema *s, Span at, const char *what, int64_t global, int64_t micro, int64_t data) {
    int64_t unit = micro * data;
    if (unit <= 0 || global % unit == 0) return 1;
    if (sema_error(s, at, "batch: %s = %lld is not a multiple of micro x data = %lld x %lld = %lld", what, (long long)global,
                   (long long)micro, (long long)data, (long long)unit)) {
        int64_t lower = global / unit * unit, upper = lower + unit;
        if (lower > 0) sema_hint(s, "use %s = %lld or %lld, or change micro/data", what, (long long)lower, (long long)upper);
        else sema_hint(s, "use %s = %lld, or change micro/data", what, (long long)upper);
    }
    return 0;
}

static void check_ramp(Frame *f, const Node *item, TrainSettings *ts, int64_t data) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return;
    int64_t len;
    if (v->kind != V_LIST || !v->len || !dim_const(v->len, &len) || len != v->n) {
        if (sema_error(s, set_value_span(item), "'batch.ramp' must be a list of (step, global) pairs, but it is %s",
                       value_describe(s->ar, v)))
            sema_hint(s, "for example: ramp = [(500, 128), (1000, 256)]");
        return;
    }
    const Node *ln = item->a && item->a->kind == N_LIST && item->a->list.n == v->n ? item->a : NULL;
    ts->cfg.ramp = arena_alloc(s->ar, sizeof(RampStep) * (size_t)(v->n + 1));
    int64_t prev_step = -1, prev_global = ts->cfg.global;
    for (int i = 0; i < v->n; i++) {
        Value *e = v->items[i];
        Span at = ln && ln->list.v[i] ? ln->list.v[i]->span : set_value_span(item);
        int64_t st, gl;
        if (!e || e->kind == V_UNKNOWN) continue;
        if (e->kind != V_TUPLE || e->n != 2 || !e->items[0] || !e->items[1] || e->items[0]->kind != V_INT ||
            e->items[1]->kind != V_INT || !e->items[0]->dim || !e->items[1]->dim || !dim_const(e->items[0]->dim, &st) ||
            !dim_const(e->items[1]->dim, &gl)) {
            sema_error(s, at, "each 'batch.ramp' entry must be a pair of integers (step, global), but this one is %s",
                       value_describe(s->ar, e));
            continue;
        }
        if (st <= prev_step || st < 0) {
            if (st < 0) sema_error(s, at, "batch: a ramp step must not be negative, but it is %lld", (long long)st);
            else
                sema_error(s, at, "batch: ramp steps must increase, but %lld comes after %lld", (long long)st,
                           (long long)prev_step);
            continue;
        }
        prev_step = st;
        if (gl <= 0) {
            sema_error(s, at, "batch: a ramp global must be a positive integer, but it is %lld", (long long)gl);
            continue;
        }
        if (!check_multiple(s, at, "ramp global", gl, ts->cfg.micro, data)) continue;
        if (gl <= prev_global)
            sema_error(s, at, "batch: a ramp must raise the global batch, but %lld at step %lld is not more than %lld",
                       (long long)gl, (long long)st, (long long)prev_global);
        int64_t unit = ts->cfg.micro * data;
        ts->cfg.ramp[ts->cfg.nramp++] = (RampStep){st, gl, unit > 0 ? gl / unit : 0};
        prev_global = gl;
    }
}

static void check_recompute(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    static const char *const ops[] = {"gelu", "layernorm", "attention", "mlp", "all"};
    const Node *v = item->a;
    if (!v) return;
    if (v->kind != N_LIST) {
        if (sema_error(s, v->span, "'recompute' must be a list of op names, but it is '%s'", diag_span_text(s->ar, v->span)))
            sema_hint(s, "for example: recompute = [gelu, layernorm]");
        return;
    }
    for (int i = 0; i < v->list.n; i++) {
        const Node *e = v->list.v[i];
        if (!e) continue;
        int which = -1;
        if (e->kind == N_NAME)
            for (int k = 0; k < 5; k++)
                if (str_eqc(e->name, ops[k])) which = k;
        if (which >= 0) {
            ts->cfg.recompute |= 1u << which;
            continue;
        }
        if (sema_error(s, e->span, "'recompute' entry '%s' is not one of %s", diag_span_text(s->ar, e->span),
                       choices_text(s, ops, 5, 0)) &&
            e->kind == N_NAME) {
            Suggest g;
            suggest_init(&g, e->name);
            for (int k = 0; k < 5; k++) suggest_try(&g, ops[k], (uint32_t)strlen(ops[k]));
            sema_hint_suggest(s, &g);
        }
    }
}

static const char *const storage_names[] = {"none", "host", "nvme"};
static const char *const precision_names[] = {"f32", "bf16", "f16"};

/* parallel { ... }, and the model's longest list of sub-models (the blocks a pipeline splits). */
static void check_parallel(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    unsigned sub_present = 0;
    if (item) {
        const Node *p[P_NKEYS] = {0};
        set_gather(s, &item->list, parallel_keys, P_NKEYS, "'parallel'", p, &sub_present);
        int64_t *deg[5] = {&ts->cfg.data_par, &ts->cfg.tensor_par, &ts->cfg.pipeline_par, &ts->cfg.sequence_par,
                           &ts->cfg.expert_par};
        for (int i = 0; i < 5; i++)
            if (p[i]) {
                (void)set_int(f, p[i], arena_printf(s->ar, "parallel.%s", parallel_keys[i].name), 1, INT32_MAX,
                              "a positive integer", deg[i]);
                if (i > 0) ts->cfg.par_at[i - 1] = set_value_span(p[i]);
            }
        if (p[P_ZERO]) {
            (void)set_int(f, p[P_ZERO], "parallel.zero", 0, 3, "0, 1, 2 or 3", &ts->cfg.zero);
            ts->cfg.zero_at = set_value_span(p[P_ZERO]);
        }
        int sched;
        static const char *const scheds[] = {"1f1b", "gpipe"};
        if (p[P_SCHEDULE] && get_choice_string(f, p[P_SCHEDULE], "parallel.schedule", scheds, 2, &sched))
            ts->cfg.schedule = sched ? PIPE_GPIPE : PIPE_1F1B;
        if (ts->cfg.zero > 0 && ts->cfg.data_par == 1 && p[P_ZERO]) {
            if (sema_error(s, set_value_span(p[P_ZERO]),
                           "'parallel.zero' = %lld needs data parallelism, but 'parallel.data' is 1", (long long)ts->cfg.zero))
                sema_hint(s, "set parallel { data = N } with N > 1, or zero = 0");
        }
        ts->cfg.blocks = 0;
        Str list_name = {"", 0};
        if (ts->model->kind == V_MODEL) ts->cfg.blocks = longest_list(ts->model, &list_name, 0);
        if (p[P_PIPELINE] && ts->cfg.pipeline_par > 1 && ts->model->kind == V_MODEL && ts->cfg.pipeline_par > ts->cfg.blocks) {
            const char *mname = ts->model->node ? sema_cstr(s, ts->model->node->name) : "?";
            if (ts->cfg.blocks == 0) {
                sema_error(s, set_value_span(p[P_PIPELINE]),
                           "'parallel.pipeline' = %lld needs a list of sub-models to split into stages, but model '%s' has none",
                           (long long)ts->cfg.pipeline_par, mname);
            } else if (
                sema_error(
                    s, set_value_span(p[P_PIPELINE]),
                    "'parallel.pipeline' = %lld is more than the %lld block%s of '%.*s', the longest list of sub-models of '%s'",
                    (long long)ts->cfg.pipeline_par, (long long)ts->cfg.blocks, ts->cfg.blocks == 1 ? "" : "s",
                    STR_ARG(list_name), mname)) {
                sema_hint(s, "use pipeline <= %lld", (long long)ts->cfg.blocks);
            }
        }
    } else if (ts->model->kind == V_MODEL) {
        Str list_name;
        ts->cfg.blocks = longest_list(ts->model, &list_name, 0);
    }
}

/* batch { buckets = [T1, T2, ...] }: sequence-length buckets (Dataset Decomposition), each a
 * positive length that divides seq, increasing. Each step's micro-batch keeps its micro x seq
 * tokens; at length T they are read as micro x seq / T windows of T tokens, each its own row of
 * documents (data.pos restarts every T tokens, and attention's pos mask keeps a window to itself),
 * so the step compiled for [micro, seq] computes exactly the shorter windows (docs/runtime.md,
 * "Sequence-length buckets"). That needs data.pos: the data must have documents. */
static void check_buckets(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return;
    if ((v->kind != V_LIST && v->kind != V_TUPLE) || v->n == 0) {
        if (sema_error(s, set_value_span(item), "'batch.buckets' must be a list of sequence lengths, but it is %s",
                       value_describe(s->ar, v)))
            sema_hint(s, "write buckets = [256, 512, 1024]");
        return;
    }
    int64_t *lens = arena_alloc(s->ar, sizeof(int64_t) * (size_t)v->n);
    for (int i = 0; i < v->n; i++) {
        const Value *e = v->items[i];
        int64_t k;
        if (!e || e->kind != V_INT || !e->dim || !dim_const(e->dim, &k) || k <= 0) {
            sema_error(s, set_value_span(item), "'batch.buckets' item %d must be a positive integer, but it is %s", i,
                       e ? value_describe(s->ar, e) : "unknown");
            return;
        }
        if (ts->cfg.seq > 0 && k > ts->cfg.seq) {
            if (sema_error(s, set_value_span(item), "'batch.buckets' item %d is %lld, longer than seq = %lld", i, (long long)k,
                           (long long)ts->cfg.seq))
                sema_hint(s, "every bucket is a window length up to the sequence length seq of tokens(...)");
            return;
        }
        if (ts->cfg.seq > 0 && ts->cfg.seq % k != 0) {
            if (sema_error(s, set_value_span(item), "'batch.buckets' item %d is %lld, which does not divide seq = %lld", i,
                           (long long)k, (long long)ts->cfg.seq))
                sema_hint(s, "a bucket's windows are cut from the step's rows of seq tokens: use divisors of %lld",
                          (long long)ts->cfg.seq);
            return;
        }
        if (i > 0 && k <= lens[i - 1]) {
            sema_error(s, set_value_span(item), "'batch.buckets' must increase, but item %d (%lld) follows %lld", i, (long long)k,
                       (long long)lens[i - 1]);
            return;
        }
        lens[i] = k;
    }
    if (ts->cfg.docs == -1) {
        if (sema_error(s, set_value_span(item), "'batch.buckets' needs documents: tokens(..., docs = EOT)"))
            sema_hint(s, "a bucket's windows are told apart by data.pos, which exists with documents; pass it to "
                         "attention(..., pos = data.pos) and the position embedding");
        return;
    }
    ts->cfg.buckets = lens;
    ts->cfg.nbuckets = v->n;
    ts->cfg.buckets_at = set_value_span(item);
}

/* A length of the curriculum: one of the buckets. */
static int curriculum_len(Frame *f, const Value *e, Span at, const TrainSettings *ts, int64_t *out) {
    Sema *s = f->s;
    int64_t k;
    if (!e || e->kind != V_INT || !e->dim || !dim_const(e->dim, &k)) {
        sema_error(s, at, "a 'batch.curriculum' length must be an integer, but it is %s",
                   e ? value_describe(s->ar, e) : "unknown");
        return 0;
    }
    for (int i = 0; i < ts->cfg.nbuckets; i++)
        if (ts->cfg.buckets[i] == k) {
            *out = k;
            return 1;
        }
    if (sema_error(s, at, "'batch.curriculum' length %lld is not one of the buckets", (long long)k)) {
        const char *list = "";
        for (int i = 0; i < ts->cfg.nbuckets; i++)
            list = arena_printf(s->ar, "%s%s%lld", list, i ? ", " : "", (long long)ts->cfg.buckets[i]);
        sema_hint(s, "the buckets are [%s]", list);
    }
    return 0;
}

/* batch { curriculum = [(step, T), (step, [T1, T2]), ...] }: from each entry's step on, the
 * length T, or the lengths T1, T2, ... in turn one a step (Dataset Decomposition's cyclic
 * curriculum); steps increase from 0 or later (before the first, steps are seq long). Without
 * `curriculum`, one stage from step 0 cycles over every bucket. Needs buckets. */
static void check_curriculum(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    Value *v = eval_expr(f, item->a);
    if (v->kind == V_UNKNOWN) return;
    if (!ts->cfg.nbuckets) {
        if (sema_error(s, set_key_span(item), "'batch.curriculum' needs 'batch.buckets'"))
            sema_hint(s, "list the lengths first: buckets = [256, 512, 1024]");
        return;
    }
    int64_t len;
    if (v->kind != V_LIST || !v->len || !dim_const(v->len, &len) || len != v->n || v->n == 0) {
        if (sema_error(s, set_value_span(item), "'batch.curriculum' must be a list of (step, length) pairs, but it is %s",
                       value_describe(s->ar, v)))
            sema_hint(s, "for example: curriculum = [(0, 256), (1000, [256, 512, 1024])]");
        return;
    }
    const Node *ln = item->a && item->a->kind == N_LIST && item->a->list.n == v->n ? item->a : NULL;
    CurriculumStage *cs = arena_alloc(s->ar, sizeof *cs * (size_t)v->n);
    int n = 0;
    int64_t prev = -1;
    for (int i = 0; i < v->n; i++) {
        Value *e = v->items[i];
        Span at = ln && ln->list.v[i] ? ln->list.v[i]->span : set_value_span(item);
        int64_t st;
        if (!e || e->kind == V_UNKNOWN) return;
        if (e->kind != V_TUPLE || e->n != 2 || !e->items[0] || !e->items[1] || e->items[0]->kind != V_INT || !e->items[0]->dim ||
            !dim_const(e->items[0]->dim, &st)) {
            sema_error(s, at,
                       "each 'batch.curriculum' entry must be a pair (step, length) or (step, [lengths]), but this one is %s",
                       value_describe(s->ar, e));
            return;
        }
        if (st < 0 || st <= prev) {
            if (st < 0) sema_error(s, at, "batch: a curriculum step must not be negative, but it is %lld", (long long)st);
            else
                sema_error(s, at, "batch: curriculum steps must increase, but %lld comes after %lld", (long long)st,
                           (long long)prev);
            return;
        }
        prev = st;
        const Value *l = e->items[1];
        CurriculumStage c = {st, NULL, 0};
        if (l->kind == V_LIST || l->kind == V_TUPLE) {
            if (l->n == 0) {
                sema_error(s, at, "a 'batch.curriculum' entry's list of lengths is empty");
                return;
            }
            c.lens = arena_alloc(s->ar, sizeof(int64_t) * (size_t)l->n);
            for (int j = 0; j < l->n; j++)
                if (!curriculum_len(f, l->items[j], at, ts, &c.lens[c.n++])) return;
        } else {
            c.lens = arena_alloc(s->ar, sizeof(int64_t));
            if (!curriculum_len(f, l, at, ts, &c.lens[0])) return;
            c.n = 1;
        }
        cs[n++] = c;
    }
    ts->cfg.curriculum = cs;
    ts->cfg.ncurriculum = n;
}

/* batch { ... }: the global batch, the micro-batch (or tokens), their accumulation, the ramp. */
static void check_batch(Frame *f, const Node *item, TrainSettings *ts) {
    Sema *s = f->s;
    unsigned sub_present = 0;
    int64_t global = 0;
    const Node *b[B_NKEYS] = {0};
    if (item) {
        set_gather(s, &item->list, batch_keys, B_NKEYS, "'batch'", b, &sub_present);
        if (b[B_GLOBAL]) (void)set_int(f, b[B_GLOBAL], "batch.global", 1, INT32_MAX, "a positive integer", &global);
        if (b[B_MICRO]) (void)set_int(f, b[B_MICRO], "batch.micro", 1, INT32_MAX, "a positive integer", &ts->cfg.micro);
        if (b[B_TOKENS]) (void)set_int(f, b[B_TOKENS], "batch.tokens", 1, INT32_MAX, "a positive integer", &ts->cfg.tokens);
        if (ts->cfg.tokens && b[B_MICRO]) {
            if (sema_error(s, set_key_span(b[B_TOKENS]), "'batch.tokens' and 'batch.micro' cannot both be given"))
                sema_hint(s, "tokens sets each micro-batch by its number of tokens; keep one of them");
            ts->cfg.tokens = 0;
        }
        if (ts->cfg.tokens && ts->cfg.seq) {
            if (ts->cfg.tokens < ts->cfg.seq) {
                if (sema_error(s, set_value_span(b[B_TOKENS]),
                               "'batch.tokens' = %lld is less than the sequence length seq = %lld", (long long)ts->cfg.tokens,
                               (long long)ts->cfg.seq))
                    sema_hint(s, "use tokens >= %lld", (long long)ts->cfg.seq);
                ts->cfg.tokens = 0;
            } else {
                ts->cfg.micro = ts->cfg.tokens / ts->cfg.seq;
            }
        }
    }
    if (b[B_GLOBAL] && global > 0) {
        ts->cfg.global = global;
        if (!check_multiple(s, set_value_span(b[B_GLOBAL]), "global", global, ts->cfg.micro, ts->cfg.data_par))
            ts->cfg.global = 0;
    } else {
        ts->cfg.global = ts->cfg.micro * ts->cfg.data_par;
    }
    if (ts->cfg.global) ts->cfg.accumulation = ts->cfg.global / (ts->cfg.micro * ts->cfg.data_par);
    if (b[B_RAMP]) check_ramp(f, b[B_RAMP], ts, ts->cfg.data_par);
    if (b[B_BUCKETS]) check_buckets(f, b[B_BUCKETS], ts);
    if (b[B_CURRICULUM]) check_curriculum(f, b[B_CURRICULUM], ts);
    else if (ts->cfg.nbuckets) { /* the default curriculum: every bucket in turn from step 0 */
        ts->cfg.curriculum = arena_alloc(s->ar, sizeof *ts->cfg.curriculum);
        ts->cfg.curriculum[0] = (CurriculumStage){0, ts->cfg.buckets, ts->cfg.nbuckets};
        ts->cfg.ncurriculum = 1;
    }
}

/* The settings after the optimizer: recompute, offload, checkpoint, steps, eval, seed, clip. */
static void check_train_rest(Frame *f, const Node *const *k, TrainSettings *ts) {
    Sema *s = f->s;
    unsigned sub_present = 0;
    int which;
    if (k[T_RECOMPUTE]) {
        check_recompute(f, k[T_RECOMPUTE], ts);
        ts->cfg.recompute_at = set_value_span(k[T_RECOMPUTE]);
    }

    if (k[T_OFFLOAD]) {
        const Node *o[O_NKEYS] = {0};
        set_gather(s, &k[T_OFFLOAD]->list, offload_keys, O_NKEYS, "'offload'", o, &sub_present);
        if (o[O_ACTIVATIONS] && set_ident(f, o[O_ACTIVATIONS], "offload.activations", storage_names, 3, &which)) {
            ts->cfg.offload_activations = (Storage)which;
            ts->cfg.offload_at[0] = set_value_span(o[O_ACTIVATIONS]);
        }
        if (o[O_OPTIMIZER] && set_ident(f, o[O_OPTIMIZER], "offload.optimizer", storage_names, 3, &which)) {
            ts->cfg.offload_optimizer = (Storage)which;
            ts->cfg.offload_at[1] = set_value_span(o[O_OPTIMIZER]);
        }
    }

    if (k[T_CHECKPOINT]) {
        const Node *c[C_NKEYS] = {0};
        sub_present = 0;
        set_gather(s, &k[T_CHECKPOINT]->list, checkpoint_keys, C_NKEYS, "'checkpoint'", c, &sub_present);
        if (!(sub_present & (1u << C_EVERY)))
            missing_key(s, set_key_span(k[T_CHECKPOINT]), "'checkpoint'", "every", "every = 1000");
        else if (c[C_EVERY])
            (void)set_int(f, c[C_EVERY], "checkpoint.every", 1, INT64_MAX, "a positive integer", &ts->cfg.ckpt_every);
        if (c[C_DIR]) (void)set_path(f, c[C_DIR], "checkpoint.dir", "a directory", &ts->cfg.ckpt_dir);
        if (c[C_KEEP]) (void)set_int(f, c[C_KEEP], "checkpoint.keep", 1, INT32_MAX, "a positive integer", &ts->cfg.ckpt_keep);
        static const char *const on_error[] = {"stop", "continue"};
        if (c[C_ON_ERROR] && get_choice_string(f, c[C_ON_ERROR], "checkpoint.on_error", on_error, 2, &which))
            ts->cfg.ckpt_continue_on_error = which;
    }

    if (k[T_STEPS]) (void)set_int(f, k[T_STEPS], "steps", 1, INT64_MAX, "a positive integer", &ts->cfg.steps);

    if (k[T_EVAL]) {
        const Node *e[E_NKEYS] = {0};
        sub_present = 0;
        set_gather(s, &k[T_EVAL]->list, eval_keys, E_NKEYS, "'eval'", e, &sub_present);
        ts->cfg.eval_steps = 20;
        if (!(sub_present & (1u << E_EVERY))) missing_key(s, set_key_span(k[T_EVAL]), "'eval'", "every", "every = 250");
        else if (e[E_EVERY]) (void)set_int(f, e[E_EVERY], "eval.every", 1, INT64_MAX, "a positive integer", &ts->cfg.eval_every);
        if (e[E_STEPS]) (void)set_int(f, e[E_STEPS], "eval.steps", 1, INT64_MAX, "a positive integer", &ts->cfg.eval_steps);
    }

    if (k[T_SEED]) (void)set_int(f, k[T_SEED], "seed", 0, INT64_MAX, "a non-negative integer", &ts->cfg.seed);
    if (k[T_CLIP]) (void)set_num(f, k[T_CLIP], "clip", 0, 0, 1e300, 0, "a number >= 0 (0 for no clipping)", &ts->cfg.clip);
}

/* Graph builder hook: generation's forward, built beside the step (graph_build.h) - the model
 * instantiated again with that builder listening, then called on data.x of one row. Its errors
 * are the program's (the model must run at batch 1 too), with a note saying where they come from. */
static void build_forward(Frame *f, const Node *model_item, TrainSettings *ts, GraphBuilder *gb, Span at, Span data_at) {
    Sema *s = f->s;
    GraphBuilder *fwd = gb_forward_of(gb);
    if (!fwd) return;
    int before = diag_error_count();
    s->gb = fwd;
    Value *model = set_model(f, model_item);
    s->gb = NULL;
    sema_gb_name_params(s, fwd, model);
    const Dim *dims[2] = {dim_int(s->ar, 1), dim_int(s->ar, ts->cfg.seq)};
    Value *x = value_tensor(s->ar, DT_I32, 2, dims, data_at);
    gb_forward_input(fwd, x, "data.x");
    Value *pos = NULL; /* with documents, a model whose forward takes a second argument gets data.pos */
    if (ts->cfg.docs >= 0 && model->kind == V_MODEL && model_forward_arity(model) >= 2) {
        pos = value_tensor(s->ar, DT_I32, 2, dims, data_at);
        gb_forward_input(fwd, pos, "data.pos");
    }
    s->gb = fwd;
    Value *out = model->kind == V_MODEL ? eval_call_model(s, model, x, pos, at) : model;
    s->gb = NULL;
    gb_forward_output(fwd, out);
    if (diag_error_count() > before)
        diag_note(span_none(), "the errors above come from the model at batch 1, which generation (forward_logits) runs");
}

/* lr = A * B * ...: each factor a schedule (eval_schedule), appended to ts->lr. */
static void lr_factors(Frame *f, const Node *e, TrainSettings *ts, int depth) {
    if (!e) return;
    if (e->kind == N_BINARY && e->op == OP_MUL && depth < 16) {
        lr_factors(f, e->a, ts, depth + 1);
        lr_factors(f, e->b, ts, depth + 1);
        return;
    }
    LrFactor x = {.at = e->span};
    x.fn = eval_schedule(f, e, "lr", &x.args, &x.nargs);
    if (!x.fn) return;
    x.loop = x.fn->node->list.n > 1 && x.fn->node->list.v[1] && str_eqc(x.fn->node->list.v[1]->name, "batch") ? 2 : 1;
    LrFactor *n = arena_alloc(f->s->ar, sizeof(LrFactor) * (size_t)(ts->nlr + 1));
    if (ts->nlr) memcpy(n, ts->lr, sizeof(LrFactor) * (size_t)ts->nlr);
    n[ts->nlr++] = x;
    ts->lr = n;
}

void settings_check_train(Sema *s, Module *m, const Node *t) {
    TrainSettings *ts = arena_alloc(s->ar, sizeof(TrainSettings));
    ts->node = t;
    ts->cfg.name = sema_cstr(s, t->name);
    ts->module = m;
    ts->cfg.micro = 1;
    ts->cfg.data_par = ts->cfg.tensor_par = ts->cfg.pipeline_par = ts->cfg.sequence_par = ts->cfg.expert_par = 1;
    ts->cfg.schedule = PIPE_1F1B;
    ts->cfg.precision = PREC_F32;
    ts->cfg.seed = 1337;
    ts->cfg.shuffle = 1;
    ts->cfg.data_sets = 1;
    ts->cfg.docs = -1;
    ts->cfg.ckpt_keep = 0;
    ts->cfg.ckpt_dir = "checkpoints";
    const char *block = arena_printf(s->ar, "train block '%s'", ts->cfg.name);
    Span name_at = sema_span_of(t, t->name);
    ts->cfg.at = ts->cfg.lr_at = name_at;
    const Node *k[T_NKEYS] = {0};
    unsigned present = 0;
    set_gather(s, &t->list, train_keys, T_NKEYS, block, k, &present);
    set_required(s, present, T_MODEL, train_keys, name_at, block, "model = MyModel()");
    set_required(s, present, T_DATA, train_keys, name_at, block, "data = tokens(\"data/train_*.bin\", seq = 1024)");
    set_required(s, present, T_LOSS, train_keys, name_at, block, "loss = cross_entropy(model(data.x), data.y)");
    set_required(s, present, T_OPTIMIZER, train_keys, name_at, block, "optimizer = optim.adamw(lr = 6e-4)");
    set_required(s, present, T_STEPS, train_keys, name_at, block, "steps = 1000");

    Scope *bs = scope_new(s, m->scope, SC_BLOCK, ts->cfg.name, m);
    Frame f = set_frame(s, bs);

    /* The precision first: it sets the dtype the model's parameters are read in. */
    int which;
    if (k[T_PRECISION] && set_ident(&f, k[T_PRECISION], "precision", precision_names, 3, &which)) {
        ts->cfg.precision = (Precision)which;
        if (ts->cfg.precision == PREC_F16 && sema_error(s, set_value_span(k[T_PRECISION]),
                                                        "precision = f16 is not supported yet: f16 training needs loss scaling"))
            sema_hint(s, "use precision = bf16 (the range of f32, so no loss scaling)");
    }

    /* The model: everything else is about it. */
    GraphBuilder *gb = sema_gb_for_train(s, t); /* graph builder hook: NULL unless building this block */
    s->gb = gb;
    s->precision = ts->cfg.precision == PREC_BF16 ? PREC_BF16 : PREC_F32; /* until the optimizer (f32) */
    ts->model = k[T_MODEL] ? set_model(&f, k[T_MODEL]) : value_unknown(s->ar, name_at);
    s->gb = NULL;
    if (gb) sema_gb_name_params(s, gb, ts->model); /* graph builder hook: names the parameters */
    scope_define(s, bs, str_from("model"), ts->model, ENT_READONLY, k[T_MODEL] ? set_key_span(k[T_MODEL]) : name_at);
    /* freeze = [...] and trainable = false: the frozen parameters (groups.c) */
    groups_freeze(s, ts->model, k[T_FREEZE] ? eval_expr(&f, k[T_FREEZE]->a) : NULL,
                  k[T_MODEL] ? set_value_span(k[T_MODEL]) : name_at, gb);
    groups_adapters(s, ts->model, &ts->cfg.adapter_config, &ts->cfg.adapter_modules);

    if (k[T_DATA]) (void)check_tokens(&f, k[T_DATA], ts);

    /* parallel { ... } */
    check_parallel(&f, k[T_PARALLEL], ts);

    /* batch { ... } */
    check_batch(&f, k[T_BATCH], ts);
    check_data_sets(s, ts);

    /* data: x, y = i32[micro, seq] */
    if (ts->cfg.seq > 0) { /* other mistakes in tokens(...) do not change the shapes */
        const Dim *dims[2] = {dim_int(s->ar, ts->cfg.micro), dim_int(s->ar, ts->cfg.seq)};
        Value *d = value_new(s->ar, V_DATA, set_value_span(k[T_DATA]));
        d->n = ts->cfg.docs != -1 ? 3 : 2; /* data.pos with documents */
        d->items = arena_alloc(s->ar, sizeof(Value *) * 3);
        for (int i = 0; i < d->n; i++) d->items[i] = value_tensor(s->ar, DT_I32, 2, dims, set_value_span(k[T_DATA]));
        ts->data = d;
        if (gb) gb_data(gb, d); /* graph builder hook: data.x, data.y, data.pos */
    } else {
        ts->data = value_unknown(s->ar, name_at);
    }
    scope_define(s, bs, str_from("data"), ts->data, ENT_READONLY, k[T_DATA] ? set_key_span(k[T_DATA]) : name_at);

    /* loss: a scalar over model and data */
    if (k[T_LOSS]) {
        s->gb = gb; /* graph builder hook: the loss is the forward graph */
        Value *l = eval_expr(&f, k[T_LOSS]->a);
        s->gb = NULL;
        int scalar = l->kind == V_UNKNOWN || l->kind == V_FLOAT || l->kind == V_INT ||
                     (l->kind == V_TENSOR && l->t.rank == 0 && dtype_is_float(l->t.dt));
        if (!scalar) {
            if (sema_error(s, set_value_span(k[T_LOSS]), "'loss' must be a scalar, but it is %s", value_describe(s->ar, l)))
                sema_hint(s, "reduce it to one number, e.g. with mean(...) or cross_entropy(...)");
            l = value_unknown(s->ar, set_value_span(k[T_LOSS]));
        }
        ts->loss = l;
        if (gb) gb_loss(gb, l, set_value_span(k[T_LOSS])); /* graph builder hook */
    }

    if (k[T_MODEL] && ts->model->kind == V_MODEL && ts->cfg.seq > 0)
        build_forward(&f, k[T_MODEL], ts, gb, k[T_LOSS] ? set_value_span(k[T_LOSS]) : name_at, set_value_span(k[T_DATA]));

    s->precision = PREC_F32;

    /* optimizer: bound hyper-parameters, and its update run with them */
    if (k[T_OPTIMIZER]) {
        Value *o = eval_expr(&f, k[T_OPTIMIZER]->a);
        Span at = set_value_span(k[T_OPTIMIZER]);
        if (o->kind == V_OPTIMIZER) {
            groups_no_decay(s, ts->model, o, gb);           /* no_decay = [...] (groups.c) */
            int building = sema_gb_update_begin(gb, o, at); /* graph builder hook: the update graph */
            s->gb = building ? gb : NULL;
            eval_check_update(s, o, at);
            s->gb = NULL;
            if (building) gb_update_end(gb);
        } else if (o->kind == V_OPTIMIZER_DEF) {
            if (sema_error(s, at, "'optimizer' must be an optimizer with its hyper-parameters bound, but it is %s",
                           value_describe(s->ar, o)))
                sema_hint(s, "call it: optimizer = %s(lr = 1e-3)", diag_span_text(s->ar, at));
            o = value_unknown(s->ar, at);
        } else if (o->kind != V_UNKNOWN) {
            if (sema_error(s, at, "'optimizer' must be an optimizer, but it is %s", value_describe(s->ar, o)))
                sema_hint(s, "for example: optimizer = optim.adamw(lr = 6e-4)");
            o = value_unknown(s->ar, at);
        }
        ts->optimizer = o;
    }

    if (k[T_LR]) {
        ts->cfg.lr_at = set_value_span(k[T_LR]);
        lr_factors(&f, k[T_LR]->a, ts, 0);
    }
    schedule_lower(s, ts); /* the schedule as a scalar program (schedule.c) */

    check_train_rest(&f, k, ts);

    if (s->out) ptrvec_push(s->ar, &s->out->trains, ts);
}
