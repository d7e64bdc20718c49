/* link.c - the last step of `mbtc prog.mbt -o prog`: the host module, optimised, as an object
 * file, linked with the runtime library (libmbtrt) by the system's C compiler driver. The Makefile
 * defines where this build's libmbtrt.a is, the libraries it needs and the compiler driver that
 * links (MBT_RT_LIB, MBT_RT_LDLIBS, MBT_LINK_CC), the same as the tests link with; in the sanitizer
 * build (make asan) the libraries end with the sanitizer flags. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag.h"
#include "host_internal.h"

#ifndef MBT_RT_LIB
#define MBT_RT_LIB "build/libmbtrt.a"
#endif
#ifndef MBT_LINK_CC
#define MBT_LINK_CC "cc"
#endif
#ifndef MBT_RT_LDLIBS
#define MBT_RT_LDLIBS "-lopenblas -lpthread -lm"
#endif

static const char *shell_quote(Arena *ar, const char *s) {
    const char *out = "'";
    for (const char *p = s; *p; p++) out = *p == '\'' ? arena_printf(ar, "%s'\\''", out) : arena_printf(ar, "%s%c", out, *p);
    return arena_printf(ar, "%s'", out);
}

void host_link(LLVMModuleRef m, const CpuTarget *target, const char *output, Arena *ar) {
    const char *err = NULL;
    /* the object file is a temporary of mbtc's own (mkstemps: a new name, never a user's file such
     * as OUT.o), removed whatever happens */
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *obj = arena_printf(ar, "%s/mbtc-XXXXXX.o", tmpdir);
    int fd = mkstemps(obj, 2);
    if (fd < 0) {
        diag_error_noloc("cannot create a temporary object file in '%s': %s (set TMPDIR to a writable directory)", tmpdir,
                         strerror(errno));
        return;
    }
    close(fd);
    if (cpu_optimize(m, target, ar, &err) || cpu_emit_object(m, target, obj, ar, &err)) {
        diag_error_noloc("%s", err);
        unlink(obj);
        return;
    }
    const char *cmd = arena_printf(ar, "%s %s %s %s -o %s", MBT_LINK_CC, shell_quote(ar, obj), shell_quote(ar, MBT_RT_LIB),
                                   MBT_RT_LDLIBS, shell_quote(ar, output));
    int st = system(cmd);
    if (st != 0) diag_error_noloc("linking the executable failed (status %d): %s", st, cmd);
    unlink(obj);
}
