/* host.c - the host code of an executable (host.h): its driver, host_compile, which builds one
 * LLVM module with every kernel, the RtProgram functions that launch them and the `mbt_program`
 * descriptor (descriptor.c), then links it (link.c); and those functions' emitters, written once
 * against a HostTarget (host_internal.h): the CPU's (target_cpu.c) for the RtProgram functions,
 * the GPU's (target_gpu.c) for the RtGpuProgram ones.
 *
 * Memory. Every buffer of a schedule (fuse.h) gets an address = region base + offset: parameters
 * at the plan's offset in the parameter region; data.x / data.y are the RtStep's x / y; the update
 * graph's p, g and state.* are the parameter, gradient and state regions; lr and t are two f32
 * slots in the arena that optimizer_update fills; everything else lives in the arena at an offset
 * from plan_assign_offsets over the schedule's launches (the step and update schedules never run
 * at once, so each starts at byte 0). The step schedule's gradients are arena buffers; after the
 * last launch forward_backward adds loss_scale x each into the gradient region (the ABI's +=).
 * The update schedule's new parameters and state are arena buffers copied into their regions
 * after its last launch.
 *
 * Generation. forward_logits runs a third schedule: the train block's model(data.x) built as a
 * graph of its own with data.x of one row (B = 1, T = seq; logits.c builds it), fused for
 * the logits alone. It has its own arena plan from byte 0 (no two of the three schedules run at
 * once), and the descriptor's arena_bytes is the largest of the three peaks. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cpu_scalar.h"
#include "diag.h"
#include "fuse.h"
#include "graph.h"
#include "host_internal.h"
#include "plan.h"
#include "sema.h"

/* ---- schedules ---------------------------------------------------------------------------------- */

static int is_leaf_home(const FuseBuffer *fb) { return fb->kind == FB_PARAM || fb->kind == FB_INPUT; }

static void sched_plan(Host *h, Sched *S, int64_t reserve) {
    FuseResult *r = S->r;
    PlanBuffer *pb = arena_alloc(h->ar, sizeof *pb * (size_t)(r->nbuffers + 1));
    S->arena_off = arena_alloc(h->ar, sizeof(int64_t) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        int in_arena = !is_leaf_home(fb) && fb->first >= 0;
        pb[i].size = in_arena ? fb->bytes : 0;
        pb[i].first = fb->first >= 0 ? fb->first : 0;
        pb[i].last = fb->last >= pb[i].first ? fb->last : pb[i].first;
        S->arena_off[i] = -1;
    }
    int64_t peak = plan_assign_offsets(pb, r->nbuffers, PLAN_ALIGN, h->ar);
    for (int i = 0; i < r->nbuffers; i++)
        if (pb[i].size) S->arena_off[i] = pb[i].offset + reserve;
    S->peak = peak + reserve;
}

static void sched_kernels(Host *h, Sched *S, int disjoint) {
    FuseResult *r = S->r;
    S->kfn = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nkernels + 1));
    S->kwrap = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nkernels + 1));
    for (int k = 0; k < r->nkernels; k++) {
        Kernel *kn = r->kernels[k]; /* named with its schedule's prefix (host_fuse) */
        S->kfn[k] = cpu_lower_kernel(h->m, kn, disjoint);
        LLVMSetLinkage(S->kfn[k], LLVMInternalLinkage);
        LLVMValueRef w = LLVMAddFunction(h->m, arena_printf(h->ar, "%s.range", kn->name), h->range_fn_t);
        LLVMSetLinkage(w, LLVMInternalLinkage);
        LLVMPositionBuilderAtEnd(h->b, LLVMAppendBasicBlockInContext(h->ctx, w, "entry"));
        LLVMValueRef a[3] = {LLVMGetParam(w, 0), LLVMGetParam(w, 1), LLVMGetParam(w, 2)};
        LLVMBuildCall2(h->b, LLVMGlobalGetValueType(S->kfn[k]), S->kfn[k], a, 3, "");
        LLVMBuildRetVoid(h->b);
        S->kwrap[k] = w;
    }
}

/* Launches [0, upto] of S in f on h->target; addr[i] is buffer i's address. A GEMM's status (and
 * on the GPU a launch's) is checked inline: a failure returns it. */
static void emit_launches(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, int upto) {
    FuseResult *r = S->r;
    for (int li = 0; li <= upto && li < r->nlaunches; li++) {
        const FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) {
            const FuseGemm *g = &L->gemm;
            if (g->dt != DT_F32 && g->dt != DT_BF16) INTERNAL("host: a GEMM of %s", dtype_name(g->dt));
            LLVMValueRef callee = h->target->gemm(h, g->dt);
            int vec = g->epilogue != FE_NONE;
            LLVMValueRef a[21] = {f->exec, ci32(h, g->trans_a), ci32(h, g->trans_b), ci64(h, g->m), ci64(h, g->n), ci64(h, g->k),
                                  LLVMConstReal(h->f32, g->alpha), addr[g->a], ci64(h, g->lda), ci64(h, g->stride_a),
                                  addr[g->b], ci64(h, g->ldb), ci64(h, g->stride_b), LLVMConstReal(h->f32, g->beta),
                                  addr[g->c], ci64(h, g->ldc), ci64(h, g->stride_c), ci64(h, g->batch),
                                  ci32(h, host_abi_gemm_epilogue(g->epilogue)), vec ? addr[g->bias] : LLVMConstPointerNull(h->ptr),
                                  f->err};
            /* named after the launch, so --emit=program can annotate it (print_program) */
            LLVMValueRef st = LLVMBuildCall2(h->b, h->gemm_t, callee, a, 21,
                                             arena_printf(h->ar, "%sgemm%d.", S->prefix, li));
            emit_check(h, f->fn, st);
            continue;
        }
        const Kernel *k = r->kernels[L->kernel];
        LLVMValueRef *bufs = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->nbufs; i++) bufs[i] = addr[k->bufs[i].buffer];
        h->target->launch(h, f, S, L->kernel, ptr_array(h, bufs, k->nbufs, "bufs"));
    }
}

static int param_index(const Graph *g, int node) {
    for (int i = 0; i < g->nparams; i++)
        if (g->params[i] == node) return i;
    return -1;
}

/* The step schedule's buffer addresses in the current function. */
static LLVMValueRef *step_addrs(Host *h, Sched *S, LLVMValueRef s) {
    FuseResult *r = S->r;
    const Graph *g = r->g;
    LLVMValueRef params = step_field(h, s, RT_STEP_params, h->ptr, "params");
    LLVMValueRef arena = step_field(h, s, RT_STEP_arena, h->ptr, "arena");
    LLVMValueRef x = step_field(h, s, RT_STEP_x, h->ptr, "x"), y = step_field(h, s, RT_STEP_y, h->ptr, "y");
    LLVMValueRef *addr = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        const GNode *n = fb->node >= 0 ? graph_node(g, fb->node) : NULL;
        if (S->arena_off[i] >= 0) addr[i] = byte_gep(h, arena, S->arena_off[i], "");
        else if (n && n->op == G_PARAM) {
            int pi = param_index(g, n->id);
            if (pi < 0) INTERNAL("host: parameter %%%d is not in the graph's list", n->id);
            addr[i] = byte_gep(h, params, h->plan->mem.params[pi].offset, "");
        } else if (n && n->op == G_INPUT && n->name && strcmp(n->name, "data.x") == 0) addr[i] = x;
        else if (n && n->op == G_INPUT && n->name && strcmp(n->name, "data.y") == 0) addr[i] = y;
        else addr[i] = LLVMConstPointerNull(h->ptr); /* touched by no launch */
    }
    return addr;
}

/* forward_backward (grad) or forward_loss: the step schedule's launches (all of them, or up to the
 * loss), the loss into s->loss, and with grad loss_scale x each gradient added into s->grads. */
LLVMValueRef emit_forward(Host *h, Sched *S, int grad) {
    const FuseResult *r = S->r;
    const Graph *g = r->g;
    HostFn f = host_fn_begin(h, grad ? "forward_backward" : "forward_loss");
    LLVMValueRef s = f.s;
    LLVMValueRef *addr = step_addrs(h, S, s);
    int lb = g->loss >= 0 ? r->node_buffer[g->loss] : -1;
    if (lb < 0) INTERNAL("host: the loss has no buffer");
    emit_launches(h, &f, S, addr, grad ? r->nlaunches - 1 : r->buffers[lb].first);
    h->target->read_loss(h, &f, LLVMBuildStructGEP2(h->b, h->step_t, s, RT_STEP_loss, ""), addr[lb]);
    if (grad) {
        LLVMValueRef grads = step_field(h, s, RT_STEP_grads, h->ptr, "grads");
        LLVMValueRef ls = LLVMBuildFPTrunc(h->b, step_field(h, s, RT_STEP_loss_scale, h->f64, "loss_scale"), h->f32, "");
        for (int i = 0; i < g->nparams; i++) {
            const PlanParam *pp = &h->plan->mem.params[i];
            int gb = g->grads && g->grads[i] >= 0 ? r->node_buffer[g->grads[i]] : -1;
            if (gb < 0) continue; /* no buffer: a zero gradient */
            h->target->accumulate(h, &f, byte_gep(h, grads, pp->offset, ""), addr[gb], ls, pp->numel);
        }
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* forward_logits(s): the logits schedule on s->x, then s->logits[0, V) = logits[len - 1, 0, V). */
LLVMValueRef emit_logits(Host *h, Sched *S, int node, int64_t vocab) {
    FuseResult *r = S->r;
    HostFn f = host_fn_begin(h, "forward_logits");
    LLVMValueRef s = f.s;
    LLVMValueRef *addr = step_addrs(h, S, s);
    int lb = r->node_buffer[node];
    if (lb < 0) INTERNAL("host: the logits %%%d have no buffer", node);
    emit_launches(h, &f, S, addr, r->nlaunches - 1);
    LLVMValueRef len = step_field(h, s, RT_STEP_len, h->i64, "len");
    LLVMValueRef first = LLVMBuildMul(h->b, LLVMBuildSub(h->b, len, ci64(h, 1), ""), ci64(h, vocab), "last_row");
    LLVMValueRef src = LLVMBuildInBoundsGEP2(h->b, h->f32, addr[lb], &first, 1, "last_logits");
    h->target->copy(h, &f, step_field(h, s, RT_STEP_logits, h->ptr, "logits"), src, vocab, 1);
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* optimizer_update: lr and t into the arena, the update schedule's launches over the parameter,
 * gradient and state regions, then the new parameters and state copied into their regions. */
LLVMValueRef emit_update(Host *h, Sched *S) {
    FuseResult *r = S->r;
    const Graph *g = r->g;
    const GraphUpdate *u = g->update;
    HostFn f = host_fn_begin(h, "optimizer_update");
    LLVMValueRef s = f.s;
    LLVMValueRef params = step_field(h, s, RT_STEP_params, h->ptr, "params");
    LLVMValueRef grads = step_field(h, s, RT_STEP_grads, h->ptr, "grads");
    LLVMValueRef state = step_field(h, s, RT_STEP_state, h->ptr, "state");
    LLVMValueRef arena = step_field(h, s, RT_STEP_arena, h->ptr, "arena");
    LLVMValueRef lr_slot = arena, t_slot = byte_gep(h, arena, 4, "t_slot");
    /* lr and t as f32 in the arena's first 8 bytes, written by the host (staged on the GPU, then uploaded) */
    LLVMValueRef host_slots = h->target->staging(h, arena, 2, "lr_t_host");
    LLVMBuildStore(h->b, LLVMBuildFPTrunc(h->b, step_field(h, s, RT_STEP_lr, h->f64, "lr"), h->f32, ""), host_slots);
    LLVMValueRef t_host = byte_gep(h, host_slots, 4, "");
    LLVMBuildStore(h->b, LLVMBuildSIToFP(h->b, step_field(h, s, RT_STEP_t, h->i64, "t"), h->f32, ""), t_host);
    h->target->upload(h, &f, arena, host_slots, 2);
    int64_t nbytes = u->n * 4;
    LLVMValueRef *addr = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        int nd = fb->node;
        addr[i] = LLVMConstPointerNull(h->ptr);
        if (S->arena_off[i] >= 0) addr[i] = byte_gep(h, arena, S->arena_off[i], "");
        else if (nd < 0) continue;
        else if (nd == u->p_in) addr[i] = params;
        else if (nd == u->g_in) addr[i] = grads;
        else if (nd == u->lr_in) addr[i] = lr_slot;
        else if (nd == u->t_in) addr[i] = t_slot;
        else
            for (int j = 0; j < u->nstate; j++)
                if (nd == u->state_in[j]) addr[i] = byte_gep(h, state, j * nbytes, "");
    }
    emit_launches(h, &f, S, addr, r->nlaunches - 1);
    if (u->p_out != u->p_in && r->node_buffer[u->p_out] >= 0)
        h->target->copy(h, &f, params, addr[r->node_buffer[u->p_out]], u->n, 0);
    for (int j = 0; j < u->nstate; j++)
        if (u->state_out[j] != u->state_in[j] && r->node_buffer[u->state_out[j]] >= 0)
            h->target->copy(h, &f, byte_gep(h, state, j * nbytes, ""), addr[r->node_buffer[u->state_out[j]]], u->n, 0);
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* optimizer_init: each state variable's initial value over every segment (padding stays 0);
 * NULL when every one starts at 0 (the runtime zeroes the region). */
static LLVMValueRef emit_optimizer_init(Host *h, const GraphUpdate *u) {
    int any = 0;
    for (int j = 0; j < u->nstate; j++) any |= u->state_init[j] != 0;
    if (!any) return NULL;
    LLVMValueRef fn = begin_fn(h, "optimizer_init", h->i32);
    LLVMValueRef state = step_field(h, LLVMGetParam(fn, 0), RT_STEP_state, h->ptr, "state");
    for (int j = 0; j < u->nstate; j++)
        for (int i = 0; i < u->nsegs && u->state_init[j] != 0; i++)
            emit_f32_loop(h, fn, byte_gep(h, state, (j * u->n + u->seg_off[i]) * 4, ""), NULL,
                          LLVMConstReal(h->f32, u->state_init[j]), u->seg_len[i], 2);
    LLVMBuildRet(h->b, ci32(h, 0));
    return fn;
}

/* ---- the listing (--emit=program) and the fused schedules -------------------------------------- */

/* --emit=program: the kernels of every schedule (each under its listing: kind, grid, buffers and
 * the graph ops it fuses with their source lines), then the host functions and the descriptor,
 * every launch in them preceded by a comment naming what it computes and where in the source. */
static void print_program(Host *h, FILE *out, const Sched *const *scheds, const Graph *const *graphs, int n) {
    int total = 0, nlaunch = 0;
    for (int i = 0; i < n; i++) total += scheds[i] ? scheds[i]->r->nkernels : 0;
    for (int i = 0; i < n; i++) nlaunch += scheds[i] ? scheds[i]->r->nlaunches : 0;
    Kernel **kernels = arena_alloc(h->ar, sizeof(Kernel *) * (size_t)(total + 1));
    const char **notes = arena_alloc(h->ar, sizeof(char *) * (size_t)(total + 1));
    CpuAnnotation *ann = arena_alloc(h->ar, sizeof(CpuAnnotation) * (size_t)(2 * nlaunch + 1)); /* a kernel: CPU and GPU calls */
    int k = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const Sched *S = scheds[i];
        for (int j = 0; S && j < S->r->nkernels; j++, k++) {
            kernels[k] = S->r->kernels[j];
            notes[k] = fuse_kernel_ops_note(graphs[i], kernels[k], h->ar);
        }
        for (int li = 0; S && li < S->r->nlaunches; li++) {
            const FuseLaunch *L = &S->r->launches[li];
            if (L->kind == FL_GEMM) {
                const FuseBuffer *c = &S->r->buffers[L->gemm.c];
                const GNode *gn = c->node >= 0 ? graph_node(graphs[i], c->node) : NULL;
                const char *at = gn && gn->src.file ? diag_source_path(gn->src.file) : NULL;
                const char *base = at && strrchr(at, '/') ? strrchr(at, '/') + 1 : at;
                ann[a].needle = arena_printf(h->ar, "%%%sgemm%d.", S->prefix, li);
                ann[a++].comment = arena_printf(
                    h->ar, "%sGEMM %" PRId64 "x%" PRId64 "x%" PRId64 "%s%s%s into %s%s", L->gemm.dt == DT_BF16 ? "bf16 " : "",
                    L->gemm.m, L->gemm.n, L->gemm.k,
                    L->gemm.batch > 1 ? arena_printf(h->ar, " (batch %" PRId64 ")", L->gemm.batch) : "",
                    L->gemm.trans_a || L->gemm.trans_b ? (L->gemm.trans_a ? (L->gemm.trans_b ? ", A^T B^T" : ", A^T B")
                                                                          : ", A B^T")
                                                       : "",
                    L->gemm.epilogue == FE_NONE ? ""
                    : arena_printf(h->ar, L->gemm.epilogue == FE_BIAS ? " + bias %s" : ", B's column sums into %s",
                                   S->r->buffers[L->gemm.bias].what),
                    c->what, base ? arena_printf(h->ar, " %s:%u:%u", base, gn->src.line, gn->src.col) : "");
            } else {
                const Kernel *kn = S->r->kernels[L->kernel];
                const char *note = fuse_kernel_ops_note(graphs[i], kn, h->ar), *nl = strchr(note, '\n');
                int nops = 0;
                for (const char *q = note; (q = strchr(q, '\n')) != NULL; q++) nops++;
                char *first = arena_printf(h->ar, "%.*s", nl ? (int)(nl - note) : (int)strlen(note), note), *w = first;
                for (const char *q = first; *q; q++)
                    if (*q != ' ' || q[1] != ' ') *w++ = *q; /* the listing's column padding, squeezed */
                *w = 0;
                ann[a].needle = arena_printf(h->ar, "@%s.range,", kn->name);
                ann[a++].comment = arena_printf(h->ar, "kernel %s: %s%s", kn->name, first,
                                                nops > 1 ? arena_printf(h->ar, " (and %d more ops)", nops - 1) : "");
                ann[a].needle = arena_printf(h->ar, "%%%s. = call i32 @rt_gpu_launch", kn->name); /* emit_launches names it */
                ann[a].comment = ann[a - 1].comment;
                a++;
            }
        }
    }
    cpu_print_module(out, h->m, kernels, notes, total, ann, a);
}

/* The schedules of a train block (HostSchedules): the step's and update's fused launches given,
 * and the batch-1 logits fused here; each verified, every kernel named with its schedule's prefix. */
static void host_fuse(Host *h, const TrainBuild *tb, FuseResult *const fused[2], HostSchedules *out) {
    static const char *const prefix[3] = {"step_", "update_", "logits_"};
    memset(out, 0, sizeof *out);
    out->logits_node = -1;
    const Graph *graphs[2] = {tb->step, tb->update};
    for (int i = 0; i < 2; i++) {
        out->g[i] = graphs[i];
        out->r[i] = fused[i];
        out->disjoint[i] = i == 0; /* the update writes in place */
    }
    out->n = 2;
    Graph *lg = diag_error_count() ? NULL : logits_graph(h, tb, find_vocab(h->plan->step), &out->logits_node);
    if (lg) {
        out->g[2] = lg;
        out->r[2] = fuse_graph(lg, &out->logits_node, 1, h->ar);
        out->disjoint[2] = 1;
        out->n = 3;
    }
    for (int i = 0; i < out->n; i++) {
        out->prefix[i] = prefix[i];
        if (fuse_verify(out->r[i], stderr)) INTERNAL("the fused %s graph fails fuse_verify (problems above)", prefix[i]);
        for (int k = 0; k < out->r[i]->nkernels; k++)
            out->r[i]->kernels[k]->name = arena_printf(h->ar, "%s%s", prefix[i], out->r[i]->kernels[k]->name);
    }
}

/* ---- the driver ---------------------------------------------------------------------------------- */

int host_refuses(const TrainBuild *tb) {
    /* Dropout's mask is keyed by its stream number alone (graph_build.c), so a compiled step would
     * draw the same mask every step and micro-batch: refused until the key carries the seed, step
     * and micro-batch. */
    for (int id = 0; id < tb->step->n; id++) {
        const GNode *n = tb->step->node[id];
        if (n->op == G_DROPOUT && n->fattr[0] > 0) {
            diag_error(n->src, "dropout is not compiled into executables yet");
            diag_hint("its mask would be the same at every step and micro-batch; --check and --emit accept it");
            return 1;
        }
    }
    return 0;
}

int host_compile(const TrainBuild *tb, const Plan *plan, const HostSchedules *schedules, const char *input,
                 const char *output, FILE *emit, const HostCuda *cuda, Arena *ar) {
    CpuTarget target;
    const char *err = NULL;
    if (cpu_target_host(&target, ar, &err)) {
        diag_error_noloc("%s", err);
        return diag_finish();
    }
    Host H = {.ar = ar, .plan = plan, .ts = tb->config, .target = &host_target_cpu};
    Host *h = &H;
    h->ctx = LLVMContextCreate();
    h->m = cpu_module_new(h->ctx, &target, input);
    h->b = LLVMCreateBuilderInContext(h->ctx);
    host_types(h);

    const HostSchedules hs = *schedules;
    Sched step = {.prefix = "step_", .r = hs.r[0]}, upd = {.prefix = "update_", .r = hs.r[1]};
    Sched lsch = {.prefix = "logits_", .r = hs.n > 2 ? hs.r[2] : NULL};
    sched_plan(h, &step, 0);
    sched_plan(h, &upd, PLAN_ALIGN); /* lr and t in the first 64 bytes */
    sched_kernels(h, &step, 1);
    sched_kernels(h, &upd, 0);
    LLVMValueRef fb = emit_forward(h, &step, 1), fl = emit_forward(h, &step, 0);
    LLVMValueRef ou = emit_update(h, &upd), oi = emit_optimizer_init(h, tb->update->update);
    LLVMValueRef lrs = cpu_scalar_function(h->m, h->ts->lr, "lr_schedule"); /* the schedule sema lowered */
    int64_t arena = step.peak > upd.peak ? step.peak : upd.peak;
    /* generation: the logits at batch 1 (NULL, with a warning, when the model has none) */
    LLVMValueRef flog = NULL;
    if (lsch.r) {
        sched_plan(h, &lsch, 0);
        sched_kernels(h, &lsch, 1);
        flog = emit_logits(h, &lsch, hs.logits_node, find_vocab(plan->step));
        if (lsch.peak > arena) arena = lsch.peak;
    }
    /* the hash covers the CPU functions alone: the GPU ones compute the same step, and a checkpoint
     * resumes on either device */
    const char *hash = diag_error_count() ? NULL : program_hash(h);
    Sched *scheds[3] = {&step, &upd, lsch.r ? &lsch : NULL};
    LLVMValueRef gpu = diag_error_count() ? NULL : host_cuda(h, scheds, &hs, cuda, output == NULL);
    if (!diag_error_count())
        emit_descriptor(h, input, fb, fl, flog, oi, ou, lrs, arena, hash, tb->update->update, gpu);
    int rc;
    if (!diag_error_count() && !output) {
        if (cpu_verify(h->m, ar, &err)) INTERNAL("the program's LLVM module fails LLVMVerifyModule: %s", err);
        const Graph *graphs[3] = {tb->step, tb->update, hs.n > 2 ? hs.g[2] : NULL};
        print_program(h, emit, (const Sched *const *)scheds, graphs, 3);
    } else if (!diag_error_count()) {
        if (cpu_verify(h->m, ar, &err)) INTERNAL("the program's LLVM module fails LLVMVerifyModule: %s", err);
        host_link(h->m, &target, output, ar);
    }
    rc = diag_error_count() ? 1 : 0;
    LLVMDisposeBuilder(h->b);
    LLVMDisposeModule(h->m);
    LLVMContextDispose(h->ctx);
    cpu_target_dispose(&target);
    return rc;
}

/* ---- the schedules alone (host.h: for the CUDA source) ------------------------------------------ */

int host_schedules(const TrainBuild *tb, const Plan *plan, FuseResult *const fused[2], HostSchedules *out, Arena *ar) {
    Host H = {.ar = ar, .plan = plan, .ts = tb->config};
    host_fuse(&H, tb, fused, out);
    return diag_error_count() ? 1 : 0;
}
