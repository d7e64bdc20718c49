/* scratch.h - a scratch directory for the unit tests that write files (test_rt_*.c): `dir`, made
 * fresh by dir_make under $TMPDIR (else /tmp) and removed with everything in it by dir_remove;
 * at(NAME) is DIR/NAME (four buffers in turn, so a call may take up to four). Include after
 * unit.h, in one test file. */
#ifndef MBT_SCRATCH_H
#define MBT_SCRATCH_H

#include <ftw.h>
#include <limits.h>
#include <sys/stat.h>

static char dir[256]; /* short, so messages that name it fit the tests' buffers */

/* The directory mbt-test-TAG-XXXXXX; a failure ends the test program. */
UNIT_FN void dir_make_tagged(const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mbt-test-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(dir)) {
        printf("FAIL setup: mkdtemp %s: %s\n", dir, strerror(errno));
        exit(1);
    }
}

static int scratch_rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(p);
}

UNIT_FN void dir_remove(void) {
    chmod(dir, 0755); /* a test may have made it unreadable */
    nftw(dir, scratch_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

UNIT_FN char *at(const char *name) {
    static char buf[4][PATH_MAX + 64];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

#endif
