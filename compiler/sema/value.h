/* value.h - what the semantic checker computes for every expression.
 *
 * Sema evaluates a program abstractly: numbers known at compile time stay numbers (integers as
 * possibly-symbolic Dims), tensors are reduced to their type (dtype + shape), and models,
 * functions, modules and optimizers are first-class values. The same walk, with concrete
 * constants, instantiates a train block's model; the graph builder of a later stage hangs IR
 * nodes off tensor values (graph_id). V_UNKNOWN stands for a value whose type is not known yet
 * (an untyped parameter checked on its own, or the result of an error) and silences follow-on
 * errors. */
#ifndef MBT_VALUE_H
#define MBT_VALUE_H

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "dim.h"

typedef enum DType { DT_F32, DT_F16, DT_BF16, DT_F64, DT_I32, DT_I64, DT_BOOL, DT_COUNT } DType;

const char *dtype_name(DType dt);   /* "f32" */
int dtype_size(DType dt);           /* bytes an element takes: 4 for f32, 2 for bf16, 1 for bool; 0 for no dtype */
int dtype_parse(Str s, DType *out); /* 1 if s names a dtype */
int dtype_is_float(DType dt);       /* f32, f16, bf16, f64 */

/* A tensor's type. rank 0 is a scalar tensor, printed f32[]. */
typedef struct TensorType {
    DType dt;
    int rank;
    const Dim **dims;
} TensorType;

char *tensor_type_str(Arena *ar, const TensorType *t);        /* "f32[B, T, 768]" */
int tensor_type_eq(const TensorType *a, const TensorType *b); /* same dtype, rank and dims */

typedef enum ValueKind {
    V_UNKNOWN,       /* type not known: accepted everywhere, no further errors */
    V_NONE,          /* result of a function without `return` */
    V_INT,           /* compile-time integer: dim (known or symbolic); runtime ints are symbolic */
    V_FLOAT,         /* floating scalar: f, known when fknown */
    V_BOOL,          /* boolean: b, known when bknown */
    V_STRING,        /* s */
    V_TENSOR,        /* t */
    V_TUPLE,         /* items[n] */
    V_LIST,          /* items[n]; len = length (n == 1 representative item when len is symbolic) */
    V_RANGE,         /* lo..hi as dims: dim = lo, len = hi */
    V_MODULE,        /* an imported module: scope, s = its name */
    V_MODEL_DEF,     /* a model declaration (callable: instantiates): node, scope = defining module */
    V_MODEL,         /* a model instance: node = its N_MODEL, scope = its members */
    V_FN,            /* a function: node = N_FN, scope = enclosing (module or model instance) */
    V_BUILTIN,       /* a builtin function: builtin */
    V_OPTIMIZER_DEF, /* an optimizer declaration: node, scope = defining module */
    V_OPTIMIZER,     /* an optimizer with its hyper-parameters bound: node, scope */
    V_DATA,          /* a data source in a train block: items[0] = x, items[1] = y */
    V_KIND_COUNT
} ValueKind;

typedef struct Scope Scope;     /* defined by sema.c */
typedef struct Builtin Builtin; /* defined by builtins.c */

typedef struct Value {
    ValueKind kind;
    Span origin;          /* where the value was made (for "note: ... from here") */
    const Dim *dim;       /* V_INT value; V_RANGE start */
    const Dim *len;       /* V_LIST length; V_RANGE end */
    double f;             /* V_FLOAT */
    int fknown;           /* V_FLOAT: f is known */
    int b, bknown;        /* V_BOOL */
    const char *s;        /* V_STRING (NUL-terminated) */
    TensorType t;         /* V_TENSOR */
    struct Value **items; /* V_TUPLE, V_LIST, V_DATA; V_OPTIMIZER: items[0] its no_decay list (n = 1) */
    int n;
    int frozen;             /* V_MODEL: instantiated with trainable = false (groups.c) */
    const Node *node;       /* V_MODEL_DEF, V_MODEL, V_FN, V_OPTIMIZER_DEF, V_OPTIMIZER */
    Scope *scope;           /* see the kinds above */
    const Builtin *builtin; /* V_BUILTIN */
    int graph_id;           /* the graph builder's node for a tensor: node id + 1 (0 = none; graph_build.h) */
} Value;

const char *value_kind_name(ValueKind k);                                          /* "tensor", "integer", "model", ... */
Value *value_new(Arena *ar, ValueKind k, Span origin);                             /* zeroed value of kind k */
Value *value_unknown(Arena *ar, Span origin);                                      /* V_UNKNOWN */
Value *value_int(Arena *ar, const Dim *d, Span origin);                            /* V_INT */
Value *value_float(Arena *ar, double f, int known, Span origin);                   /* V_FLOAT */
Value *value_bool(Arena *ar, int b, int known, Span origin);                       /* V_BOOL */
Value *value_tensor(Arena *ar, DType dt, int rank, const Dim **dims, Span origin); /* V_TENSOR (dims copied) */
char *value_type_str(Arena *ar, const Value *v); /* "f32[B, T, d]", "integer 768", "model Block", ... */
/* What a value is, for the checker's and the graph builder's messages: "integer 768", "f32[4, 64]",
 * "model 'GPT2'", "module 'optim'". */
char *value_describe(Arena *ar, const Value *v);
char *value_float_str(Arena *ar, double f);    /* shortest text reading back as f: "0.02", "1e-8", "2.0" */
int value_number(const Value *v, double *out); /* 1 if v is a V_INT or V_FLOAT with a known value (into *out) */

/* ---- operations on values (shape.c): each reports its own errors through diag and then
 * returns V_UNKNOWN, so callers never cascade. `at` is the whole expression's span. ---- */
Value *value_binary(Arena *ar, Op op, Value *a, Span sa, Value *b, Span sb, Span at); /* + - * / % ^ @ == < and or ... */
Value *value_unary(Arena *ar, Op op, Value *a, Span at);                              /* -x, +x, not x */
/* base[indices]: gather with an integer tensor, slices a:b, integer positions; tuples/lists too. */
Value *value_index(Arena *ar, Value *base, Span sbase, Value **idx, Span *sidx, int nidx, const int *is_slice, Value **slice_lo,
                   Value **slice_hi, Span at);
Value *value_tensor_attr(Arena *ar, Value *t, Str name, Span at); /* x.T (swap last two dims), x.shape, x.dtype... */
int value_truthy(const Value *v, int *known);                     /* condition of if/and/or */
/* a @ b, also for matmul(a, b): messages begin with `what` ("'@'" or "matmul"). */
Value *value_matmul(Arena *ar, const char *what, Value *a, Span sa, Value *b, Span sb, Span at);
/* Elementwise combination of two numbers/tensors for builtins (max, min, where): broadcast shape and
 * joined dtype, errors prefixed by `what`; two numbers give an unknown float (V_UNKNOWN for two ints). */
Value *value_elementwise(Arena *ar, const char *what, Value *a, Span sa, Value *b, Span sb, Span at);

/* ---- builtins (builtins.c) ---- */
typedef struct CallArgs {
    Value **pos;  /* positional arguments */
    Span *pos_at; /* their spans */
    int npos;
    Str *kw_name; /* keyword arguments */
    Value **kw;
    Span *kw_at;
    int nkw;
    Span callee_at; /* span of the callee expression */
    Span at;        /* span of the whole call */
} CallArgs;

const Builtin *builtin_find(Str name);              /* NULL if not a builtin */
const char *builtin_name(const Builtin *b);         /* its name */
int builtin_count(void);                            /* for "did you mean" */
const char *builtin_name_at(int i);                 /* i-th builtin's name */
const char *builtin_param(const Builtin *b, int i); /* its i-th parameter's name; NULL past the last (graph builder) */
/* The shape rule and checks; fill_dt is the dtype zeros(...) and ones(...) make: f32, or bf16
 * while a precision = bf16 model is evaluated. */
Value *builtin_call(Arena *ar, const Builtin *b, const CallArgs *args, DType fill_dt);
Value *builtin_value(Arena *ar, const Builtin *b, Span at); /* what the bare name means: V_FLOAT for pi, else V_BUILTIN */

#endif
