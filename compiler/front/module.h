/* module.h - finding, reading and parsing `.mbt` files: the main file and everything it imports.
 *
 * Search path for `import name` (first hit wins): the importing file's directory, each -I DIR in
 * order, each directory of $MBT_PATH, then the stdlib installed beside the compiler. Every module
 * is read and parsed once; import cycles are reported at the import that closes them. */
#ifndef MBT_MODULE_H
#define MBT_MODULE_H

#include "arena.h"
#include "ast.h"

typedef struct Scope Scope;

typedef struct Module {
    const char *name; /* import name ("nn"), or the main file's stem */
    const char *path; /* the file it was read from */
    uint32_t file;    /* diag source id */
    Node *ast;        /* N_PROGRAM */
    int broken;       /* it had syntax errors: its names are unknown, not missing */
    int state;        /* sema's bookkeeping: 0 new, 1 being checked, 2 checked */
    Scope *scope;     /* sema's top-level scope of the module */
} Module;

typedef struct Loader {
    Arena *ar;
    const char **dirs; /* -I dirs, then $MBT_PATH dirs, then the stdlib dir */
    int ndirs;
    PtrVec modules; /* Module*, in load order */
    uint64_t bytes; /* bytes of every source read: sema's limits grow with them */
} Loader;

/* Sets up the search path: -I dirs given, $MBT_PATH, then stdlib_dir (may be NULL). */
void loader_init(Loader *ld, Arena *ar, const char **incdirs, int nincdirs, const char *stdlib_dir);
/* Reads and parses the main file. NULL (with an error printed) if it cannot be read. */
Module *loader_main(Loader *ld, const char *path);
/* Resolves `import name` written in `from` at `at`; NULL (with an error) if not found. */
Module *loader_import(Loader *ld, Module *from, Str name, Span at);
/* The file `import name` written in the file from_path would load, without loading it (NULL:
 * none): for the checker's "add `import nn`" hint. */
const char *loader_find(Loader *ld, const char *from_path, Str name);
/* Reads a whole file into memory, refusing directories and files over 256 MiB. Returns NULL and
 * sets *why to a message when it cannot. */
char *loader_read_file(Arena *ar, const char *path, uint32_t *len, const char **why);

#endif
