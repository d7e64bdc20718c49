/* install.c - the installed layout and the build tree's, found from mbtc's own location
 * (install.h). */
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "install.h"

/* The build tree's runtime, stdlib and link libraries (the Makefile defines them for this file);
 * an installed mbtc never uses these. */
#ifndef MBT_RT_LIB
#define MBT_RT_LIB "build/libmbtrt.a"
#endif
#ifndef MBT_RT_LDLIBS
#define MBT_RT_LDLIBS "-lopenblas -lpthread -lm"
#endif
/* An installed tree's: words ending in .a without a '/' are archives in <prefix>/lib/mbt. */
#ifndef MBT_RT_LDLIBS_INSTALLED
#define MBT_RT_LDLIBS_INSTALLED MBT_RT_LDLIBS
#endif

static int is_kind(const char *path, int dir) {
    struct stat st;
    return stat(path, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

const char *install_exe_dir(Arena *ar) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    return arena_strndup(ar, exe, strlen(exe));
}

const char *install_stdlib(Arena *ar) {
    const char *bin = install_exe_dir(ar);
    if (bin) {
        const char *installed = arena_printf(ar, "%s/../share/mbt/stdlib", bin);
        if (is_kind(installed, 1)) return installed;
        const char *beside = arena_printf(ar, "%s/../stdlib", bin); /* build/mbtc: the source tree's */
        if (is_kind(beside, 1)) return beside;
    }
#ifdef MBT_SOURCE_STDLIB
    if (is_kind(MBT_SOURCE_STDLIB, 1)) return MBT_SOURCE_STDLIB; /* build/asan/mbtc */
#endif
    return NULL;
}

const char *install_shell_quote(Arena *ar, const char *s) {
    const char *out = "'";
    for (const char *p = s; *p; p++) out = *p == '\'' ? arena_printf(ar, "%s'\\''", out) : arena_printf(ar, "%s%c", out, *p);
    return arena_printf(ar, "%s'", out);
}

/* MBT_RT_LDLIBS_INSTALLED with each bare NAME.a made <libdir>/NAME.a, quoted */
static const char *installed_ldlibs(Arena *ar, const char *libdir) {
    const char *out = "";
    const char *p = MBT_RT_LDLIBS_INSTALLED;
    while (*p) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (!n) break;
        const char *w = arena_strndup(ar, p, n);
        int archive = n > 2 && strcmp(w + n - 2, ".a") == 0 && !strchr(w, '/');
        if (archive) w = install_shell_quote(ar, arena_printf(ar, "%s/%s", libdir, w));
        out = *out ? arena_printf(ar, "%s %s", out, w) : w;
        p += n;
    }
    return out;
}

int install_runtime(Arena *ar, const char **lib, const char **ldlibs, const char **err) {
    const char *bin = install_exe_dir(ar);
    if (bin) {
        const char *libdir = arena_printf(ar, "%s/../lib/mbt", bin);
        const char *installed = arena_printf(ar, "%s/libmbtrt.a", libdir);
        if (is_kind(installed, 0)) {
            *lib = installed;
            *ldlibs = installed_ldlibs(ar, libdir);
            return 0;
        }
        const char *beside = arena_printf(ar, "%s/libmbtrt.a", bin); /* a build directory's own */
        if (is_kind(beside, 0)) {
            *lib = beside;
            *ldlibs = MBT_RT_LDLIBS;
            return 0;
        }
    }
    if (is_kind(MBT_RT_LIB, 0)) {
        *lib = MBT_RT_LIB;
        *ldlibs = MBT_RT_LDLIBS;
        return 0;
    }
    *err = arena_printf(ar,
                        "cannot find the runtime library libmbtrt.a: looked in %s/../lib/mbt (an installed mbtc), %s (a "
                        "build directory) and %s; reinstall mbt (make install PREFIX=...)",
                        bin ? bin : "<mbtc's directory>", bin ? bin : "<mbtc's directory>", MBT_RT_LIB);
    return 1;
}
