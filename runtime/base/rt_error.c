/* rt_error.c - the runtime's errors: status codes and the caller's message buffer (see rt.h).
 *
 * Pipeline position: under every other runtime module. A failing function formats one line into
 * the RtError its caller passed (saying what was being done and, for a C library failure, the
 * library's reason) and returns the status; nothing here prints, exits or keeps state. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

/* ---- formatting ------------------------------------------------------------------------------ */

/* Marks a message that did not fit by ending it in "...". */
static void rt_mark_cut(RtError *e, int wanted) {
    if (wanted >= (int)sizeof e->msg) memcpy(e->msg + sizeof e->msg - 4, "...", 4);
}

/* Keeps a message one line whatever it quotes: a newline, a carriage return or any other control
 * character (an argument, a file name, a JSON string may hold one) becomes '?', so that a message
 * is never split over lines nor writes a terminal's escape sequences. */
static void rt_one_line(RtError *e) {
    for (char *c = e->msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
}

static void rt_vset(RtError *e, RtStatus code, const char *fmt, va_list ap) {
    e->code = code;
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    if (n < 0) snprintf(e->msg, sizeof e->msg, "(unprintable error message)");
    else rt_mark_cut(e, n);
    rt_one_line(e);
}

void rt_error_clear(RtError *e) {
    if (!e) return;
    e->code = RT_OK;
    e->msg[0] = 0;
}

RtStatus rt_fail(RtError *e, RtStatus code, const char *fmt, ...) {
    if (!e) return code;
    va_list ap;
    va_start(ap, fmt);
    rt_vset(e, code, fmt, ap);
    va_end(ap);
    return code;
}

RtStatus rt_fail_errno(RtError *e, int errnum, const char *fmt, ...) {
    RtStatus code = errnum == ENOMEM ? RT_ERR_NOMEM : RT_ERR_IO;
    if (!e) return code;
    va_list ap;
    va_start(ap, fmt);
    rt_vset(e, code, fmt, ap);
    va_end(ap);
    /* strerror_r (the GNU form under _GNU_SOURCE) is thread-safe, unlike strerror. */
    char buf[256];
    const char *why = strerror_r(errnum, buf, sizeof buf);
    size_t len = strlen(e->msg);
    if (len + 3 < sizeof e->msg) {
        int n = snprintf(e->msg + len, sizeof e->msg - len, ": %s", why);
        if (n >= 0) rt_mark_cut(e, (int)len + n);
    }
    rt_one_line(e);
    return code;
}

RtStatus rt_error_context(RtError *e, const char *fmt, ...) {
    if (!e) return RT_ERR_ARG;
    char prefix[RT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0) return e->code;
    char old[RT_ERROR_MAX];
    memcpy(old, e->msg, sizeof old);
    int m = snprintf(e->msg, sizeof e->msg, "%s: %s", prefix, old);
    if (m >= 0) rt_mark_cut(e, m);
    rt_one_line(e);
    return e->code;
}

const char *rt_status_name(RtStatus s) {
    switch (s) {
    case RT_OK: return "ok";
    case RT_ERR_IO: return "i/o error";
    case RT_ERR_FORMAT: return "bad format";
    case RT_ERR_ARG: return "invalid argument";
    case RT_ERR_NOMEM: return "out of memory";
    case RT_ERR_NOTFOUND: return "not found";
    }
    return "unknown status";
}
