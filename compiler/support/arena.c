/* arena.c - bump allocator behind every compiler data structure (see arena.h). */
#include "arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

struct ArenaBlock {
    ArenaBlock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

/* Bytes of every live arena's blocks together: what the checker's memory limit is held to. */
static size_t g_arena_live;

size_t arena_live_bytes(void) { return g_arena_live; }

void *arena_alloc(Arena *a, size_t n) {
    /* Sizes come from computations on the input (counts times element sizes): one that wrapped,
     * or is beyond any memory, would round to a small block here and be overrun. */
    if (n > ((size_t)1 << 48)) diag_internal(__FILE__, __LINE__, "arena: a request of %zu bytes (a size overflowed)", n);
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        ArenaBlock *b = malloc(sizeof(ArenaBlock) + cap);
        if (!b) diag_internal(__FILE__, __LINE__, "out of memory allocating %zu bytes", cap);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        g_arena_live += sizeof(ArenaBlock) + cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

void *arena_dup(Arena *a, const void *p, size_t n) {
    void *q = arena_alloc(a, n ? n : 1);
    if (n) memcpy(q, p, n);
    return q;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
    char *q = arena_alloc(a, n + 1);
    memcpy(q, s, n);
    q[n] = 0;
    return q;
}

char *arena_printf(Arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *q = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(q, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return q;
}

void arena_free(Arena *a) {
    while (a->head) {
        ArenaBlock *n = a->head->next;
        g_arena_live -= sizeof(ArenaBlock) + a->head->cap;
        free(a->head);
        a->head = n;
    }
}

void ptrvec_push(Arena *a, PtrVec *pv, void *p) {
    if (pv->n == pv->cap) {
        /* 2^30 items would take more than the 256 MiB a source may have (module.c): unreachable */
        if (pv->cap >= (1 << 30)) diag_internal(__FILE__, __LINE__, "arena: a vector of more than 2^30 items");
        int cap = pv->cap ? pv->cap * 2 : 4;
        void **v = arena_alloc(a, sizeof(void *) * (size_t)cap);
        if (pv->n) memcpy(v, pv->v, sizeof(void *) * (size_t)pv->n);
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = p;
}

Str str_from(const char *s) { return (Str){s, (uint32_t)strlen(s)}; }
int str_eq(Str a, Str b) { return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0); }
int str_eqc(Str a, const char *c) { return str_eq(a, str_from(c)); }
