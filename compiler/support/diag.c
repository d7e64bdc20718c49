/* diag.c - the diagnostic sink (see diag.h): registered sources, located messages with the
 * source line and an underline, notes and hints, the error cap, internal errors. */
#include "diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Source {
    const char *path;
    const char *text;
    uint32_t len;
} Source;

/* The only mutable global state of the compiler. */
static struct {
    Source *src;
    uint32_t nsrc, cap;
    int errors;      /* errors reported */
    int printed;     /* errors printed */
    int suppressing; /* the last error was not printed: drop its notes and hints too */
    int color;
} g_diag;

uint32_t diag_add_source(const char *path, const char *text, uint32_t len) {
    if (g_diag.nsrc == g_diag.cap) {
        g_diag.cap = g_diag.cap ? g_diag.cap * 2 : 8;
        g_diag.src = realloc(g_diag.src, sizeof(Source) * g_diag.cap);
        if (!g_diag.src) INTERNAL("out of memory registering source '%s'", path);
    }
    g_diag.src[g_diag.nsrc] = (Source){path, text, len};
    return ++g_diag.nsrc;
}

const char *diag_source_path(uint32_t file) { return file >= 1 && file <= g_diag.nsrc ? g_diag.src[file - 1].path : "<none>"; }

const char *diag_source_text(uint32_t file, uint32_t *len) {
    if (file < 1 || file > g_diag.nsrc) {
        *len = 0;
        return "";
    }
    *len = g_diag.src[file - 1].len;
    return g_diag.src[file - 1].text;
}

char *diag_span_text(Arena *ar, Span at) {
    uint32_t len;
    const char *text = diag_source_text(at.file, &len);
    if (at.file == 0 || at.off > len) return "?";
    uint32_t n = at.len;
    if (at.off + n > len) n = len - at.off;
    char *out = arena_alloc(ar, 64 + 4);
    uint32_t o = 0;
    int space = 0;
    for (uint32_t i = 0; i < n && o < 60; i++) {
        char c = text[at.off + i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            space = 1;
            continue;
        }
        if (space && o > 0) out[o++] = ' ';
        space = 0;
        out[o++] = c;
    }
    if (o >= 60) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = 0;
    return out;
}

Span span_join(Span a, Span b) {
    if (a.file == 0) return b;
    if (b.file == 0 || b.file != a.file) return a;
    uint32_t lo = a.off < b.off ? a.off : b.off;
    uint32_t hi = a.off + a.len > b.off + b.len ? a.off + a.len : b.off + b.len;
    Span r = a.off <= b.off ? a : b;
    r.len = hi - lo;
    return r;
}

/* Prints `  12 | source line` and the underline below it. Only the first line of a span is
 * underlined (to its end, for spans that run on). Tabs are kept so the caret lines up. */
static void print_excerpt(Span at) {
    uint32_t len;
    const char *text = diag_source_text(at.file, &len);
    if (at.file == 0 || at.off > len) return;
    uint32_t ls = at.off;
    while (ls > 0 && text[ls - 1] != '\n') ls--;
    uint32_t le = at.off;
    while (le < len && text[le] != '\n') le++;
    uint32_t shown = le - ls;
    if (shown > 200) shown = 200; /* a 1 MB line is not printed whole */
    fprintf(stderr, "%5u | ", at.line);
    for (uint32_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)text[ls + i];
        /* Control bytes (NUL included) would garble the terminal: show them as '?'. */
        fputc(c == '\t' || c >= 0x20 ? c : '?', stderr);
    }
    fputc('\n', stderr);
    fprintf(stderr, "      | ");
    uint32_t caret = at.off - ls;
    if (caret > shown) caret = shown;
    for (uint32_t i = 0; i < caret; i++) fputc(text[ls + i] == '\t' ? '\t' : ' ', stderr);
    uint32_t ulen = at.len;
    if (at.off + ulen > le) ulen = le - at.off;
    if (caret + ulen > shown) ulen = shown > caret ? shown - caret : 0;
    fputc('^', stderr);
    for (uint32_t i = 1; i < ulen; i++) fputc('~', stderr);
    fputc('\n', stderr);
}

static void vreport(const char *kind, Span at, const char *fmt, va_list ap) {
    if (at.file) fprintf(stderr, "%s:%u:%u: ", diag_source_path(at.file), at.line, at.col);
    else fprintf(stderr, "mbtc: ");
    if (g_diag.color) {
        const char *c = strcmp(kind, "error") == 0 ? "\033[1;31m" : strcmp(kind, "warning") == 0 ? "\033[1;35m" : "\033[1;36m";
        fprintf(stderr, "%s%s:\033[0m ", c, kind);
    } else {
        fprintf(stderr, "%s: ", kind);
    }
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    if (at.file) print_excerpt(at);
}

void diag_error(Span at, const char *fmt, ...) {
    g_diag.errors++;
    if (g_diag.printed >= DIAG_MAX_ERRORS) {
        g_diag.suppressing = 1;
        return;
    }
    g_diag.printed++;
    g_diag.suppressing = 0;
    va_list ap;
    va_start(ap, fmt);
    vreport("error", at, fmt, ap);
    va_end(ap);
}

void diag_error_noloc(const char *fmt, ...) {
    g_diag.errors++;
    g_diag.printed++;
    g_diag.suppressing = 0;
    va_list ap;
    va_start(ap, fmt);
    vreport("error", span_none(), fmt, ap);
    va_end(ap);
}

void diag_warning(Span at, const char *fmt, ...) {
    g_diag.suppressing = 0;
    va_list ap;
    va_start(ap, fmt);
    vreport("warning", at, fmt, ap);
    va_end(ap);
}

void diag_note(Span at, const char *fmt, ...) {
    if (g_diag.suppressing) return;
    va_list ap;
    va_start(ap, fmt);
    vreport("note", at, fmt, ap);
    va_end(ap);
}

void diag_hint(const char *fmt, ...) {
    if (g_diag.suppressing) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  hint: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int diag_error_count(void) { return g_diag.errors; }

int diag_finish(void) {
    if (g_diag.errors > g_diag.printed)
        fprintf(stderr, "mbtc: %d more error%s not shown (%d in all)\n", g_diag.errors - g_diag.printed,
                g_diag.errors - g_diag.printed == 1 ? "" : "s", g_diag.errors);
    return g_diag.errors ? 1 : 0;
}

void diag_set_color(int on) { g_diag.color = on; }

_Noreturn void diag_internal(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "mbtc: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(this is a bug in mbtc, not in your program)\n");
    exit(2);
}

int diag_edit_distance(const char *a, uint32_t alen, const char *b, uint32_t blen, int limit) {
    /* Damerau-free Levenshtein over two rows; names are short, and long ones are cut off early. */
    if (alen > 64 || blen > 64) return limit + 1;
    int diff = (int)alen - (int)blen;
    if (diff > limit || -diff > limit) return limit + 1;
    int prev[65], cur[65];
    for (uint32_t j = 0; j <= blen; j++) prev[j] = (int)j;
    for (uint32_t i = 1; i <= alen; i++) {
        cur[0] = (int)i;
        int rowmin = cur[0];
        for (uint32_t j = 1; j <= blen; j++) {
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int v = prev[j - 1] + cost;
            if (prev[j] + 1 < v) v = prev[j] + 1;
            if (cur[j - 1] + 1 < v) v = cur[j - 1] + 1;
            cur[j] = v;
            if (v < rowmin) rowmin = v;
        }
        if (rowmin > limit) return limit + 1;
        memcpy(prev, cur, sizeof(int) * (blen + 1));
    }
    return prev[blen];
}
