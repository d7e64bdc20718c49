/* sema_internal.h - what the parts of the semantic checker share: the checker's context,
 * scopes, evaluation frames, de-duplicated diagnostics, and the resolved train/serve settings.
 *
 * Pipeline position: AST (parse.h) -> [sema] -> graph IR.
 *   sema.c      drives: modules and imports, top-level declarations, scopes and name lookup,
 *               diagnostics (each error reported once), "did you mean" suggestions.
 *   eval.c      evaluates statements and expressions abstractly to Values (value.h);
 *   eval_call.c the calls they make: it instantiates models, calls functions, unifies declared
 *               tensor types with the arguments, and checks every model, function and
 *               optimizer on its own.
 *   settings.c  checks train and serve blocks and resolves their numbers (TrainConfig,
 *               ServeConfig in settings.h) for the stages after sema; schedule.c lowers the
 *               learning-rate schedule to a scalar program (scalar.h).
 *   build.c     drives the graph build (sema_build_train*, sema.h): runs the checker with a
 *               graph builder (graph_build.h) waiting for one train block, and does the builder's
 *               sema-side work - naming parameters by walking the model's scopes, the update's
 *               optimizer, its `lr` and its results.
 * The builder's hooks in eval.c, eval_call.c and settings.c hand it values (value.h); it sees
 * nothing of this header. Not part of the compiler's public surface: the stages after sema read
 * sema.h and settings.h. */
#ifndef MBT_SEMA_INTERNAL_H
#define MBT_SEMA_INTERNAL_H

#include <stdint.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "dim.h"
#include "graph_build.h"
#include "module.h"
#include "sema.h"
#include "settings.h"
#include "value.h"

/* ---- limits: nothing a user writes may hang the checker or overflow the C stack ---- */

#define SEMA_MAX_CALL_DEPTH 64 /* nested calls and instantiations */
#define SEMA_MAX_NEST                                                                                                            \
    2000                           /* nested expressions and statements, across calls: about
                                     * 1.2 MB of C stack (3.4 MB with sanitizers) at the limit */
#define SEMA_MAX_UNROLL 4096       /* longest loop or comprehension unrolled item by item */
#define SEMA_MAX_LIST 65536        /* longest list with a known length */
#define SEMA_STEP_BUDGET 20000000L /* evaluation steps for one whole program, plus: */
#define SEMA_STEPS_PER_BYTE 4L     /* steps a source byte (ordinary code takes 0.1 to 1.5) */
/* Memory evaluation may hold beyond what the sources and syntax trees held when checking started:
 * SEMA_MAX_EVAL_MIB, plus SEMA_EVAL_BYTES_PER_BYTE for each source byte (one function of a
 * million plain statements holds about 74 bytes of values a source byte). */
#define SEMA_MAX_EVAL_MIB 1024L
#define SEMA_EVAL_BYTES_PER_BYTE 64L
#define SEMA_MAX_MODULE_DEPTH 64 /* nested imports being checked */

typedef struct Sema Sema;
typedef struct Frame Frame;

/* ---- scopes ---- */

typedef enum EntryKind {
    ENT_DECL,     /* a top-level model, fn or optimizer */
    ENT_IMPORT,   /* an imported module */
    ENT_BLOCK,    /* a train or serve block: a name, not a value */
    ENT_CONST,    /* a model constant or an optimizer hyper-parameter */
    ENT_PARAM,    /* a model parameter (`param ...`) */
    ENT_SUB,      /* a sub-model or a list of sub-models */
    ENT_MEMBER,   /* another value computed in a model body (`hd = d / heads`) */
    ENT_FN,       /* a function of a model instance or optimizer */
    ENT_LOCAL,    /* a local variable, loop variable or function parameter */
    ENT_DIM,      /* an upper-case dimension bound at a call (B, T) */
    ENT_STATE,    /* an optimizer state variable, inside update */
    ENT_UPDATE_P, /* update's parameter p */
    ENT_READONLY, /* update's g and t; a block's model and data */
} EntryKind;

typedef struct Entry {
    Str name;
    Value *v; /* NULL only for ENT_BLOCK */
    EntryKind kind;
    Span decl; /* where the name was defined (notes point here) */
} Entry;

typedef enum ScopeKind { SC_MODULE, SC_MODEL, SC_OPTIMIZER, SC_LOCAL, SC_BLOCK } ScopeKind;

struct Scope {
    Scope *parent; /* lookup goes on here: local -> instance -> module */
    ScopeKind kind;
    const char *name; /* module, model, optimizer or function name */
    Module *module;   /* the module the scope belongs to */
    Entry *e;         /* entries in definition order */
    int n, cap;
    int *index; /* open-addressing hash over e: entry index + 1, 0 = empty */
    int icap;
};

Scope *scope_new(Sema *s, Scope *parent, ScopeKind kind, const char *name, Module *m);
Entry *scope_find(Scope *sc, Str name);                                              /* this scope only; NULL if absent */
Entry *scope_lookup(Scope *sc, Str name, Scope **where);                             /* along the parent chain */
Entry *scope_define(Sema *s, Scope *sc, Str name, Value *v, EntryKind k, Span decl); /* add or replace */

/* A copy of a scope's entries, to evaluate both branches of an `if` whose condition is unknown. */
typedef struct ScopeSnap {
    Entry *e;
    int n;
} ScopeSnap;
ScopeSnap scope_snapshot(Sema *s, Scope *sc);
void scope_restore(Sema *s, Scope *sc, ScopeSnap snap);

/* ---- per-declaration bookkeeping ---- */

typedef struct NodeInfo {
    int generic;       /* checked on its own: 0 not yet, 1 under way, 2 done */
    int broken;        /* evaluating its body reported errors: it is not evaluated again */
    const Node *owner; /* for a fn: the N_MODEL or N_OPTIMIZER it belongs to, else NULL */
    Scope *defscope;   /* scope of the module that declares it (or its owner) */
    Module *module;
    Value *generic_inst; /* for a model: its instance with symbolic constants */
} NodeInfo;

/* ---- resolved settings: the public numbers (settings.h) and what sema keeps beside them ---- */

/* One factor of a train block's schedule: a function whose first parameter is `step` (and whose
 * second may be `batch`, the global batch the ramp gives that step), with the rest bound. */
typedef struct LrFactor {
    Value *fn;    /* V_FN */
    Value **args; /* its parameters after those the loop supplies, bound (nargs of them) */
    int nargs;
    int loop; /* how many the training loop supplies: 1 (step) or 2 (step, batch) */
    Span at;  /* the call in the train block */
} LrFactor;

typedef struct TrainSettings {
    const Node *node; /* the N_TRAIN */
    Module *module;
    Value *model;     /* V_MODEL (or V_UNKNOWN after an error) */
    Value *data;      /* V_DATA: x, y = i32[micro, seq] */
    Value *loss;      /* f32[] */
    Value *optimizer; /* V_OPTIMIZER with its hyper-parameters bound */
    LrFactor *lr;     /* the schedule: the product of these factors (lr = A * B), none for the constant 1 */
    int nlr;
    TrainConfig cfg; /* the numbers the stages after sema read */
} TrainSettings;

typedef struct ServeSettings {
    const Node *node; /* the N_SERVE */
    Module *module;
    Value *model;
    ServeConfig cfg;
} ServeSettings;

typedef struct SemaResult {
    PtrVec trains; /* TrainSettings* in source order, module by module */
    PtrVec serves; /* ServeSettings* */
} SemaResult;

/* sema_check, keeping the resolved settings for the next stage. Returns the errors reported. */
int sema_run(Loader *ld, Module *main, SemaResult *out);
/* The same, with gb building the graph of the train block `train` on the way (build.c). */
int sema_run_build(Loader *ld, Module *main, SemaResult *out, GraphBuilder *gb, const Node *train);

/* ---- the checker's context ---- */

typedef struct StrSet {
    const char **v;
    int n, cap;
} StrSet;

typedef struct PtrMap {
    const void **key;
    void **val;
    int n, cap;
} PtrMap;
/* The value slot of key in m (open addressing, grown in ar); *fresh = 1 when key was just added
 * (its slot holds NULL). */
void **ptrmap_slot(Arena *ar, PtrMap *m, const void *key, int *fresh);

struct Sema {
    Arena *ar;   /* where evaluation allocates: a scratch arena while a declaration is
                           * checked on its own, dropped after it (values, dims, scopes) */
    Arena *keep; /* what outlives that: node bookkeeping, reported errors, module
                           * scopes, train/serve settings (the loader's arena) */
    Loader *ld;
    SemaResult *out;
    StrSet reported;                        /* "file:offset:message" of each error reported by this checker */
    int muted;                              /* the last error of ours repeated an earlier one ... */
    int muted_at;                           /* ... when diag_error_count() was this: drop notes and hints after it */
    PtrMap info;                            /* const Node * -> NodeInfo * */
    const Node *stack[SEMA_MAX_CALL_DEPTH]; /* functions and models being evaluated */
    int depth;
    int nest; /* nested eval_expr/eval_stmt, across calls */
    int nest_reported;
    long steps;                                 /* evaluation steps so far */
    size_t mem0;                                /* arena_live_bytes() when checking started */
    int over_budget;                            /* the step budget ran out: everything evaluates to V_UNKNOWN */
    Module *modules[SEMA_MAX_MODULE_DEPTH + 1]; /* the import chain being checked */
    int module_depth;
    GraphBuilder *gb;      /* the graph builder (graph_build.h): set only while the train block being
                           * built instantiates its model and evaluates its loss; NULL while checking */
    GraphBuilder *gb_want; /* the builder waiting for its train block (sema_build_train_graph), or NULL */
    const Node *gb_train;  /* that train block */
    Precision precision;   /* while a train block's model and loss are evaluated, its precision: bf16 makes
                           * each f32 parameter a bf16 value (its f32 master copy is what the optimizer
                           * updates), and f32 in a declared tensor type then accepts bf16 */
};

NodeInfo *sema_info(Sema *s, const Node *n); /* created (zeroed) on first use */

/* ---- diagnostics: each error is reported once (same file, offset and text) ---- */

/* Reports an error; returns 0 (and drops it with its notes and hints) when it is a repeat. */
int sema_error(Sema *s, Span at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sema_note(Sema *s, Span at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sema_hint(Sema *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "did you mean": the closest candidate within the edit-distance limit for the name. */
typedef struct Suggest {
    Str name;
    int limit; /* 2, or 1 for names of 3 bytes or fewer */
    int best;  /* best distance so far (limit + 1: none) */
    const char *pick;
    uint32_t picklen;
} Suggest;
void suggest_init(Suggest *g, Str name);
void suggest_try(Suggest *g, const char *cand, uint32_t len);
void suggest_scope(Suggest *g, Scope *sc, int chain); /* entries of sc (and its parents) */
void suggest_builtins(Suggest *g);
void sema_hint_suggest(Sema *s, const Suggest *g); /* `hint: did you mean 'x'?` if any */

/* ---- text for messages ---- */

char *sema_cstr(Sema *s, Str x);             /* NUL-terminated copy */
Span sema_span_of(const Node *n, Str piece); /* span of a slice of n's source (its name) */

/* Counts one evaluation step and one level of nesting; 0 means stop (limit reported once). */
int sema_enter(Sema *s, Span at);
void sema_leave(Sema *s);

/* ---- evaluation (eval.c) ---- */

typedef enum FrameKind {
    FR_MODEL_BODY, /* a model body: assignments define members of the instance */
    FR_FN,         /* a function body */
    FR_UPDATE,     /* an optimizer's update: p, state variables and locals may be assigned */
    FR_BLOCK,      /* a train/serve block's setting values */
    FR_EXPR,       /* default values and other lone expressions */
} FrameKind;

struct Frame {
    Sema *s;
    FrameKind kind;
    Scope *scope;       /* where names are defined and looked up first */
    const Node *fn;     /* the N_FN being evaluated, or NULL */
    const char *fname;  /* its name, for messages */
    const Node *result; /* the declared result N_TYPE, or NULL */
    Value *ret;         /* the first value returned */
    int returned;       /* every path evaluated so far has returned */
    int generic;        /* constants are symbolic (checking on its own) */
    const char *owner;  /* model or optimizer name, for messages */
    TensorType p_type;  /* FR_UPDATE: the type of p, kept by every assignment to p or state */
};

Value *eval_expr(Frame *f, const Node *n);
void eval_body(Frame *f, const NodeList *stmts);
const Dim *eval_dim(Sema *s, Scope *sc, const Node *n, int free_upper); /* NULL: unknown or error */

/* Generic checks of declarations (each runs once; later calls return at once). */
void eval_check_model(Sema *s, const Node *model);
void eval_check_fn(Sema *s, const Node *fn);
void eval_check_optimizer(Sema *s, const Node *opt);
/* Runs an optimizer's update with its hyper-parameters as bound in opt (a V_OPTIMIZER). */
void eval_check_update(Sema *s, Value *opt, Span at);

/* `model(x)` for a model value and an argument value, as if written at `at` in the train
 * block (generation's batch-1 forward; graph_build.h). */
Value *eval_call_model(Sema *s, Value *model, Value *x, Value *pos, Span at); /* pos: NULL, or forward's 2nd argument */
int model_forward_arity(Value *model); /* the parameters of a model instance's forward; -1: none */

/* A learning-rate schedule: `value` is a call binding every parameter but the first, `step`, and
 * a second named `batch` (or a function all of whose other parameters have defaults); the stdlib
 * lr module's `rule` and `base` are checked (lr.batch_scale). key names the setting. Returns
 * the function (V_FN) with its bound values in *args and their count in *nargs, or NULL after an error. */
Value *eval_schedule(Frame *f, const Node *value, const char *key, Value ***args, int *nargs);

/* ---- the graph build (build.c): the sema side of graph_build.h ---- */

/* 1 while the graph builder listens: sema is evaluating the train block being built with
 * concrete constants (generic: the frame or call checks a declaration on its own). */
static inline int gb_listening(const Sema *s, int generic) { return s->gb != NULL && !generic; }
/* The builder when `train` is the block being built (started on the checker's arena), else NULL. */
GraphBuilder *sema_gb_for_train(Sema *s, const Node *train);
/* After instantiation: names the parameters of model by their path, walking its members. */
void sema_gb_name_params(Sema *s, GraphBuilder *gb, Value *model);
/* The walk over a model's instances that gives parameters their paths (build.c): each instance
 * met first at prefix ("a.b.") to model (frozen: inside an instance made with trainable = false;
 * 1 back: not its members), each parameter entry to param as name. The naming, the parameter
 * groups and the LoRA adapters' list (groups.c) all see the same paths. */
typedef struct SemaWalk SemaWalk;
struct SemaWalk {
    Sema *s;
    void *ctx;
    int (*model)(SemaWalk *w, Value *v, const char *prefix, int frozen);
    void (*param)(SemaWalk *w, Entry *e, const char *name, int frozen);
};
void sema_walk_models(SemaWalk *w, Value *model);
/* Before the train block's optimizer opt runs update: gb_update_begin with its name and state count. */
int sema_gb_update_begin(GraphBuilder *gb, Value *opt, Span at);
/* While update runs the optimizer's hyper-parameter lr (in opt_scope) is the update graph's input
 * "lr": swapped in, its entry returned with its number in *saved (NULL when nothing was swapped;
 * sema_gb_lr_restore gives it back). */
Entry *sema_gb_lr_swap(GraphBuilder *gb, Scope *opt_scope, Value **saved);
void sema_gb_lr_restore(Entry *lr, Value *saved);
/* The same for weight_decay when the parameters have groups (no_decay): an f32[n] that is 0 on the
 * parameters not decayed (gb_update_decay); sema_gb_lr_restore gives it back. */
Entry *sema_gb_decay_swap(GraphBuilder *gb, Scope *opt_scope, Value **saved);
/* After update ran in loc: p (named p_name) and the state variables are the update graph's results. */
void sema_gb_update_results(GraphBuilder *gb, Scope *loc, Str p_name, Span at);

/* ---- parameter groups (groups.c) ---- */

/* 1 when list (a setting named what) is a list of well-formed name patterns and kinds; else reported. */
int groups_check_list(Sema *s, const Value *list, const char *what);
/* The train block's frozen parameters: those matched by list (freeze = [...], NULL when not given)
 * and those under an instance made with trainable = false, marked GP_FROZEN through gb (NULL when
 * not building). Patterns that match nothing, and a model left with nothing to train, are errors. */
void groups_freeze(Sema *s, Value *model, const Value *list, Span at, GraphBuilder *gb);
/* PEFT's adapter_config.json for the model's nn.LoRALinear instances and their paths one a line
 * (TrainConfig.adapter_config, adapter_modules); NULL, NULL when it has none. */
void groups_adapters(Sema *s, Value *model, const char **config, const char **modules);
/* The optimizer's no_decay list (kept on opt by eval_call.c) matched against model's parameters,
 * marked GP_NO_DECAY through gb; patterns that match nothing are errors. */
void groups_no_decay(Sema *s, Value *model, Value *opt, GraphBuilder *gb);

/* ---- settings (settings.c) ---- */

void settings_check_train(Sema *s, Module *m, const Node *train);
void settings_check_serve(Sema *s, Module *m, const Node *serve);
/* The train block's schedule (the product of ts->lr's factors, or none: the constant 1.0)
 * lowered into ts->cfg.lr, and its text into ts->cfg.schedule_text (schedule.c). Constructs a
 * schedule cannot use are errors at their source. */
void schedule_lower(Sema *s, TrainSettings *ts);

#endif
