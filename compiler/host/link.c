/* link.c - the last step of `mbtc prog.mbt -o prog`: the host module, optimised, as an object
 * file, linked with the runtime library (libmbtrt) by the C compiler driver this build used
 * (MBT_LINK_CC: a sanitized libmbtrt needs that compiler's sanitizer runtime). Where libmbtrt.a
 * and the libraries it needs are is install_runtime's answer (compiler/support/install.h): an
 * installed tree's lib/mbt relative to mbtc itself, else the build directory's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diag.h"
#include "host_internal.h"
#include "install.h"

#ifndef MBT_LINK_CC
#define MBT_LINK_CC "cc"
#endif

void host_link(LLVMModuleRef m, const CpuTarget *target, const char *output, Arena *ar) {
    const char *err = NULL, *rtlib = NULL, *ldlibs = NULL;
    if (install_runtime(ar, &rtlib, &ldlibs, &err)) {
        diag_error_noloc("%s", err);
        return;
    }
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
    const char *cmd = arena_printf(ar, "%s %s %s %s -o %s", MBT_LINK_CC, install_shell_quote(ar, obj),
                                   install_shell_quote(ar, rtlib), ldlibs, install_shell_quote(ar, output));
    int st = system(cmd);
    if (st != 0) diag_error_noloc("linking the executable failed (status %d): %s", st, cmd);
    unlink(obj);
}
