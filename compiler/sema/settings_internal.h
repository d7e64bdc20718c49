/* settings_internal.h - what the two files that check a module's blocks share: settings.c (train
 * blocks, and the readers of a block's keys and values) and settings_serve.c (serve blocks). Each
 * reader reports a value that is not what the key allows as an error naming the key, what was
 * given and what is allowed, and returns 0 then (1 when the value is good). */
#ifndef MBT_SETTINGS_INTERNAL_H
#define MBT_SETTINGS_INTERNAL_H

#include "sema_internal.h"

typedef enum SetKind { SK_VALUE, SK_BLOCK } SetKind;

typedef struct KeySpec {
    const char *name;
    SetKind kind;
} KeySpec;

Span set_key_span(const Node *item);   /* the key's name in a setting */
Span set_value_span(const Node *item); /* its value (the whole setting when it has none) */
/* the frame a block's settings are evaluated in: the module's names, plus model and data */
Frame set_frame(Sema *s, Scope *bs);
/* the block's settings by key into out[] (spec order) and *present's bits; an unknown or repeated
 * key, or a block given as a value (or the reverse), is an error */
void set_gather(Sema *s, const NodeList *items, const KeySpec *spec, int nspec, const char *where, const Node **out,
                unsigned *present);
/* a setting's value as an integer in [lo, hi], a number in a range (lo_open, hi_open: excluded), a
 * path (names: what it may name, for the message), one of the identifiers choices[0..n), the model
 * instance a `model` key names (NULL when it is none) */
int set_int(Frame *f, const Node *item, const char *key, int64_t lo, int64_t hi, const char *allowed, int64_t *out);
int set_num(Frame *f, const Node *item, const char *key, double lo, int lo_open, double hi, int hi_open, const char *allowed,
            double *out);
int set_path(Frame *f, const Node *item, const char *key, const char *names, const char **out);
int set_ident(Frame *f, const Node *item, const char *key, const char *const *choices, int n, int *out);
Value *set_model(Frame *f, const Node *item);
/* an error at `at` when key idx of spec is not among *present's, with an example of it */
void set_required(Sema *s, unsigned present, int idx, const KeySpec *spec, Span at, const char *block, const char *example);

#endif
