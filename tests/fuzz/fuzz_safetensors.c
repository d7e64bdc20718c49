/* fuzz_safetensors.c - libFuzzer target for the runtime's safetensors reader (runtime/safetensors.c):
 * every input is opened with rt_st_open_memory as a whole file ("fuzz"). When it opens, every
 * tensor is walked and read with each of rt_st_read_f32, rt_st_read_i64 and rt_st_read_i32 that its
 * dtype allows, every __metadata__ entry is read back, and the reader's promises are held (else
 * abort: a finding):
 *   - each tensor's bytes lie inside the input and span numel x the dtype's size;
 *   - tensors are in data-offset order and tile the data exactly;
 *   - rt_st_find finds each tensor by its name, rt_st_meta_get each key's value;
 *   - a read the dtype allows succeeds (the only exception: an I64 beyond int32 read as i32),
 *     a read it does not allow fails with RT_ERR_FORMAT.
 * When it does not open, the status must be RT_ERR_FORMAT (or RT_ERR_NOMEM) and the message one
 * line naming the file. Built by `make fuzz-build` with ASan and UBSan (the input is a malloc'd
 * copy of exactly its size, so a read one byte past the end is reported); run by
 * tests/fuzz/run.sh with the corpus tests/fuzz/corpus_st. A crash, a sanitizer report, an abort,
 * a leak or a hang is a finding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int is_float(RtDtype t) { return t == RT_F32 || t == RT_F16 || t == RT_BF16 || t == RT_F64; }
static int is_int(RtDtype t) { return t == RT_I32 || t == RT_I64; }

static void check_error(RtStatus st, const RtError *e, RtStatus want) {
    if (st != want && st != RT_ERR_NOMEM) abort();
    if (!e->msg[0] || strchr(e->msg, '\n')) abort();
    if (!strstr(e->msg, "safetensors file '(fuzz)'")) abort();
}

static void walk(const RtStFile *f, const unsigned char *p, size_t n) {
    int64_t nt = rt_st_count(f);
    uint64_t at = 0;
    size_t data_start = n; /* where the data begins: the first tensor's data minus its offset */
    for (int64_t i = 0; i < nt; i++) {
        const RtStTensor *t = rt_st_tensor(f, i);
        if (!t || !t->name) abort();
        uint64_t span = t->end - t->begin;
        if (t->begin != at || t->end < t->begin) abort(); /* the tiling */
        at = t->end;
        if ((uint64_t)t->numel * (uint64_t)rt_dtype_size(t->dtype) != span) abort();
        uint64_t numel = 1; /* the reader bounds the product below 2^62 */
        for (int d = 0; d < t->rank; d++) numel *= (uint64_t)t->shape[d];
        if (t->numel < 0 || numel != (uint64_t)t->numel) abort();
        if (t->data < p || (size_t)(t->data - p) > n || span > n - (size_t)(t->data - p)) abort();
        size_t start = (size_t)(t->data - p) - (size_t)t->begin;
        if (i == 0) data_start = start;
        else if (start != data_start) abort(); /* offsets are relative to one data section */
        if (rt_st_find(f, t->name) != t) abort();

        RtError e;
        size_t cells = t->numel > 0 ? (size_t)t->numel : 1;
        float *f32 = malloc(cells * sizeof *f32);
        int64_t *i64 = malloc(cells * sizeof *i64);
        int32_t *i32 = malloc(cells * sizeof *i32);
        if (f32 && i64 && i32) {
            RtStatus st = rt_st_read_f32(f, t, f32, t->numel, &e);
            if (is_float(t->dtype) ? st != RT_OK : st != RT_ERR_FORMAT) abort();
            if (st != RT_OK) check_error(st, &e, RT_ERR_FORMAT);
            st = rt_st_read_i64(f, t, i64, t->numel, &e);
            if (is_int(t->dtype) ? st != RT_OK : st != RT_ERR_FORMAT) abort();
            if (st != RT_OK) check_error(st, &e, RT_ERR_FORMAT);
            st = rt_st_read_i32(f, t, i32, t->numel, &e);
            if (t->dtype == RT_I32 && st != RT_OK) abort();
            if (t->dtype == RT_I64 && st != RT_OK) {
                int fits = 1; /* the read must fail exactly when an element does not fit */
                for (int64_t k = 0; k < t->numel; k++) fits &= i64[k] >= INT32_MIN && i64[k] <= INT32_MAX;
                if (fits) abort();
            }
            if (!is_int(t->dtype) && st != RT_ERR_FORMAT) abort();
            if (st != RT_OK) check_error(st, &e, RT_ERR_FORMAT);
            /* a wrong element count is refused, never read */
            if (rt_st_read_f32(f, t, f32, t->numel + 1, &e) != RT_ERR_ARG) abort();
        }
        free(f32);
        free(i64);
        free(i32);
    }
    if (nt > 0 && data_start + at != n) abort(); /* the data ends with the file */
    int64_t nm = rt_st_meta_count(f);
    for (int64_t i = 0; i < nm; i++) {
        const char *k = rt_st_meta_key(f, i), *v = rt_st_meta_value(f, i);
        if (!k || !v || rt_st_meta_get(f, k) != v) abort();
    }
    if (rt_st_tensor(f, nt) != NULL || rt_st_tensor(f, -1) != NULL || rt_st_meta_key(f, nm) != NULL) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy: ASan sees any read past the end (libFuzzer's own buffer may be larger). */
    unsigned char *p = malloc(size ? size : 1);
    if (!p) return 0;
    if (size) memcpy(p, data, size);
    RtStFile *f = NULL;
    RtError e;
    RtStatus st = rt_st_open_memory(&f, p, size, "(fuzz)", &e);
    if (st == RT_OK) {
        if (!f) abort();
        walk(f, p, size);
    } else {
        if (f) abort();
        check_error(st, &e, RT_ERR_FORMAT);
    }
    rt_st_close(f);
    free(p);
    return 0;
}
