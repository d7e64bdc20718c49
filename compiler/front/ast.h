/* ast.h - the abstract syntax tree built by the lemon parser (compiler/front/mbt.y).
 *
 * Pipeline position: compiler/front/lexer.re -> compiler/front/mbt.y -> [AST] -> sema.
 * Every node carries the Span of the source it came from. One struct serves every kind; the
 * table below says which fields each kind uses (unused fields are zero). Names are slices into
 * the source text (no copies); string literals are unescaped into the arena. */
#ifndef MBT_AST_H
#define MBT_AST_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "diag.h"

typedef enum NodeKind {
    /* ---- declarations (top level) -------------------------------------------------- */
    N_PROGRAM,   /* list: declarations                                                  */
    N_IMPORT,    /* name: module name; alias: `as` name (len 0 when absent)             */
    N_MODEL,     /* name; list: N_FPARAM constants; list2: body (statements, N_FN)      */
    N_FN,        /* name; list: N_FPARAM; type: result N_TYPE or NULL; list2: body      */
    N_OPTIMIZER, /* name; list: N_FPARAM hyper-parameters; list2: N_STATE and N_FN      */
    N_TRAIN,     /* name; list: N_SETTING / N_SETTING_BLOCK                             */
    N_SERVE,     /* name; list: N_SETTING / N_SETTING_BLOCK                             */
    /* ---- parts of declarations ------------------------------------------------------ */
    N_FPARAM,        /* name; type: N_TYPE or NULL; a: default value or NULL                */
    N_TYPE,          /* name: dtype (f32, bf16, i32 ...); list: dims; ival: 1 if [..] given */
    N_STATE,         /* list: N_FPARAM (name, a = initial value) - optimizer state          */
    N_SETTING,       /* name: key; a: value                                                 */
    N_SETTING_BLOCK, /* name: key; list: N_SETTING / N_SETTING_BLOCK                     */
    /* ---- statements ------------------------------------------------------------------- */
    N_PARAM_DECL, /* name: target; type: N_TYPE; a: initializer expr or NULL (zeros)     */
    N_ASSIGN,     /* list: targets (one, or several for `a, b = ...`); a: value          */
    N_AUG_ASSIGN, /* op: OP_ADD/SUB/MUL/DIV; a: target; b: value  (x += y)               */
    N_EXPR_STMT,  /* a: expression                                                       */
    N_RETURN,     /* a: value or NULL                                                    */
    N_FOR,        /* name: loop variable; a: iterable; list: body                        */
    N_IF,         /* a: condition; list: then-body; list2: else-body (maybe one N_IF)    */
    /* ---- expressions ------------------------------------------------------------------ */
    N_NAME,   /* name                                                                */
    N_INT,    /* ival                                                                */
    N_FLOAT,  /* fval                                                                */
    N_STRING, /* sval: unescaped bytes (NUL-terminated in the arena)                 */
    N_BOOL,   /* ival: 0 or 1                                                        */
    N_BINARY, /* op; a, b                                                            */
    N_UNARY,  /* op: OP_NEG/OP_POS/OP_NOT; a                                         */
    N_CALL,   /* a: callee; list: arguments (expressions, then N_KWARG)              */
    N_KWARG,  /* name; a: value                                                      */
    N_INDEX,  /* a: base; list: indices (expressions or N_SLICE)                     */
    N_SLICE,  /* a: start or NULL; b: stop or NULL                                   */
    N_ATTR,   /* a: base; name: attribute (`x.T`, `betas.0` gives name "0")          */
    N_TUPLE,  /* list: elements  (a, b)                                              */
    N_LIST,   /* list: elements  [a, b]                                              */
    N_COMP,   /* a: element; name: variable; b: iterable  [a for name in b]          */
    N_RANGE,  /* a: start; b: end (exclusive)  a..b                                  */
    N_KIND_COUNT
} NodeKind;

typedef enum Op {
    OP_NONE,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_MOD,
    OP_POW,
    OP_MATMUL,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_AND,
    OP_OR,
    OP_NEG,
    OP_POS,
    OP_NOT,
} Op;

typedef struct Node Node;
typedef struct NodeList {
    Node **v;
    int n;
} NodeList;

struct Node {
    NodeKind kind;
    Op op;
    Span span;
    Str name;
    Str alias;
    int64_t ival;
    double fval;
    const char *sval;
    uint32_t slen;
    Node *a, *b;
    Node *type;
    NodeList list, list2;
    uint32_t depth; /* height of the expression tree under this node (bounded by the parser) */
};

Node *ast_new(Arena *ar, NodeKind k, Span sp);  /* a zeroed node */
void ast_push(Arena *ar, NodeList *l, Node *n); /* append to a list */
const char *ast_kind_name(NodeKind k);          /* "N_CALL" -> "call" */
const char *ast_op_text(Op op);                 /* OP_ADD -> "+" */
void ast_print(FILE *out, const Node *n);       /* --emit=ast: indented tree with spans */
int ast_check_spans(const Node *n);             /* 1 if every node has a span inside its file */

#endif
