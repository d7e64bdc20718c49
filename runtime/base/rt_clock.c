/* rt_clock.c - the runtime's clock: monotonic seconds (rt_now, declared in rt_exec.h).
 *
 * Pipeline position: at the bottom, beside rt_error.c and rt_file.c: the train loop and the log
 * time steps with it, the checkpoint writer its writes. */
#include <time.h>

#include "rt_exec.h"

double rt_now(void) {
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux; a zero time would only spoil the timings. */
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
