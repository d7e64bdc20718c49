/* profile.c - the opt-in step profile (MBT_PROFILE=1): accounting of GEMM calls, phase marks and
 * the report printed after a training run (see rt_profile.h; docs/runtime.md, "Profiling").
 *
 * Pipeline position: beside the thread pool; only the executable's train command creates a
 * profile, and nothing here runs unless one was created. */
#include <stdlib.h>
#include <string.h>

#include "rt_profile.h"

int rt_profile_requested(void) {
    const char *v = getenv("MBT_PROFILE");
    return v && *v && strcmp(v, "0") != 0;
}

void rt_profile_reset(RtProfile *p) { memset(p, 0, sizeof *p); }

void rt_profile_gemm(RtProfile *p, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, int64_t batch, double seconds) {
    p->gemm_s += seconds;
    p->gemm_calls++;
    p->gemm_flop += 2.0 * (double)m * (double)n * (double)k * (double)batch;
    RtProfileGemm *g = NULL;
    for (int i = 0; i < p->nshapes && !g; i++) {
        RtProfileGemm *s = &p->shapes[i];
        if (s->trans_a == trans_a && s->trans_b == trans_b && s->m == m && s->n == n && s->k == k && s->batch == batch) g = s;
    }
    if (!g && p->nshapes < RT_PROFILE_SHAPES) {
        g = &p->shapes[p->nshapes++];
        *g = (RtProfileGemm){trans_a, trans_b, m, n, k, batch, 0, 0};
    }
    if (!g) g = &p->other;
    g->calls++;
    g->s += seconds;
}

void rt_profile_begin_step(RtProfile *p) {
    p->mark_t = rt_profile_now();
    p->mark_gemm_s = p->gemm_s;
    p->mark_pool_s = p->pool_s;
    p->steps++;
}

void rt_profile_phase(RtProfile *p, RtProfilePhase ph) {
    double now = rt_profile_now();
    p->phase_s[ph] += now - p->mark_t;
    p->phase_gemm_s[ph] += p->gemm_s - p->mark_gemm_s;
    p->phase_pool_s[ph] += p->pool_s - p->mark_pool_s;
    p->mark_t = now;
    p->mark_gemm_s = p->gemm_s;
    p->mark_pool_s = p->pool_s;
}

static int rt_cmp_gemm_time(const void *a, const void *b) {
    const RtProfileGemm *x = a, *y = b;
    return x->s > y->s ? -1 : x->s < y->s;
}

void rt_profile_print(FILE *f, const RtProfile *p, int threads) {
    static const char *names[RT_PROF_NPHASES] = {"data, lr",         "forward+backward", "grad norm, clip",
                                                 "optimizer update", "zero grads",       "log, eval"};
    if (p->steps < 1) return;
    double n = (double)p->steps, step = 0, gemm = 0, pool = 0;
    for (int i = 0; i < RT_PROF_NPHASES; i++) {
        step += p->phase_s[i];
        gemm += p->phase_gemm_s[i];
        pool += p->phase_pool_s[i];
    }
    if (step <= 0) return;
    fprintf(f, "profile (MBT_PROFILE): %lld step%s%s, %d thread%s, %.3f ms/step\n", (long long)p->steps, p->steps == 1 ? "" : "s",
            p->skipped_first ? " after the first" : "", threads, threads == 1 ? "" : "s", step * 1e3 / n);
    fprintf(f, "  %-18s %10s %7s %10s %10s %10s   (ms per step; pool = parallel kernels outside GEMMs)\n", "phase", "ms", "share",
            "gemm", "pool", "serial");
    for (int i = 0; i < RT_PROF_NPHASES; i++) {
        double s = p->phase_s[i], gs = p->phase_gemm_s[i], ps = p->phase_pool_s[i];
        fprintf(f, "  %-18s %10.3f %6.1f%% %10.3f %10.3f %10.3f\n", names[i], s * 1e3 / n, 100 * s / step, gs * 1e3 / n,
                ps * 1e3 / n, (s - gs - ps) * 1e3 / n);
    }
    fprintf(f, "  %-18s %10.3f %6.1f%% %10.3f %10.3f %10.3f\n", "step", step * 1e3 / n, 100.0, gemm * 1e3 / n, pool * 1e3 / n,
            (step - gemm - pool) * 1e3 / n);
    fprintf(f, "  gemm: %.1f calls/step, %.2f GFLOP/step, %.1f GFLOP/s while in GEMMs\n", (double)p->gemm_calls / n,
            p->gemm_flop / n * 1e-9, p->gemm_s > 0 ? p->gemm_flop / p->gemm_s * 1e-9 : 0.0);
    RtProfileGemm sorted[RT_PROFILE_SHAPES];
    int ns = p->nshapes;
    memcpy(sorted, p->shapes, sizeof(RtProfileGemm) * (size_t)ns);
    qsort(sorted, (size_t)ns, sizeof *sorted, rt_cmp_gemm_time);
    if (ns > 0) fprintf(f, "  gemm shapes by time (C[m, n] = op(A)[m, k] op(B)[k, n], x batch):\n");
    for (int i = 0; i < ns && i < 12; i++) {
        const RtProfileGemm *g = &sorted[i];
        double flop = 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch * (double)g->calls;
        fprintf(f, "    %6lld x %6lld x %6lld  x%-4lld %s%s %6.1f calls/step %10.3f ms/step %5.1f%%  %6.1f GFLOP/s\n",
                (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch, g->trans_a ? "A^T" : "A  ",
                g->trans_b ? " B^T" : " B  ", (double)g->calls / n, g->s * 1e3 / n, 100 * g->s / step,
                g->s > 0 ? flop / g->s * 1e-9 : 0.0);
    }
    if (ns > 12 || p->other.calls > 0) {
        double rest = p->other.s;
        for (int i = 12; i < ns; i++) rest += sorted[i].s;
        fprintf(f, "    (other shapes)                       %10.3f ms/step %5.1f%%\n", rest * 1e3 / n, 100 * rest / step);
    }
    /* one line for scripts (bench/run.py reads it) */
    fprintf(f,
            "profile summary: steps=%lld step_ms=%.3f gemm_ms=%.3f pool_ms=%.3f serial_ms=%.3f gemm_share=%.4f "
            "gemm_gflops=%.2f\n",
            (long long)p->steps, step * 1e3 / n, gemm * 1e3 / n, pool * 1e3 / n, (step - gemm - pool) * 1e3 / n, gemm / step,
            p->gemm_s > 0 ? p->gemm_flop / p->gemm_s * 1e-9 : 0.0);
}
