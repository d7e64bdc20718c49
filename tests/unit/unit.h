/* unit.h - the tiny harness shared by tests/unit/test_*.c.
 *
 * Each test is a function run with RUN(fn) (in a child process, see unit_run): it prints
 * `PASS fn` when every CHECK in it held, or
 * `FAIL fn: first failed check` followed by further failures as indented lines. unit_finish()
 * prints the `N passed, M failed` line tests/run.sh reads and returns the exit status.
 *
 * The compiler reports through diag on stderr; capture_begin()/capture_end() swap the C stream
 * `stderr` for a memory stream so a test can read what diag printed (and keep the log clean). */
#ifndef MBT_UNIT_H
#define MBT_UNIT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Not every test uses every helper. */
#define UNIT_FN static __attribute__((unused))

static int unit_passed, unit_failed;
static const char *unit_case;   /* the test being run */
static int unit_case_failures;  /* failed checks in it */
static FILE *unit_saved_stderr; /* the real stderr while a capture is on */
static char *unit_cap_buf;
static size_t unit_cap_len;

/* Report output: always to the real stdout; flushed so it interleaves with other streams. */
UNIT_FN void unit_vfail(const char *file, int line, const char *fmt, va_list ap) {
    if (unit_case_failures++ == 0) printf("FAIL %s: ", unit_case);
    else printf("    also: ");
    vprintf(fmt, ap);
    printf(" (%s:%d)\n", file, line);
    fflush(stdout);
}

UNIT_FN void unit_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
UNIT_FN void unit_fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    unit_vfail(file, line, fmt, ap);
    va_end(ap);
}

/* Detail lines under the last FAIL (indented so tests/run.sh shows them as its output). */
UNIT_FN void unit_detail(const char *label, const char *text) {
    printf("    %s:\n", label);
    const char *p = text ? text : "(null)";
    int lines = 0;
    while (*p && lines < 40) {
        const char *e = strchr(p, '\n');
        int n = e ? (int)(e - p) : (int)strlen(p);
        printf("      | %.*s\n", n > 300 ? 300 : n, p);
        lines++;
        p += n + (e ? 1 : 0);
    }
    if (*p) printf("      | ...\n");
}

#define CHECK(cond, ...)                                                                                                         \
    do {                                                                                                                         \
        if (!(cond)) unit_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                                              \
    } while (0)

/* String equality, showing both sides when they differ. */
#define CHECK_STR(got, want, what)                                                                                               \
    do {                                                                                                                         \
        const char *g_ = (got), *w_ = (want);                                                                                    \
        if (!g_ || strcmp(g_, w_) != 0) {                                                                                        \
            unit_fail_at(__FILE__, __LINE__, "%s differs", (what));                                                              \
            unit_detail("expected", w_);                                                                                         \
            unit_detail("got", g_);                                                                                              \
        }                                                                                                                        \
    } while (0)

#define RUN(fn) unit_run(#fn, fn)

/* Runs one test in a child process, so each starts with the compiler's global state (diag's
 * error count and its cap on printed errors) as fresh as the parent's, and a crash fails that
 * test alone. The child exits 0 (passed) or UNIT_EXIT_FAILED (printed its FAIL line); anything
 * else (a signal, a sanitizer's exit) is reported here. MBT_UNIT_NOFORK=1 runs tests in-process
 * (for a debugger). */
#define UNIT_EXIT_FAILED 3

UNIT_FN void unit_run_here(const char *name, void (*fn)(void)) {
    unit_case = name;
    unit_case_failures = 0;
    fn();
    if (unit_saved_stderr) { /* a test forgot capture_end(): restore so later output is seen */
        fclose(stderr);
        stderr = unit_saved_stderr;
        unit_saved_stderr = NULL;
        unit_fail_at(__FILE__, __LINE__, "capture_begin() without capture_end()");
    }
    if (!unit_case_failures) printf("PASS %s\n", name);
    fflush(stdout);
}

UNIT_FN void unit_run(const char *name, void (*fn)(void)) {
    const char *nofork = getenv("MBT_UNIT_NOFORK");
    if (nofork && *nofork && strcmp(nofork, "0") != 0) {
        unit_run_here(name, fn);
        if (unit_case_failures) unit_failed++;
        else unit_passed++;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL %s: fork failed\n", name);
        unit_failed++;
        return;
    }
    if (pid == 0) {
        unit_run_here(name, fn);
        fflush(stdout);
        _exit(unit_case_failures ? UNIT_EXIT_FAILED : 0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            st = -1;
            break;
        }
    }
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        unit_passed++;
        return;
    }
    unit_failed++;
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == UNIT_EXIT_FAILED) return; /* it said why */
    if (st != -1 && WIFSIGNALED(st)) printf("FAIL %s: crashed with signal %d\n", name, WTERMSIG(st));
    else if (st != -1) printf("FAIL %s: exited with status %d (a sanitizer report?)\n", name, WEXITSTATUS(st));
    else printf("FAIL %s: lost track of the test process\n", name);
    fflush(stdout);
}

UNIT_FN int unit_finish(void) {
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    fflush(stdout);
    return unit_failed ? 1 : 0;
}

/* ---- capturing what diag prints --------------------------------------------------------- */

UNIT_FN void capture_begin(void) {
    fflush(stderr);
    free(unit_cap_buf);
    unit_cap_buf = NULL;
    unit_cap_len = 0;
    FILE *m = open_memstream(&unit_cap_buf, &unit_cap_len);
    if (!m) {
        fprintf(stderr, "unit: open_memstream failed\n");
        exit(1);
    }
    unit_saved_stderr = stderr;
    stderr = m;
}

/* Ends the capture and returns what was printed (valid until the next capture_begin). */
UNIT_FN const char *capture_end(void) {
    if (!unit_saved_stderr) return "";
    fclose(stderr);
    stderr = unit_saved_stderr;
    unit_saved_stderr = NULL;
    return unit_cap_buf ? unit_cap_buf : "";
}

/* A growable string for building expected/actual renderings. */
typedef struct Buf {
    char *p;
    size_t n, cap;
} Buf;

UNIT_FN void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
UNIT_FN void buf_printf(Buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->n + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + (size_t)n + 1) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) {
            fprintf(stderr, "unit: out of memory\n");
            exit(1);
        }
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

UNIT_FN const char *buf_str(Buf *b) { return b->p ? b->p : ""; }
UNIT_FN void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

#endif
