/* install.h - where this mbtc's runtime library, the static libraries executables link and the
 * standard library are, found relative to mbtc's own location (/proc/self/exe) so that an
 * installed tree can be moved (docs/install.md):
 *
 *   installed (make install PREFIX=P, make dist)   a build directory (build/mbtc, build/asan/mbtc)
 *     P/bin/mbtc                                      BUILD/mbtc
 *     P/lib/mbt/libmbtrt.a (+ libopenblas.a, ...)     BUILD/libmbtrt.a, the build's RT_LDLIBS
 *     P/share/mbt/stdlib                              BUILD/../stdlib, else the source tree's
 *
 * The Makefile compiles in the build tree's paths only as the last fallback of an uninstalled
 * build. */
#ifndef MBT_INSTALL_H
#define MBT_INSTALL_H

#include "arena.h"

/* The directory of the running mbtc, or NULL when /proc/self/exe cannot be read. */
const char *install_exe_dir(Arena *ar);

/* The standard library's directory (an installed tree's share/mbt/stdlib, else <bindir>/../stdlib,
 * else the source tree's); NULL when none exists. */
const char *install_stdlib(Arena *ar);

/* The runtime library (*lib, a path) and what an executable links after it (*ldlibs, shell words,
 * paths quoted). Returns 0, or 1 with *err saying where it looked. */
int install_runtime(Arena *ar, const char **lib, const char **ldlibs, const char **err);

/* s quoted for sh -c: 'it'\''s' */
const char *install_shell_quote(Arena *ar, const char *s);

#endif
