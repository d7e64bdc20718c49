/* st_compare.c - compares the tensors two safetensors files share, for the tests.
 *
 *   st_compare A.safetensors B.safetensors PREFIX TOL [norm]
 *
 * For every tensor of A whose name starts with PREFIX ("" for all) - B must hold it with the same
 * shape - computes the largest |a - b| relative to the largest |b| of the tensor (the relative
 * measure per tensor keeps entries near zero from deciding the result), and over all of them the
 * norm-wise relative difference ||a - b||_2 / ||b||_2 of the concatenated tensors. Exits 0 when
 * every tensor's measure (or, with `norm`, the norm-wise one) is at most TOL, 1 when over (or a
 * tensor is missing), 2 on a bad file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "norm") == 0)) {
        fprintf(stderr, "usage: st_compare A.safetensors B.safetensors PREFIX TOL [norm]\n");
        return 2;
    }
    RtError err;
    rt_error_clear(&err);
    RtStFile *a = NULL, *b = NULL;
    if (rt_st_open(&a, argv[1], &err) != RT_OK || rt_st_open(&b, argv[2], &err) != RT_OK) {
        fprintf(stderr, "st_compare: %s\n", err.msg);
        return 2;
    }
    const char *prefix = argv[3];
    double tol = atof(argv[4]), worst = 0, dd = 0, bb = 0;
    int norm = argc == 6;
    int64_t compared = 0, bad = 0;
    for (int64_t i = 0; i < rt_st_count(a); i++) {
        const RtStTensor *ta = rt_st_tensor(a, i);
        if (strncmp(ta->name, prefix, strlen(prefix)) != 0 || (ta->dtype != RT_F32 && ta->dtype != RT_F64)) continue;
        const RtStTensor *tb = rt_st_find(b, ta->name);
        int same = tb && tb->rank == ta->rank;
        for (int d = 0; same && d < ta->rank; d++) same = ta->shape[d] == tb->shape[d];
        if (!same) {
            printf("%s: missing from %s or shaped differently\n", ta->name, argv[2]);
            bad++;
            continue;
        }
        int64_t n = 1;
        for (int d = 0; d < ta->rank; d++) n *= ta->shape[d];
        float *va = malloc((size_t)(n ? n : 1) * sizeof *va), *vb = malloc((size_t)(n ? n : 1) * sizeof *vb);
        if (!va || !vb || rt_st_read_f32(a, ta, va, n, &err) != RT_OK || rt_st_read_f32(b, tb, vb, n, &err) != RT_OK) {
            fprintf(stderr, "st_compare: %s\n", va && vb ? err.msg : "out of memory");
            return 2;
        }
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < n; k++) {
            if (fabs(vb[k]) > scale) scale = fabs(vb[k]);
            double d = fabs((double)va[k] - (double)vb[k]);
            dd += d * d;
            bb += (double)vb[k] * vb[k];
            if (d > diff || isnan(d)) diff = isnan(d) ? INFINITY : d;
        }
        double e = scale > 0 ? diff / scale : diff;
        if (e > worst) worst = e;
        if (e > tol && !norm) {
            printf("%s: relative difference %.3g (tolerance %.3g)\n", ta->name, e, tol);
            bad++;
        }
        compared++;
        free(va);
        free(vb);
    }
    double nw = bb > 0 ? sqrt(dd / bb) : sqrt(dd);
    if (norm && !(nw <= tol)) bad++;
    printf("st_compare: %lld tensors compared, largest relative difference %.3g, norm-wise %.3g; %s over %.3g\n",
           (long long)compared, worst, nw, bad ? "some" : "none", tol);
    rt_st_close(a);
    rt_st_close(b);
    return bad || !compared ? 1 : 0;
}
