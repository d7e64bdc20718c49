/* arena.h - bump allocation for everything the compiler builds (tokens, AST, types, values).
 *
 * The compiler never frees individual objects: each compilation owns one Arena and drops it
 * whole at exit. Allocation failure is fatal (an internal error, exit 2). */
#ifndef MBT_ARENA_H
#define MBT_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
    ArenaBlock *head; /* newest block; older blocks chained behind it */
} Arena;

/* A string slice: pointer into the source or into the arena, not NUL-terminated in general. */
typedef struct Str {
    const char *p;
    uint32_t len;
} Str;
#define STR_ARG(s) (int)(s).len, (s).p /* for "%.*s" */

void *arena_alloc(Arena *a, size_t n);                  /* zeroed memory, 16-byte aligned */
void *arena_dup(Arena *a, const void *p, size_t n);     /* copy of n bytes */
char *arena_strndup(Arena *a, const char *s, size_t n); /* NUL-terminated copy */
char *arena_printf(Arena *a, const char *fmt, ...)      /* formatted NUL-terminated string */
    __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);     /* release every block */
size_t arena_live_bytes(void); /* bytes held by all arenas not yet freed (the process's compiler memory) */

/* Growable array of pointers, arena-backed (old storage is simply abandoned on growth). */
typedef struct PtrVec {
    void **v;
    int n, cap;
} PtrVec;
void ptrvec_push(Arena *a, PtrVec *pv, void *p); /* append p */

Str str_from(const char *s);       /* slice over a C string */
int str_eq(Str a, Str b);          /* byte equality */
int str_eqc(Str a, const char *c); /* equality with a C string */

#endif
