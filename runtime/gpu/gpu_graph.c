/* gpu_graph.c - the step's functions as CUDA graphs (rt_gpu.h, rt_gpu_call; docs/cuda.md, "CUDA
 * graphs"): a step of GPT-2 124M is ~1,000 launches and GEMMs a micro-batch, each costing the
 * host a few microseconds of driver work; one cuGraphLaunch replaces them.
 *
 * Pipeline position: beside gpu.c, above gpu_api.c; exec.c's rt_exec_queue calls rt_gpu_call
 * for forward_backward, forward_loss and optimizer_update; gpu.c's and gpu_blas.c's entry points
 * call rt_gpu_graph_probe (and gpu.c's upload and loss rt_gpu_graph_upload / _loss) first.
 *
 * How a call goes. The generated function is host code that computes addresses from RtStep and
 * calls the runtime's entry points; it has no other effect. So rt_gpu_call first runs it as a
 * probe: every entry point appends its tag and arguments to a record (the signature) and does
 * nothing on the GPU; uploads keep a copy of their bytes, losses where they go. Then:
 *   - a signature with a graph in the cache: the uploads' bytes are copied into the graph's stage
 *     buffer (queued before it), the graph is launched, and each loss is read back from the
 *     graph's loss buffer (queued after it, as rt_gpu_loss does);
 *   - a signature seen in one of the last few calls (and run eagerly then, so every lazy allocation - GEMM
 *     plans, buffers of ones - is made): the function runs again under stream capture (relaxed
 *     mode), where each upload becomes a device copy from the graph's stage and each loss a
 *     device copy into its loss buffer; the graph is instantiated, kept, and launched as above;
 *   - else it runs eagerly, its signature remembered.
 * A probe that meets a call a graph cannot hold (a download or a wait: the function needs the
 * host in the middle) marks the function as never captured. Uploads stay ordered: the stage is
 * written in stream order before the graph and read inside it, at the upload's own place, and
 * the next write comes after the graph in the stream. The signature holds every address and
 * scalar the calls take (the kernel's buffers, GEMM shapes and scalars, the axpy's loss scale),
 * compared byte for byte: a graph is launched only for exactly the calls it captured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

/* ---- growing the probe's records ---------------------------------------------------------------- */

static int rt_grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* Appends n bytes to the signature; 0 when out of memory (the probe then refuses the function). */
static int rt_sig_put(RtGpuGraphs *gr, const void *b, size_t n) {
    if (n == 0) return 1;
    int64_t cap = (int64_t)gr->cap_sig;
    if (!rt_grow((void **)&gr->sig, &cap, (int64_t)(gr->nsig + n), 1)) return 0;
    gr->cap_sig = (size_t)cap;
    memcpy(gr->sig + gr->nsig, b, n);
    gr->nsig += n;
    return 1;
}

int rt_gpu_graph_probe(RtGpu *g, int tag, const void *args, size_t n, int bad) {
    RtGpuGraphs *gr = &g->graphs;
    if (gr->mode != RT_GRAPH_PROBE) return 0;
    if (bad && !gr->bad) gr->bad = "a call that waits for the GPU";
    if (!rt_sig_put(gr, &tag, sizeof tag) || !rt_sig_put(gr, args, n)) gr->bad = "out of memory";
    return 1;
}

int rt_gpu_graph_upload(RtGpu *g, void *dev, const void *host, int64_t bytes, RtStatus *st, RtError *err) {
    RtGpuGraphs *gr = &g->graphs;
    *st = RT_OK;
    if (gr->mode == RT_GRAPH_PROBE) {
        struct {
            void *dev;
            int64_t bytes;
        } a = {dev, bytes};
        rt_gpu_graph_probe(g, 'U', &a, sizeof a, 0);
        int64_t off = (gr->ndata + 15) / 16 * 16;
        if (!rt_grow((void **)&gr->up, &gr->cap_up, gr->nup + 1, sizeof *gr->up) ||
            !rt_grow((void **)&gr->data, &gr->cap_data, off + bytes, 1)) {
            gr->bad = "out of memory";
            return 1;
        }
        memcpy(gr->data + off, host, (size_t)bytes);
        gr->up[gr->nup++] = (RtGpuUpload){dev, bytes, off};
        gr->ndata = off + bytes;
        return 1;
    }
    if (gr->mode != RT_GRAPH_CAPTURE) return 0;
    RtGpuGraph *c = gr->cur;
    if (gr->next_up >= gr->nup || gr->up[gr->next_up].dev != dev || gr->up[gr->next_up].bytes != bytes) {
        *st = rt_fail(err, RT_ERR_ARG, "CUDA graph capture: upload %lld is not the probe's", (long long)gr->next_up);
        return 1;
    }
    const RtGpuUpload *u = &gr->up[gr->next_up++];
    *st = rt_cu_check(&g->api, g->api.cuMemcpyDtoDAsync(rt_dptr(dev), c->stage + (CUdeviceptr)u->off, (size_t)bytes, g->stream),
                      err, "cuMemcpyDtoDAsync", "an upload inside a CUDA graph, %lld bytes", (long long)bytes);
    return 1;
}

int rt_gpu_graph_loss(RtGpu *g, double *dst, const float *dev, RtStatus *st, RtError *err) {
    RtGpuGraphs *gr = &g->graphs;
    *st = RT_OK;
    if (gr->mode == RT_GRAPH_PROBE) {
        rt_gpu_graph_probe(g, 'L', &dev, sizeof dev, 0);
        if (!rt_grow((void **)&gr->loss_dst, &gr->cap_loss, gr->nloss + 1, sizeof *gr->loss_dst)) gr->bad = "out of memory";
        else gr->loss_dst[gr->nloss++] = dst;
        return 1;
    }
    if (gr->mode != RT_GRAPH_CAPTURE) return 0;
    if (gr->next_loss >= gr->nloss) {
        *st = rt_fail(err, RT_ERR_ARG, "CUDA graph capture: more losses than the probe's");
        return 1;
    }
    CUdeviceptr to = gr->cur->loss + (CUdeviceptr)(4 * gr->next_loss++);
    *st = rt_cu_check(&g->api, g->api.cuMemcpyDtoDAsync(to, rt_dptr(dev), sizeof(float), g->stream), err, "cuMemcpyDtoDAsync",
                      "the loss inside a CUDA graph");
    return 1;
}

/* ---- the cache ---------------------------------------------------------------------------------- */

static void rt_graph_free(RtGpu *g, RtGpuGraph *c) {
    if (!c) return;
    if (c->exec) g->api.cuGraphExecDestroy(c->exec);
    if (c->graph) g->api.cuGraphDestroy(c->graph);
    if (c->stage) rt_gpu_mem_free(g, c->stage);
    if (c->loss) rt_gpu_mem_free(g, c->loss);
    free(c->sig);
    free(c);
}

static RtGpuGraph *rt_graph_find(RtGpuGraphs *gr, int fn) {
    for (int i = 0; i < RT_GPU_GRAPH_CACHE; i++) {
        RtGpuGraph *c = gr->cache[fn][i];
        if (c && c->nsig == gr->nsig && memcmp(c->sig, gr->sig, gr->nsig) == 0) return c;
    }
    return NULL;
}

/* A free slot for fn's next graph: an empty one, else the least recently launched, freed (the
 * stream waited for first: queued launches may still use it). */
static RtStatus rt_graph_slot(RtGpu *g, int fn, int *slot, RtError *err) {
    RtGpuGraphs *gr = &g->graphs;
    int old = 0;
    for (int i = 0; i < RT_GPU_GRAPH_CACHE; i++) {
        if (!gr->cache[fn][i]) {
            *slot = i;
            return RT_OK;
        }
        if (gr->cache[fn][i]->used < gr->cache[fn][old]->used) old = i;
    }
    RtStatus st =
        rt_cu_check(&g->api, g->api.cuStreamSynchronize(g->stream), err, "cuStreamSynchronize", "evicting a CUDA graph");
    if (st != RT_OK) return st;
    rt_graph_free(g, gr->cache[fn][old]);
    gr->cache[fn][old] = NULL;
    *slot = old;
    return RT_OK;
}

/* ---- capture and launch ------------------------------------------------------------------------- */

/* fn's name: RtExecFn's order (rt_exec.h) */
static const char *rt_graph_fn_name(int fn) {
    static const char *const names[] = {"forward_backward", "forward_loss",  "forward_logits",
                                        "optimizer_update", "forward_stats", "forward_chunk"};
    return fn >= 0 && fn < (int)(sizeof names / sizeof names[0]) ? names[fn] : "a step function";
}

static RtStatus rt_graph_capture(RtGpu *g, int fn, RtStatus (*f)(RtStep *), RtStep *s, RtGpuGraph **out) {
    RtGpuGraphs *gr = &g->graphs;
    RtError *err = s->err;
    int slot;
    RtStatus st = rt_graph_slot(g, fn, &slot, err);
    if (st != RT_OK) return st;
    RtGpuGraph *c = calloc(1, sizeof *c);
    if (c) c->sig = malloc(gr->nsig ? gr->nsig : 1);
    if (!c || !c->sig) {
        free(c);
        return rt_fail(err, RT_ERR_NOMEM, "CUDA graph: out of memory");
    }
    memcpy(c->sig, gr->sig, gr->nsig);
    c->nsig = gr->nsig;
    c->nup = gr->nup;
    c->nloss = gr->nloss;
    if (gr->ndata > 0)
        st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &c->stage, (size_t)gr->ndata), err, "cuMemAlloc", "a CUDA graph's uploads");
    if (st == RT_OK && gr->nloss > 0)
        st = rt_cu_check(&g->api, rt_gpu_mem_alloc(g, &c->loss, (size_t)gr->nloss * 4), err, "cuMemAlloc",
                         "a CUDA graph's losses");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuStreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_RELAXED), err,
                         "cuStreamBeginCapture", "%s", rt_graph_fn_name(fn));
    if (st != RT_OK) {
        rt_graph_free(g, c);
        return st;
    }
    gr->mode = RT_GRAPH_CAPTURE;
    gr->cur = c;
    gr->next_up = gr->next_loss = 0;
    st = f(s);
    gr->mode = RT_GRAPH_EAGER;
    gr->cur = NULL;
    /* the capture ends whatever happened inside it, so the stream is usable again */
    RtStatus end = rt_cu_check(&g->api, g->api.cuStreamEndCapture(g->stream, &c->graph), err, "cuStreamEndCapture", "%s",
                               rt_graph_fn_name(fn));
    if (st == RT_OK) st = end;
    if (st == RT_OK && (gr->next_up != gr->nup || gr->next_loss != gr->nloss))
        st = rt_fail(err, RT_ERR_ARG, "CUDA graph capture: the function made other calls than its probe");
    if (st == RT_OK)
        st = rt_cu_check(&g->api, g->api.cuGraphInstantiate(&c->exec, c->graph, 0), err, "cuGraphInstantiate", "%s",
                         rt_graph_fn_name(fn));
    if (st != RT_OK) {
        rt_graph_free(g, c);
        return st;
    }
    gr->cache[fn][slot] = c;
    gr->captured++;
    *out = c;
    return RT_OK;
}

static RtStatus rt_graph_launch(RtGpu *g, RtGpuGraph *c, RtError *err) {
    RtGpuGraphs *gr = &g->graphs;
    RtStatus st = RT_OK;
    /* from pageable memory: the driver copies the bytes before returning, so the probe's buffer
     * can be rewritten by the next call */
    for (int64_t i = 0; i < gr->nup && st == RT_OK; i++)
        st = rt_cu_check(&g->api,
                         g->api.cuMemcpyHtoDAsync(c->stage + (CUdeviceptr)gr->up[i].off, gr->data + gr->up[i].off,
                                                  (size_t)gr->up[i].bytes, g->stream),
                         err, "cuMemcpyHtoDAsync", "a CUDA graph's uploads");
    if (st == RT_OK) st = rt_cu_check(&g->api, g->api.cuGraphLaunch(c->exec, g->stream), err, "cuGraphLaunch", "the step");
    for (int64_t j = 0; j < gr->nloss && st == RT_OK; j++)
        st = rt_gpu_loss(g, gr->loss_dst[j], (const float *)(uintptr_t)(c->loss + (CUdeviceptr)(4 * j)), err);
    c->used = ++gr->tick;
    if (st == RT_OK) gr->launched++;
    return st;
}

RtStatus rt_gpu_call_eager(RtGpu *g, RtStatus (*f)(RtStep *), RtStep *s) {
    if (g->graphs.on && g->graphs.mode == RT_GRAPH_EAGER) g->graphs.eager++;
    return f(s);
}

RtStatus rt_gpu_call(RtGpu *g, int fn, RtStatus (*f)(RtStep *), RtStep *s) {
    RtGpuGraphs *gr = &g->graphs;
    if (!gr->on || fn < 0 || fn >= RT_GPU_GRAPH_FNS || gr->mode != RT_GRAPH_EAGER) return f(s);
    if (gr->refused[fn]) {
        gr->eager++;
        return f(s);
    }
    RtStatus st = rt_gpu_use(g, s->err);
    if (st != RT_OK) return st;
    gr->mode = RT_GRAPH_PROBE;
    gr->bad = NULL;
    gr->nsig = 0;
    gr->nup = gr->ndata = gr->nloss = 0;
    st = f(s);
    gr->mode = RT_GRAPH_EAGER;
    if (st != RT_OK) return st; /* an argument the entry points refused: the eager call would too */
    if (gr->bad) {
        gr->refused[fn] = 1;
        gr->eager++;
        return f(s);
    }
    RtGpuGraph *c = rt_graph_find(gr, fn);
    if (!c) {
        int seen = 0;
        for (int i = 0; i < RT_GPU_GRAPH_CACHE && !seen; i++)
            seen = gr->seen[fn][i] && gr->nseen[fn][i] == gr->nsig && memcmp(gr->seen[fn][i], gr->sig, gr->nsig) == 0;
        if (seen) {
            st = rt_graph_capture(g, fn, f, s, &c);
            if (st != RT_OK) {
                /* a graph is only a faster way to the same launches: a capture the driver refuses
                 * (nothing ran) turns graphs off for this function, said in the report */
                if (!gr->refused_why[0]) snprintf(gr->refused_why, sizeof gr->refused_why, "%.200s", s->err->msg);
                gr->refused[fn] = 1;
                gr->eager++;
                return f(s);
            }
        } else {
            int i = gr->next_seen[fn];
            unsigned char *copy = realloc(gr->seen[fn][i], gr->nsig ? gr->nsig : 1);
            if (copy) {
                memcpy(copy, gr->sig, gr->nsig);
                gr->seen[fn][i] = copy;
                gr->nseen[fn][i] = gr->nsig;
                gr->next_seen[fn] = (i + 1) % RT_GPU_GRAPH_CACHE;
            }
            gr->eager++;
            return f(s);
        }
    }
    return rt_graph_launch(g, c, s->err);
}

/* ---- opening, closing, the report --------------------------------------------------------------- */

RtStatus rt_gpu_graph_open(RtGpu *g, RtError *err) {
    const char *v = getenv("MBT_CUDA_GRAPH");
    int want = 1;
    if (v && *v) {
        if (strcmp(v, "0") == 0) want = 0;
        else if (strcmp(v, "1") != 0)
            return rt_fail(err, RT_ERR_ARG,
                           "MBT_CUDA_GRAPH must be 0 (launch every kernel) or 1 (CUDA graphs, the default), not '%s'", v);
    }
    g->graphs.on = want && !g->timer.on;
    return RT_OK;
}

void rt_gpu_graph_forget(RtGpu *g) {
    RtGpuGraphs *gr = &g->graphs;
    for (int f = 0; f < RT_GPU_GRAPH_FNS; f++)
        for (int i = 0; i < RT_GPU_GRAPH_CACHE; i++) {
            rt_graph_free(g, gr->cache[f][i]);
            gr->cache[f][i] = NULL;
        }
}

void rt_gpu_graph_close(RtGpu *g) {
    RtGpuGraphs *gr = &g->graphs;
    for (int f = 0; f < RT_GPU_GRAPH_FNS; f++) {
        for (int i = 0; i < RT_GPU_GRAPH_CACHE; i++) {
            rt_graph_free(g, gr->cache[f][i]);
            free(gr->seen[f][i]);
        }
    }
    free(gr->sig);
    free(gr->up);
    free(gr->data);
    free(gr->loss_dst);
    memset(gr, 0, sizeof *gr);
}

const char *rt_gpu_graph_report(const RtGpu *g, char *buf, size_t cap) {
    const char *v = getenv("MBT_CUDA_GRAPH");
    if (!g) snprintf(buf, cap, "CUDA graphs: no GPU");
    else if (!g->graphs.on && g->timer.on)
        snprintf(buf, cap, "CUDA graphs: off while MBT_DEBUG or MBT_TRACE times each launch (the step runs uncaptured)");
    else if (!g->graphs.on) snprintf(buf, cap, "CUDA graphs: off (MBT_CUDA_GRAPH=%s)", v ? v : "0");
    else
        snprintf(buf, cap, "CUDA graphs: %lld captured, %lld launched; %lld calls ran uncaptured%s%s",
                 (long long)g->graphs.captured, (long long)g->graphs.launched, (long long)g->graphs.eager,
                 g->graphs.refused_why[0] ? "; a capture failed, that function ran uncaptured from then on: " : "",
                 g->graphs.refused_why);
    return buf;
}
