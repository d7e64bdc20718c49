/* module.c - finding, reading and parsing the main file and its imports (see module.h). */
#include "module.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "diag.h"
#include "parse.h"

#define MODULE_MAX_BYTES (256u << 20)

char *loader_read_file(Arena *ar, const char *path, uint32_t *len, const char **why) {
    struct stat st;
    if (stat(path, &st) != 0) {
        *why = strerror(errno);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        *why = "it is a directory";
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "it is not a regular file";
        return NULL;
    }
    if ((uint64_t)st.st_size > MODULE_MAX_BYTES) {
        *why = "it is larger than 256 MiB";
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    size_t cap = (size_t)st.st_size;
    char *buf = arena_alloc(ar, cap + 1); /* +1: the lexer's NUL sentinel */
    size_t n = fread(buf, 1, cap, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        *why = "read error";
        return NULL;
    }
    buf[n] = 0;
    *len = (uint32_t)n;
    return buf;
}

void loader_init(Loader *ld, Arena *ar, const char **incdirs, int nincdirs, const char *stdlib_dir) {
    memset(ld, 0, sizeof *ld);
    ld->ar = ar;
    PtrVec dirs = {0};
    for (int i = 0; i < nincdirs; i++) ptrvec_push(ar, &dirs, (void *)incdirs[i]);
    const char *env = getenv("MBT_PATH");
    if (env && *env) {
        const char *p = env;
        while (*p) {
            const char *q = strchr(p, ':');
            size_t n = q ? (size_t)(q - p) : strlen(p);
            if (n) ptrvec_push(ar, &dirs, arena_strndup(ar, p, n));
            p += n;
            if (*p == ':') p++;
        }
    }
    if (stdlib_dir) ptrvec_push(ar, &dirs, (void *)stdlib_dir);
    ld->dirs = (const char **)dirs.v;
    ld->ndirs = dirs.n;
}

static Module *load(Loader *ld, const char *name, const char *path, char *text, uint32_t len) {
    Module *m = arena_alloc(ld->ar, sizeof(Module));
    m->name = name;
    m->path = path;
    m->file = diag_add_source(path, text, len);
    ld->bytes += len;
    int errors = diag_error_count();
    m->ast = parse_source(ld->ar, m->file);
    m->broken = diag_error_count() > errors;
    ptrvec_push(ld->ar, &ld->modules, m);
    return m;
}

static const char *stem_of(Arena *ar, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    return arena_strndup(ar, base, dot ? (size_t)(dot - base) : strlen(base));
}

Module *loader_main(Loader *ld, const char *path) {
    uint32_t len = 0;
    const char *why = NULL;
    char *text = loader_read_file(ld->ar, path, &len, &why);
    if (!text) {
        diag_error_noloc("cannot read '%s': %s", path, why);
        return NULL;
    }
    return load(ld, stem_of(ld->ar, path), path, text, len);
}

static const char *dir_of(Arena *ar, const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? arena_strndup(ar, path, (size_t)(slash - path)) : ".";
}

const char *loader_find(Loader *ld, const char *from_path, Str name) {
    char *cname = arena_strndup(ld->ar, name.p, name.len);
    for (int i = 0; i < ld->modules.n; i++) {
        Module *m = ld->modules.v[i];
        if (strcmp(m->name, cname) == 0 && strcmp(m->path, from_path) != 0) return m->path;
    }
    for (int i = 0; i < ld->ndirs + 1; i++) {
        const char *dir = i == 0 ? dir_of(ld->ar, from_path) : ld->dirs[i - 1];
        char *path =
            strcmp(dir, ".") == 0 ? arena_printf(ld->ar, "%s.mbt", cname) : arena_printf(ld->ar, "%s/%s.mbt", dir, cname);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && strcmp(path, from_path) != 0) return path;
    }
    return NULL;
}

Module *loader_import(Loader *ld, Module *from, Str name, Span at) {
    char *cname = arena_strndup(ld->ar, name.p, name.len);
    /* Already loaded under this name? */
    for (int i = 0; i < ld->modules.n; i++) {
        Module *m = ld->modules.v[i];
        if (strcmp(m->name, cname) == 0 && m != from) return m;
    }
    int ncand = ld->ndirs + 1;
    for (int i = 0; i < ncand; i++) {
        const char *dir = i == 0 ? dir_of(ld->ar, from->path) : ld->dirs[i - 1];
        char *path =
            strcmp(dir, ".") == 0 ? arena_printf(ld->ar, "%s.mbt", cname) : arena_printf(ld->ar, "%s/%s.mbt", dir, cname);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        /* The same file reached under another name or directory is the same module. */
        for (int j = 0; j < ld->modules.n; j++) {
            Module *m = ld->modules.v[j];
            struct stat st2;
            if (stat(m->path, &st2) == 0 && st2.st_ino == st.st_ino && st2.st_dev == st.st_dev) {
                if (m == from) {
                    diag_error(at, "module '%s' imports itself", cname);
                    return NULL;
                }
                return m;
            }
        }
        uint32_t len = 0;
        const char *why = NULL;
        char *text = loader_read_file(ld->ar, path, &len, &why);
        if (!text) {
            diag_error(at, "cannot read module '%s' from '%s': %s", cname, path, why);
            return NULL;
        }
        return load(ld, cname, path, text, len);
    }
    diag_error(at, "module '%s' not found", cname);
    diag_hint("looked for '%s.mbt' beside '%s', in -I directories, $MBT_PATH and the stdlib; pass -I DIR or set MBT_PATH", cname,
              from->path);
    return NULL;
}
