/* eval_internal.h - what the two halves of sema's evaluator share (eval.c: values, declared
 * types, expressions and statements; eval_call.c: calls, instantiation, declarations checked on
 * their own, optimizer updates and schedules). Included by those two files only. */
#ifndef MBT_EVAL_INTERNAL_H
#define MBT_EVAL_INTERNAL_H

#include "sema_internal.h"

#define SEMA_PI 3.14159265358979323846

/* A call's arguments as evaluated (eval_call.c builds them). */
typedef struct Call {
    CallArgs a;
    Span *kw_name_at; /* the keyword names, for errors about them */
    int generic;      /* made by code checked on its own (constants symbolic) */
} Call;

/* ---- helpers (eval.c) ---- */

Value *unknown_at(Sema *s, Span at);
Span span_or(const Node *n, Span fallback);
int is_upper_name(Str name);
Frame frame_make(Sema *s, FrameKind k, Scope *sc, int generic);
Span decl_name_span(const Node *decl);
int is_number(const Value *v);
int on_stack(Sema *s, const Node *n);
Entry *find_member(Scope *sc, const char *name);
const Node *find_fn(const Node *owner, const char *name);
const char *scope_sig(Sema *s, Scope *sc);
Value *unknownify(Sema *s, Value *v, Str name, Span at, int depth);
int type_dtype(Sema *s, const Node *ty, DType *dt);
const char *type_text(Sema *s, const Node *ty);
void type_bind(Sema *s, Scope *loc, const Node *ty, const Value *v, Span decl);
int type_match(Sema *s, Scope *loc, const Node *ty, const Value *v);
const char *type_with(Sema *s, Scope *loc, const Node *ty, Span own);
Value *value_of_type(Sema *s, Scope *loc, const Node *ty, Span origin, int fresh, Str name);
Value *declared_result(Sema *s, const Node *fn, Scope *loc, Span at);

/* ---- calls (eval_call.c) ---- */

void build_call(Frame *f, const Node *n, Call *c);
Value *eval_apply(Sema *s, Value *callee, Call *c);

#endif
