/* host.c - the host code of an executable (host.h): its driver, host_compile, which builds one
 * LLVM module with every kernel, the RtProgram functions that launch them and the `mbt_program`
 * descriptor (descriptor.c), then links it (link.c); and those functions' emitters, written once
 * against a HostTarget (host_internal.h): the CPU's (target_cpu.c) for the RtProgram functions,
 * the GPU's (target_gpu.c) for the RtGpuProgram ones.
 *
 * Memory. Every buffer of a schedule (fuse.h) gets its address from the memory plan (plan.h): the
 * RtStep field of its home (params, grads, state, x, y, arena) plus the plan's offset. The moves
 * are the plan's too: forward_backward adds loss_scale x each gradient buffer into the gradient
 * region (the ABI's +=) right after the launch the plan names (the buffer's last), optimizer_update copies the new parameters and state
 * into their regions, after filling the plan's lr and t slots.
 *
 * Generation. forward_logits runs a third schedule (plan.h, PLAN_LOGITS): the train block's
 * model(data.x) at batch 1, fused for the logits alone. The descriptor's arena_bytes is the plan's
 * largest peak; its RtPlanInfo carries the plan's summary for `./prog info`. */
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

/* Whether a GEMM of the chunk phase computes only the rows the call uses (h->chunk_len): its A
 * holds the tokens' rows: a token-dependent value [1, ..., 1, rows, ...] read as rows x k, packed,
 * no transpose, one matrix (its first axis above 1 is the token axis: were the token axis further
 * in, a row of A would hold several tokens and the product would contract the token axis, which
 * kv.c refuses).
 * Its other rows then hold what the arena held: they are padding rows, whose results no one reads
 * (a row never reads another: kv.c). */
static int chunk_gemm_rows(Host *h, const Sched *S, const FuseGemm *g) {
    /* the GPU's products keep their compiled shape, all rows: cuBLASLt picks its algorithm by the
     * shape, and a fixed shape rounds each row the same wherever it sits (docs/serve.md) */
    if (h->target != &host_target_cpu) return 0;
    if (!h->chunk_len || S->mem != &h->plan->mem.phase[PLAN_CHUNK] || h->chunk_rows < 2) return 0;
    if (g->trans_a || g->batch != 1 || g->m != h->chunk_rows) return 0;
    const FuseBuffer *a = &S->r->buffers[g->a];
    if (a->node < 0 || a->node >= S->r->g->n || !h->chunk_dep[a->node] || g->lda != g->k) return 0;
    int d = 0;
    while (d < a->rank && a->shape[d] == 1) d++;
    if (d == a->rank || a->shape[d] != h->chunk_rows) return 0;
    int64_t rest = 1;
    for (int i = d + 1; i < a->rank; i++) rest *= a->shape[i];
    return rest == g->k;
}

/* How many work items of kernel k make one row of the chunk phase's call, when k may run the rows
 * the call uses alone (items [0, len x that)), else 0. On the CPU only (the GPU's launches keep
 * their compiled grid). It must be an elementwise or row kernel in one segment - whose work items
 * enumerate its output (the elements, or the rows of its leading axes) in row-major order - whose
 * every written buffer is a token-wise node (kv.c's token_axis) with the token axis its first axis
 * above 1, of the call's rows, and whose every other buffer is constant (no input behind it) or
 * token-wise: then the items of call row r are the r-th of rows equal runs and touch row r alone
 * (a row never reads another: kv.c), so the rows a call uses need no other items. Padding rows'
 * values are then whatever the arena held; no one reads them (chunk_gemm_rows's rule). */
static int64_t chunk_kernel_rows(Host *h, const Sched *S, const Kernel *k) {
    const PlanSchedules *ps = &h->plan->sched;
    if (h->target != &host_target_cpu || !h->chunk_len || S->mem != &h->plan->mem.phase[PLAN_CHUNK] || h->chunk_rows < 2)
        return 0;
    if ((k->kind != KK_ELEMENTWISE && k->kind != KK_ROW) || k->nsegments > 1 || k->kv || k->lora || k->attn || k->ce) return 0;
    int64_t R = h->chunk_rows;
    if (k->grid < R || k->grid % R != 0) return 0;
    const Graph *g = S->r->g;
    int wrote = 0;
    for (int i = 0; i < k->nbufs; i++) {
        const KBuf *b = &k->bufs[i];
        if (b->node < 0 || b->node >= g->n) return 0;
        int tok = b->node < ps->chunk.ntoken_axis ? ps->chunk.token_axis[b->node] : -1;
        if (!b->written && !h->chunk_dep[b->node]) continue; /* constant: the parameters, what comes of them */
        if (tok < 0) return 0;                               /* token-dependent, its rows not known */
        if (!b->written) continue;
        const GNode *n = graph_node(g, b->node);
        if (b->rank != n->rank || tok >= n->rank || n->shape[tok] != R) return 0;
        for (int d = 0; d < n->rank; d++)
            if (b->shape[d] != n->shape[d] || (d < tok && n->shape[d] != 1)) return 0;
        wrote = 1;
    }
    return wrote ? k->grid / R : 0;
}

/* A fused LoRA kernel on the CPU (kir.h's KLora): rt_lora_f32, OpenBLAS on row tiles whose S stays in
 * cache, rather than the kernel's body (a row a work item, scalar loops); the chunk phase keeps the
 * body, whose rows never depend on the call (docs/serve.md, "Numerics"). */
static void emit_lora(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, const Kernel *k, int li, const char *tag) {
    const KLora *l = k->lora;
    LLVMTypeRef I = h->i64, W = h->i32;
    LLVMTypeRef args[] = {h->ptr, I, I, I,      I,      I,      I,      I,      I,      I,      I,
                          I,      W, W, h->f32, h->ptr, h->ptr, h->ptr, h->ptr, h->ptr, h->ptr, h->ptr};
    LLVMTypeRef t = LLVMFunctionType(W, args, 22, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(h->m, "rt_lora_f32");
    if (!fn) fn = LLVMAddFunction(h->m, "rt_lora_f32", t);
    LLVMValueRef a[22] = {f->exec,
                          ci64(h, l->batch),
                          ci64(h, l->m),
                          ci64(h, l->k),
                          ci64(h, l->r),
                          ci64(h, l->n),
                          ci64(h, l->ldx),
                          ci64(h, l->stride_x),
                          ci64(h, l->lda),
                          ci64(h, l->stride_a),
                          ci64(h, l->ldb),
                          ci64(h, l->stride_b),
                          ci32(h, l->trans_a),
                          ci32(h, l->trans_b),
                          LLVMConstReal(h->f32, l->alpha),
                          addr[k->bufs[l->x].buffer],
                          addr[k->bufs[l->a].buffer],
                          addr[k->bufs[l->b].buffer],
                          addr[k->bufs[l->d].buffer],
                          l->s >= 0 ? addr[k->bufs[l->s].buffer] : LLVMConstPointerNull(h->ptr),
                          addr[k->bufs[l->c].buffer],
                          f->err};
    LLVMValueRef st = LLVMBuildCall2(h->b, t, fn, a, 22, arena_printf(h->ar, "%slora%d%s.", S->prefix, li, tag));
    emit_check(h, f->fn, st);
}

/* Launches [0, upto] of S in f on h->target (only those keep marks, when keep is not NULL);
 * addr[i] is buffer i's address. A GEMM's status (and on the GPU a launch's) is checked inline: a
 * failure returns it. */
static void emit_launch(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, int li, const char *tag) {
    FuseResult *r = S->r;
    {
        const FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) {
            const FuseGemm *g = &L->gemm;
            if (g->dt != DT_F32 && g->dt != DT_BF16) INTERNAL("host: a GEMM of %s", dtype_name(g->dt));
            /* the chunk phase's products keep a row's bits whatever its index (host_rows_gemm) */
            LLVMValueRef callee = S->mem == &h->plan->mem.phase[PLAN_CHUNK] && h->target == &host_target_cpu
                                      ? host_rows_gemm(h, g->dt)
                                      : h->target->gemm(h, g->dt);
            int vec = g->epilogue != FE_NONE;
            LLVMValueRef a[21] = {f->exec,
                                  ci32(h, g->trans_a),
                                  ci32(h, g->trans_b),
                                  chunk_gemm_rows(h, S, g) ? h->chunk_len : ci64(h, g->m),
                                  ci64(h, g->n),
                                  ci64(h, g->k),
                                  LLVMConstReal(h->f32, g->alpha),
                                  addr[g->a],
                                  ci64(h, g->lda),
                                  ci64(h, g->stride_a),
                                  addr[g->b],
                                  ci64(h, g->ldb),
                                  ci64(h, g->stride_b),
                                  LLVMConstReal(h->f32, g->beta),
                                  addr[g->c],
                                  ci64(h, g->ldc),
                                  ci64(h, g->stride_c),
                                  ci64(h, g->batch),
                                  ci32(h, host_abi_gemm_epilogue(g->epilogue)),
                                  vec ? addr[g->bias] : LLVMConstPointerNull(h->ptr),
                                  f->err};
            /* named after the launch, so --emit=program can annotate it (print_program) */
            LLVMValueRef st =
                LLVMBuildCall2(h->b, h->gemm_t, callee, a, 21, arena_printf(h->ar, "%sgemm%d%s.", S->prefix, li, tag));
            emit_check(h, f->fn, st);
            return;
        }
        const Kernel *k = r->kernels[L->kernel];
        if (k->lora && h->target == &host_target_cpu && S->mem != &h->plan->mem.phase[PLAN_CHUNK]) {
            emit_lora(h, f, S, addr, k, li, tag);
            return;
        }
        LLVMValueRef *bufs = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->nbufs; i++) {
            bufs[i] = addr[k->bufs[i].buffer];
            /* the KV pool: a parameter of the kv input's buffer that is not its i32 metadata (cg_kv_attention) */
            if (h->kv_pool && S->mem->slots[k->bufs[i].buffer].home == PH_KV && k->bufs[i].dt != DT_I32) bufs[i] = h->kv_pool;
        }
        int64_t per_row = chunk_kernel_rows(h, S, k);
        if (per_row > 0) /* the rows the call uses alone (RtStep.len, emit_chunk) */
            host_cpu_launch_count(h, f, S, L->kernel, ptr_array(h, bufs, k->nbufs, "bufs"),
                                  LLVMBuildMul(h->b, h->chunk_len, ci64(h, per_row), "items"));
        else h->target->launch(h, f, S, L->kernel, ptr_array(h, bufs, k->nbufs, "bufs"));
    }
}

static void emit_param_calls(Host *h, LLVMValueRef s, const PlanGatherSched *gs, int q, int before);

/* Launches 0..upto of S (those keep marks, when given); gs: the step schedule's gathers for them
 * (forward_loss's, forward_stats'), NULL for another phase. */
static void emit_launches_kept(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, int upto, const unsigned char *keep,
                               const PlanGatherSched *gs) {
    for (int li = 0; li <= upto && li < S->r->nlaunches; li++)
        if (!keep || keep[li]) {
            if (gs) emit_param_calls(h, f->s, gs, li, 1);
            emit_launch(h, f, S, addr, li, "");
            if (gs) emit_param_calls(h, f->s, gs, li, 0);
        }
}

/* loss_scale x each gradient buffer of w[0..n) added into its range of the gradient region. A
 * target with accumulate_all adds them in as few launches as it can: in one launch the additions
 * run side by side, so a write into a range an earlier write of the group touches (two uses of one
 * parameter) starts the next group, and additions into the same elements stay in the plan's order
 * (the sums bit for bit the one-at-a-time ones). */
static void emit_grad_adds(Host *h, const HostFn *f, const PlanWrite **w, int n, LLVMValueRef grads, LLVMValueRef *addr,
                           LLVMValueRef ls) {
    LLVMValueRef *dst = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(n + 1));
    LLVMValueRef *src = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(n + 1));
    int64_t *len = arena_alloc(h->ar, sizeof(int64_t) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        if (!w[i]->accumulate || w[i]->to != PH_GRADS) INTERNAL("host: the step's move '%s' is not a gradient's", w[i]->what);
        dst[i] = byte_gep(h, grads, w[i]->offset, "");
        src[i] = addr[w[i]->buffer];
        len[i] = w[i]->bytes / 4;
    }
    if (!h->target->accumulate_all) {
        for (int i = 0; i < n; i++) h->target->accumulate(h, f, dst[i], src[i], ls, len[i]);
        return;
    }
    for (int lo = 0; lo < n;) {
        int hi = lo + 1, clash = 0;
        for (; hi < n && !clash; hi += !clash)
            for (int j = lo; j < hi && !clash; j++)
                clash = w[hi]->offset < w[j]->offset + w[j]->bytes && w[j]->offset < w[hi]->offset + w[hi]->bytes;
        h->target->accumulate_all(h, f, dst + lo, src + lo, len + lo, hi - lo, ls);
        lo = hi;
    }
}

/* offload.activations = nvme or host: rt_act_copy(exec, op, store offset, buffer, bytes, err),
 * checked; op 0 write, 1 read, 2 wait (runtime/exec/rt_exec.h; on the GPU the buffer is a device
 * address and the runtime queues the copy on its copy stream) */
static void emit_act_copy(Host *h, const HostFn *f, int op, int64_t off, LLVMValueRef buf, int64_t len) {
    LLVMTypeRef args[] = {h->ptr, h->i32, h->i64, h->ptr, h->i64, h->ptr};
    LLVMTypeRef t = LLVMFunctionType(h->i32, args, 6, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(h->m, "rt_act_copy");
    if (!fn) fn = LLVMAddFunction(h->m, "rt_act_copy", t);
    LLVMValueRef a[] = {step_field(h, f->s, RT_STEP_act, h->ptr, "act"), ci32(h, op),  ci64(h, off),
                        buf ? buf : LLVMConstPointerNull(h->ptr),        ci64(h, len), f->err};
    static const char *const name[] = {"act_write", "act_read", "act_wait"};
    emit_check(h, f->fn, LLVMBuildCall2(h->b, t, fn, a, 6, name[op]));
}

/* The copies of offload.activations before position q of the step program: a wait for each
 * buffer whose write's slot is reused at q or whose read's data is used at q (its store offset
 * names it: the GPU's copy stream waits for that copy and those queued before it, not for later
 * ones; the CPU's store waits for all it has queued), then the reads issued at q, into their second
 * copies, which every later launch reads. */
static void emit_act_before(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, LLVMValueRef arena, int q) {
    const PlanRecompute *rc = &h->plan->mem.rc;
    if (rc->noffloads == 0) return;
    for (int j = 0; j < rc->noffloads; j++)
        if (rc->offloads[j].write_wait == q || rc->offloads[j].use == q)
            emit_act_copy(h, f, 2, rc->offloads[j].store_off, NULL, 0);
    for (int j = 0; j < rc->noffloads; j++) {
        const PlanOffload *o = &rc->offloads[j];
        if (o->read_at != q) continue;
        if (rc->again[o->buffer].home != PH_ARENA) INTERNAL("host: offloaded buffer %d has no second copy", o->buffer);
        addr[o->buffer] = byte_gep(h, arena, rc->again[o->buffer].offset, "read_back");
        emit_act_copy(h, f, 1, o->store_off, addr[o->buffer],
                      (o->bytes + PLAN_OFFLOAD_PAGE - 1) / PLAN_OFFLOAD_PAGE * PLAN_OFFLOAD_PAGE);
    }
    (void)S;
}

/* ... and the writes issued right after position q (the buffers' last forward use). */
static void emit_act_after(Host *h, const HostFn *f, LLVMValueRef *addr, int q) {
    const PlanRecompute *rc = &h->plan->mem.rc;
    if (rc->noffloads == 0) return;
    for (int j = 0; j < rc->noffloads; j++) {
        const PlanOffload *o = &rc->offloads[j];
        if (o->write_after == q)
            emit_act_copy(h, f, 0, o->store_off, addr[o->buffer],
                          (o->bytes + PLAN_OFFLOAD_PAGE - 1) / PLAN_OFFLOAD_PAGE * PLAN_OFFLOAD_PAGE);
    }
}

/* ZeRO-3's gathers (plan.h, PlanGather) of one schedule: rt_param_need(s, lo, hi, next_lo,
 * next_hi) before position q for each gather first needed there (before = 1), rt_param_done(s,
 * lo, hi) after it for each last used there (before = 0). Emitted whatever the zero setting (the
 * runtime passes a NULL hook without ZeRO-3, and the calls do nothing), so that the code, and
 * with it the program hash and a checkpoint, are the same at every zero setting. The GPU's
 * functions make the same calls between their launches (the runtime's hook maps and gathers on a
 * stream the launches after a need wait for, and a done's unmap waits for the launches before
 * it: runtime/comm/zero3.c); such a call runs uncaptured (exec.c). */
static void emit_param_calls(Host *h, LLVMValueRef s, const PlanGatherSched *gs, int q, int before) {
    for (int j = 0; j < gs->n; j++) {
        const PlanGather *g = &gs->g[j];
        if ((before ? g->need : g->done) != q) continue;
        int np = before ? 5 : 3;
        LLVMTypeRef pt[5] = {h->ptr, h->i64, h->i64, h->i64, h->i64};
        LLVMTypeRef ft = LLVMFunctionType(h->vd, pt, (unsigned)np, 0);
        const char *name = before ? "rt_param_need" : "rt_param_done";
        LLVMValueRef fn = LLVMGetNamedFunction(h->m, name);
        if (!fn) fn = LLVMAddFunction(h->m, name, ft);
        const PlanGather *nx = j + 1 < gs->n ? &gs->g[j + 1] : NULL;
        LLVMValueRef a[5] = {s, ci64(h, g->lo), ci64(h, g->hi), ci64(h, nx ? nx->lo : 0), ci64(h, nx ? nx->hi : 0)};
        LLVMBuildCall2(h->b, ft, fn, a, (unsigned)np, "");
    }
}

/* forward_backward's launches: the step program (the schedule's launches, with recompute's
 * re-runs in the plan's order: plan.h, PlanRecompute), each gradient added into s->grads right
 * after the position the plan gives its move (the last launch that touches its buffer, whose
 * memory the plan then reuses), and followed by rt_grad_ready(s, lo, hi). A re-run
 * writes the second copies of its buffers (rc->again), which every later launch reads. */
static void emit_step_program(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, LLVMValueRef s) {
    const PlanRecompute *rc = &h->plan->mem.rc;
    LLVMValueRef arena = step_field(h, s, RT_STEP_arena, h->ptr, "arena");
    LLVMValueRef grads = step_field(h, s, RT_STEP_grads, h->ptr, "grads");
    LLVMValueRef ls = LLVMBuildFPTrunc(h->b, step_field(h, s, RT_STEP_loss_scale, h->f64, "loss_scale"), h->f32, "");
    int n = rc->on ? rc->norder : S->r->nlaunches, moved = 0;
    const PlanWrite **now = arena_alloc(h->ar, sizeof *now * (size_t)(S->mem->nwrites + 1));
    for (int q = 0; q < n; q++) {
        int o = rc->on ? rc->order[q] : q;
        emit_param_calls(h, s, &h->plan->mem.gather[PLAN_GATHER_STEP], q, 1);
        emit_act_before(h, f, S, addr, arena, q);
        if (o >= 0 && h->plan->mem.param_only && h->plan->mem.param_only[o]) {
            /* reads only parameters (plan.h, PlanMemory.param_only): skipped when the runtime says
             * the arena still holds what it wrote at this step's first micro-batch (casts_kept 1),
             * and one that writes only into the parameter casts' region (param_only 2) also when the
             * runtime says that region is current (2: the update wrote it) */
            LLVMValueRef kept = step_field(h, s, RT_STEP_casts_kept, h->i64, "casts_kept");
            LLVMBasicBlockRef run = LLVMAppendBasicBlockInContext(h->ctx, f->fn, "once_a_step");
            LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(h->ctx, f->fn, "once_a_step_done");
            LLVMValueRef go = h->plan->mem.param_only[o] == 2 ? LLVMBuildICmp(h->b, LLVMIntEQ, kept, ci64(h, 0), "")
                                                              : LLVMBuildICmp(h->b, LLVMIntNE, kept, ci64(h, 1), "");
            LLVMBuildCondBr(h->b, go, run, done);
            LLVMPositionBuilderAtEnd(h->b, run);
            emit_launch(h, f, S, addr, o, "");
            LLVMBuildBr(h->b, done);
            LLVMPositionBuilderAtEnd(h->b, done);
        } else if (o >= 0) emit_launch(h, f, S, addr, o, "");
        else {
            int j = -1 - o;
            for (int b = 0; b < S->r->nbuffers; b++)
                if (rc->rerun[b] == j) {
                    if (rc->again[b].home != PH_ARENA) INTERNAL("host: re-run %d's buffer %d has no second copy", j, b);
                    addr[b] = byte_gep(h, arena, rc->again[b].offset, "again");
                }
            emit_launch(h, f, S, addr, rc->reruns[j].launch, arena_printf(h->ar, ".rerun%d", j));
        }
        emit_act_after(h, f, addr, q);
        int k = 0;
        for (int i = 0; i < S->mem->nwrites; i++)
            if (S->mem->writes[i].after == q) now[k++] = &S->mem->writes[i];
        emit_grad_adds(h, f, now, k, grads, addr, ls);
        emit_param_calls(h, s, &h->plan->mem.gather[PLAN_GATHER_STEP], q, 0);
        moved += k;
        /* these gradients are final for the micro-batch, so the runtime may start their reduction
         * across data ranks (rt_grad_ready; on the GPU their adds are queued on the compute stream
         * just before, so an event recorded there now marks them done) */
        if (k) {
            LLVMTypeRef pt[3] = {h->ptr, h->i64, h->i64};
            LLVMTypeRef ft = LLVMFunctionType(h->vd, pt, 3, 0);
            LLVMValueRef fn = LLVMGetNamedFunction(h->m, "rt_grad_ready");
            if (!fn) fn = LLVMAddFunction(h->m, "rt_grad_ready", ft);
            for (int i = 0; i < k; i++) {
                LLVMValueRef a[3] = {s, ci64(h, now[i]->offset / 4), ci64(h, (now[i]->offset + now[i]->bytes) / 4)};
                LLVMBuildCall2(h->b, ft, fn, a, 3, "");
            }
        }
    }
    if (moved != S->mem->nwrites) INTERNAL("host: %d of the step's %d moves placed", moved, S->mem->nwrites);
}

static void emit_launches(Host *h, const HostFn *f, Sched *S, LLVMValueRef *addr, int upto, const PlanGatherSched *gs) {
    emit_launches_kept(h, f, S, addr, upto, NULL, gs);
}

/* The address of every buffer of S in the current function: the RtStep field of its plan home
 * plus its offset (null for a buffer no launch touches). */
static LLVMValueRef *sched_addrs(Host *h, const Sched *S, LLVMValueRef s) {
    const PlanPhaseMem *pm = S->mem;
    LLVMValueRef base[PH_PCAST + 1] = {NULL};
    base[PH_PARAMS] = step_field(h, s, RT_STEP_params, h->ptr, "params");
    if (h->plan->mem.pcast_bytes > 0) base[PH_PCAST] = step_field(h, s, RT_STEP_pcasts, h->ptr, "pcasts");
    base[PH_GRADS] = step_field(h, s, RT_STEP_grads, h->ptr, "grads");
    base[PH_STATE] = step_field(h, s, RT_STEP_state, h->ptr, "state");
    base[PH_ARENA] = step_field(h, s, RT_STEP_arena, h->ptr, "arena");
    base[PH_X] = step_field(h, s, RT_STEP_x, h->ptr, "x"), base[PH_Y] = step_field(h, s, RT_STEP_y, h->ptr, "y");
    base[PH_POS] = step_field(h, s, RT_STEP_pos, h->ptr, "pos");
    base[PH_STATS] = step_field(h, s, RT_STEP_stats, h->ptr, "stats");
    if (S->mem == &h->plan->mem.phase[PLAN_CHUNK]) base[PH_KV] = step_field(h, s, RT_STEP_kv, h->ptr, "kv");
    LLVMValueRef *addr = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(S->r->nbuffers + 1));
    for (int i = 0; i < S->r->nbuffers; i++) {
        const PlanSlot *sl = &pm->slots[i];
        addr[i] = sl->home == PH_NONE ? LLVMConstPointerNull(h->ptr) : byte_gep(h, base[sl->home], sl->offset, "");
    }
    return addr;
}

/* Dropout's key (graph.h, GRAPH_RNG_WORDS) into the plan's arena slot: the run's seed in two
 * 32-bit words, the step and micro-batch (mod 2^32), and on = grad: forward_backward draws masks,
 * forward_loss (evaluation) does no dropout. Written by the host, staged and uploaded on the GPU. */
static void emit_rng_key(Host *h, const HostFn *f, const Sched *S, LLVMValueRef on) {
    LLVMValueRef arena = step_field(h, f->s, RT_STEP_arena, h->ptr, "arena");
    LLVMValueRef slot = byte_gep(h, arena, S->mem->rng_offset, "rng_slot");
    LLVMValueRef staged = h->target->staging(h, slot, GRAPH_RNG_WORDS * 2, "rng_host"); /* counted in f32 */
    LLVMValueRef seed = step_field(h, f->s, RT_STEP_seed, h->i64, "seed"), mask = ci64(h, 0xffffffff);
    LLVMValueRef w[GRAPH_RNG_WORDS] = {LLVMBuildAnd(h->b, seed, mask, "seed_lo"),
                                       LLVMBuildLShr(h->b, seed, ci64(h, 32), "seed_hi"),
                                       LLVMBuildAnd(h->b, step_field(h, f->s, RT_STEP_step, h->i64, "step"), mask, ""),
                                       LLVMBuildAnd(h->b, step_field(h, f->s, RT_STEP_micro, h->i64, "micro"), mask, ""), on};
    for (int i = 0; i < GRAPH_RNG_WORDS; i++) LLVMBuildStore(h->b, w[i], byte_gep(h, staged, 8 * i, ""));
    h->target->upload(h, f, slot, staged, GRAPH_RNG_WORDS * 2);
}

/* forward_backward (grad) or forward_loss: the step schedule's launches (all of them, or up to the
 * loss), the loss into s->loss, and with grad loss_scale x each gradient added into s->grads. */
LLVMValueRef emit_forward(Host *h, Sched *S, int grad) {
    const FuseResult *r = S->r;
    const Graph *g = r->g;
    HostFn f = host_fn_begin(h, grad ? "forward_backward" : "forward_loss");
    LLVMValueRef s = f.s;
    if (S->mem->rng_offset >= 0) emit_rng_key(h, &f, S, ci64(h, grad ? 1 : 0));
    LLVMValueRef *addr = sched_addrs(h, S, s);
    int lb = g->loss >= 0 ? r->node_buffer[g->loss] : -1;
    if (lb < 0) INTERNAL("host: the loss has no buffer");
    if (grad) {
        if (S->mem != &h->plan->mem.phase[PLAN_STEP]) INTERNAL("host: forward_backward of another phase");
        emit_step_program(h, &f, S, addr, s);
    } else emit_launches(h, &f, S, addr, r->buffers[lb].first, &h->plan->mem.gather[PLAN_GATHER_LOSS]);
    h->target->read_loss(h, &f, LLVMBuildStructGEP2(h->b, h->step_t, s, RT_STEP_loss, ""), addr[lb]);
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* forward_stats(s), the statistics pass of global_mean (plan.h, PlanMemory.stats_keep): the step
 * schedule's launches that the statistics' expressions need, then each expression's buffer copied
 * to s->stats_out (host memory) at its offset. NULL without statistics. */
LLVMValueRef emit_stats(Host *h, Sched *S) {
    const PlanMemory *m = &h->plan->mem;
    if (m->nstats == 0) return NULL;
    const FuseResult *r = S->r;
    HostFn f = host_fn_begin(h, "forward_stats");
    LLVMValueRef s = f.s;
    /* The key of the forward it precedes: in the step's pass (s->training 1) forward_backward's,
     * so a statistic after dropout or training() is the one the step uses; in evaluation's (0)
     * forward_loss's. */
    if (S->mem->rng_offset >= 0)
        emit_rng_key(
            h, &f, S,
            LLVMBuildZExt(h->b,
                          LLVMBuildICmp(h->b, LLVMIntNE, step_field(h, s, RT_STEP_training, h->i64, "training"), ci64(h, 0), ""),
                          h->i64, "on"));
    LLVMValueRef *addr = sched_addrs(h, S, s);
    emit_launches_kept(h, &f, S, addr, m->stats_last, m->stats_keep, &h->plan->mem.gather[PLAN_GATHER_STATS]);
    LLVMValueRef out = step_field(h, s, RT_STEP_stats_out, h->ptr, "stats_out");
    for (int k = 0; k < m->nstats; k++) {
        int b = r->node_buffer[r->g->stat_expr[k]];
        if (b < 0 || r->buffers[b].dt != DT_F32) INTERNAL("host: statistic %d has no f32 buffer", k);
        h->target->copy(h, &f, byte_gep(h, out, m->stat_offset[k], ""), addr[b], graph_numel(r->g->node[r->g->stat_in[k]]), 1);
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* forward_logits(s): the logits schedule on s->x, then s->logits[0, V) = logits[len - 1, 0, V). */
LLVMValueRef emit_logits(Host *h, Sched *S, int node, int64_t vocab) {
    FuseResult *r = S->r;
    HostFn f = host_fn_begin(h, "forward_logits");
    LLVMValueRef s = f.s;
    LLVMValueRef *addr = sched_addrs(h, S, s);
    int lb = r->node_buffer[node];
    if (lb < 0) INTERNAL("host: the logits %%%d have no buffer", node);
    emit_launches(h, &f, S, addr, r->nlaunches - 1, NULL);
    LLVMValueRef len = step_field(h, s, RT_STEP_len, h->i64, "len");
    LLVMValueRef first = LLVMBuildMul(h->b, LLVMBuildSub(h->b, len, ci64(h, 1), ""), ci64(h, vocab), "last_row");
    LLVMValueRef src = LLVMBuildInBoundsGEP2(h->b, h->f32, addr[lb], &first, 1, "last_logits");
    h->target->copy(h, &f, step_field(h, s, RT_STEP_logits, h->ptr, "logits"), src, vocab, 1);
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* Whether the update schedule S can run on a range [lo, hi) of the parameter region (ZeRO,
 * RtStep.lo/hi): every launch an elementwise kernel over the n elements of the flat update vectors
 * (one work item per element, so a range of work items is the same arithmetic on those
 * elements), every state buffer one whole variable, every move a whole vector. Else why not. */
const char *update_range_refusal(const Plan *plan, const FuseResult *r, const PlanPhaseMem *mem, Arena *ar) {
    const GraphUpdate *u = plan->update->update;
    int64_t n = u->n;
    for (int li = 0; li < r->nlaunches; li++) {
        const FuseLaunch *L = &r->launches[li];
        if (L->kind == FL_GEMM) return "its update has a matrix product";
        const Kernel *k = r->kernels[L->kernel];
        if (k->kind != KK_ELEMENTWISE || k->grid != n)
            return arena_printf(ar, "its update has a %s kernel over %lld work items, not one per element",
                                kir_kind_name(k->kind), (long long)k->grid);
    }
    for (int i = 0; i < r->nbuffers; i++) {
        const PlanSlot *sl = &mem->slots[i];
        if (sl->home == PH_STATE && (sl->bytes != n * 4 || sl->offset % (n * 4) != 0))
            return "its optimizer state is not one vector a variable";
        if (sl->home == PH_PCAST) { /* cast(p_new): element i at byte 2i, as the work items run */
            if (sl->offset != 0 || sl->bytes != n * 2) return "its update writes parameter casts that are not one vector";
            continue;
        }
        if (sl->home != PH_NONE && sl->bytes != n * 4 && sl->bytes != 4 && sl->home != PH_ARENA)
            return "its update reads a region that is not one vector";
    }
    for (int i = 0; i < mem->nwrites; i++) {
        const PlanWrite *w = &mem->writes[i];
        if (w->bytes != n * 4 || w->offset % (n * 4) != 0 || mem->slots[w->buffer].home != PH_ARENA)
            return "its update's results are not whole vectors";
    }
    if (plan->mem.param_bytes != n * 4 || plan->mem.state_bytes != (int64_t)u->nstate * n * 4)
        return "its optimizer state is not one vector a variable";
    return NULL;
}

/* optimizer_update on [lo, hi) (RtStep; hi = 0: the whole region): every kernel over those work
 * items (the target's launch_range: the CPU's pool, the GPU's kernels take lo and hi), with the
 * regions' addresses as they are (work item = element) except the state's, whose variable j starts
 * at state + j x stride - lo so that element lo + k is at j x stride + k, stride being
 * RtStep.state_stride, or hi - lo when that is 0 (each variable's [lo, hi) in turn: ZeRO's shard, a
 * store's chunk); then the moves of [lo, hi). */
static void emit_update_ranged(Host *h, HostFn *f, Sched *S, LLVMValueRef *addr) {
    const GraphUpdate *u = h->plan->update->update;
    const FuseResult *r = S->r;
    LLVMValueRef s = f->s, n = ci64(h, u->n);
    LLVMValueRef lo = step_field(h, s, RT_STEP_lo, h->i64, "lo"), hi = step_field(h, s, RT_STEP_hi, h->i64, "hi");
    LLVMValueRef whole = LLVMBuildICmp(h->b, LLVMIntEQ, hi, ci64(h, 0), "");
    lo = LLVMBuildSelect(h->b, whole, ci64(h, 0), lo, "lo");
    hi = LLVMBuildSelect(h->b, whole, n, hi, "hi");
    LLVMValueRef len = LLVMBuildSub(h->b, hi, lo, "len");
    LLVMValueRef given = step_field(h, s, RT_STEP_state_stride, h->i64, "state_stride");
    LLVMValueRef stride = LLVMBuildSelect(h->b, LLVMBuildICmp(h->b, LLVMIntEQ, given, ci64(h, 0), ""), len, given, "stride");
    LLVMValueRef state = step_field(h, s, RT_STEP_state, h->ptr, "state");
    for (int i = 0; i < r->nbuffers; i++) {
        const PlanSlot *sl = &S->mem->slots[i];
        if (sl->home != PH_STATE) continue;
        LLVMValueRef at = LLVMBuildSub(h->b, LLVMBuildMul(h->b, ci64(h, sl->offset / (u->n * 4)), stride, ""), lo, "");
        addr[i] = LLVMBuildGEP2(h->b, h->f32, state, &at, 1, "state_var");
    }
    for (int li = 0; li < r->nlaunches; li++) {
        const Kernel *k = r->kernels[r->launches[li].kernel];
        LLVMValueRef *bufs = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(k->nbufs + 1));
        for (int i = 0; i < k->nbufs; i++) bufs[i] = addr[k->bufs[i].buffer];
        h->target->launch_range(h, f, S, r->launches[li].kernel, bufs, lo, hi);
    }
    LLVMValueRef region[PH_PCAST + 1] = {NULL};
    region[PH_PARAMS] = step_field(h, s, RT_STEP_params, h->ptr, "params");
    region[PH_STATE] = state;
    for (int i = 0; i < S->mem->nwrites; i++) {
        const PlanWrite *w = &S->mem->writes[i];
        if (w->accumulate || !region[w->to]) INTERNAL("host: the update's move '%s'", w->what);
        LLVMValueRef src = LLVMBuildGEP2(h->b, h->f32, addr[w->buffer], &lo, 1, "");
        LLVMValueRef at = w->to == PH_STATE ? LLVMBuildMul(h->b, ci64(h, w->offset / (u->n * 4)), stride, "")
                                            : LLVMBuildAdd(h->b, ci64(h, w->offset / 4), lo, "");
        h->target->copy_n(h, f, LLVMBuildGEP2(h->b, h->f32, region[w->to], &at, 1, ""), src, len);
    }
}

/* forward_chunk(s): the chunk schedule on s->x (kv.rows new tokens), s->kv (the metadata) and
 * s->kv_pool (which its attention kernels read and write), then the logits of the rows it uses
 * (RtStep.len) into s->logits: on the GPU one download of len x vocab floats, not of every row (a
 * decode of one sequence moves 1/rows of the bytes). */
LLVMValueRef emit_chunk(Host *h, Sched *S, int node, int64_t rows, int64_t vocab) {
    FuseResult *r = S->r;
    HostFn f = host_fn_begin(h, "forward_chunk");
    LLVMValueRef s = f.s;
    LLVMValueRef *addr = sched_addrs(h, S, s);
    int lb = r->node_buffer[node];
    if (lb < 0) INTERNAL("host: the chunk's logits %%%d have no buffer", node);
    h->kv_pool = step_field(h, s, RT_STEP_kv_pool, h->ptr, "kv_pool");
    /* the rows used: RtStep.len, or all of them when it is outside [1, rows] */
    LLVMValueRef len = step_field(h, s, RT_STEP_len, h->i64, "len");
    LLVMValueRef ok = LLVMBuildAnd(h->b, LLVMBuildICmp(h->b, LLVMIntSGE, len, ci64(h, 1), ""),
                                   LLVMBuildICmp(h->b, LLVMIntSLE, len, ci64(h, rows), ""), "");
    h->chunk_len = LLVMBuildSelect(h->b, ok, len, ci64(h, rows), "rows");
    h->chunk_rows = rows;
    const Graph *g = r->g;
    unsigned char *dep = arena_alloc(h->ar, (size_t)g->n + 1);
    for (int i = 0; i < g->n; i++) { /* inputs come before their users */
        const GNode *n = graph_node(g, i);
        dep[i] = n->op == G_INPUT;
        for (int k = 0; k < n->nin && !dep[i]; k++) dep[i] = dep[n->in[k]];
    }
    h->chunk_dep = dep;
    emit_launches(h, &f, S, addr, r->nlaunches - 1, NULL);
    LLVMValueRef used = LLVMBuildMul(h->b, h->chunk_len, ci64(h, vocab), "logit_floats");
    h->kv_pool = NULL;
    h->chunk_len = NULL;
    h->chunk_dep = NULL;
    LLVMValueRef out = step_field(h, s, RT_STEP_logits, h->ptr, "logits");
    if (h->target == &host_target_gpu) { /* rt_gpu_download: the copy, then the wait */
        LLVMValueRef a[5] = {f.exec, out, addr[lb], LLVMBuildMul(h->b, used, ci64(h, 4), "logit_bytes"), f.err};
        emit_check(h, f.fn, LLVMBuildCall2(h->b, h->gpu_copy_t, h->gpu_download, a, 5, ""));
    } else {
        h->target->copy_n(h, &f, out, addr[lb], used);
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* optimizer_update: lr and t into the plan's arena slots, the update schedule's launches over the
 * parameter, gradient and state regions, then the plan's moves: the new parameters and state
 * that were not written in place (fuse.c's fz_update_in_place) copied into their regions. When
 * the update allows it (update_range_refusal), over RtStep's [lo, hi) (emit_update_ranged), on the
 * CPU and the GPU alike. */
LLVMValueRef emit_update(Host *h, Sched *S) {
    const PlanMemory *m = &h->plan->mem;
    HostFn f = host_fn_begin(h, "optimizer_update");
    LLVMValueRef s = f.s;
    LLVMValueRef arena = step_field(h, s, RT_STEP_arena, h->ptr, "arena");
    /* lr and t as f32 in the plan's slots, written by the host (staged on the GPU, then uploaded) */
    if (m->t_offset != m->lr_offset + 4) INTERNAL("host: the plan's lr and t slots are not adjacent");
    LLVMValueRef slots = byte_gep(h, arena, m->lr_offset, "lr_slot");
    LLVMValueRef host_slots = h->target->staging(h, slots, 2, "lr_t_host");
    LLVMBuildStore(h->b, LLVMBuildFPTrunc(h->b, step_field(h, s, RT_STEP_lr, h->f64, "lr"), h->f32, ""), host_slots);
    LLVMValueRef t_host = byte_gep(h, host_slots, 4, "");
    LLVMBuildStore(h->b, LLVMBuildSIToFP(h->b, step_field(h, s, RT_STEP_t, h->i64, "t"), h->f32, ""), t_host);
    h->target->upload(h, &f, slots, host_slots, 2);
    LLVMValueRef *addr = sched_addrs(h, S, s);
    /* ranged whenever it can be, not only with zero > 0: the same code at any zero setting, so the
     * program hash (and a checkpoint) does not change with it (host_schedules marks the kernels) */
    if (S->r->nkernels > 0 && S->r->kernels[0]->ranged) {
        emit_update_ranged(h, &f, S, addr);
        LLVMBuildRet(h->b, ci32(h, 0));
        return f.fn;
    }
    emit_launches(h, &f, S, addr, S->r->nlaunches - 1, NULL);
    LLVMValueRef region[PH_PCAST + 1] = {NULL};
    region[PH_PARAMS] = step_field(h, s, RT_STEP_params, h->ptr, "params");
    region[PH_STATE] = step_field(h, s, RT_STEP_state, h->ptr, "state");
    for (int i = 0; i < S->mem->nwrites; i++) {
        const PlanWrite *w = &S->mem->writes[i];
        if (w->accumulate || !region[w->to]) INTERNAL("host: the update's move '%s'", w->what);
        h->target->copy(h, &f, byte_gep(h, region[w->to], w->offset, ""), addr[w->buffer], w->bytes / 4, 0);
    }
    LLVMBuildRet(h->b, ci32(h, 0));
    return f.fn;
}

/* optimizer_init: each state variable's initial value over every segment the update holds (the
 * frozen parameters have no state; padding stays 0); NULL when every one starts at 0 (the runtime
 * zeroes the region). The state region is nstate parts of the update's length n. */
static LLVMValueRef emit_optimizer_init(Host *h, const GraphUpdate *u) {
    int any = 0;
    for (int j = 0; j < u->nstate; j++) any |= u->state_init[j] != 0;
    if (!any) return NULL;
    LLVMValueRef fn = begin_fn(h, "optimizer_init", h->i32);
    LLVMValueRef state = step_field(h, LLVMGetParam(fn, 0), RT_STEP_state, h->ptr, "state");
    for (int j = 0; j < u->nstate; j++)
        for (int i = 0; i < u->nsegs && u->state_init[j] != 0; i++)
            if (u->seg_off[i] < u->n)
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
                    L->gemm.trans_a || L->gemm.trans_b
                        ? (L->gemm.trans_a ? (L->gemm.trans_b ? ", A^T B^T" : ", A^T B") : ", A B^T")
                        : "",
                    L->gemm.epilogue == FE_NONE ? ""
                                                : arena_printf(h->ar,
                                                               L->gemm.epilogue == FE_BIAS  ? " + bias %s"
                                                               : L->gemm.epilogue == FE_ADD ? " + %s"
                                                                                            : ", B's column sums into %s",
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

/* ---- the driver ---------------------------------------------------------------------------------- */

/* The settings that executables do not carry out yet (the plan's notes say the same): each is an
 * error at its value, until the issue that implements it lands. Returns the number refused. */
static int refuse_settings(const TrainConfig *ts, int narch) {
    static const char *const par[4] = {"tensor", "pipeline", "sequence", "expert"};
    const int64_t deg[4] = {ts->tensor_par, ts->pipeline_par, ts->sequence_par, ts->expert_par};
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (deg[i] > 1) {
            diag_error(ts->par_at[i],
                       "parallel.%s = %lld is not carried out by executables yet: each rank would hold the whole model", par[i],
                       (long long)deg[i]);
            n++;
        }
    /* zero = 1, 2 and 3 are carried out by both builds (docs/parallel.md, ZeRO) */
    /* offload.optimizer is carried out (host_compile's offload_refusals checks the rest) */
    /* offload.activations = nvme is carried out by every build (a GPU build through pinned staging);
     * = host on a GPU build (copies to pinned host memory on a copy stream): on the CPU the
     * activations are in host memory already, so there it would do nothing */
    if (ts->offload_activations == STORE_HOST && narch == 0) {
        diag_error(ts->offload_at[0], "offload.activations = host copies the activations off the GPU, but this build is for "
                                      "the CPU alone, where they are in host memory already");
        n++;
    }
    if (n)
        diag_hint("executables carry out parallel { data = N } and no other parallelism, recompute, and offload (activations "
                  "= host on a GPU build: --cuda-arch); remove %s to build (--check and --emit=plan accept %s)",
                  n == 1 ? "it" : "them", n == 1 ? "it" : "them");
    return n;
}

int host_refuses(const TrainBuild *tb, int narch) {
    if (refuse_settings(tb->config, narch)) return 1;
    if (tb->config->nbuckets && tb->step) {
        /* a bucket's windows share the step's rows of seq tokens; only attention's pos mask keeps
         * each window to its own keys (docs/runtime.md, "Sequence-length buckets") */
        const Graph *g = tb->step;
        for (int i = 0; i < g->n; i++) {
            const GNode *n = graph_node(g, i);
            if (n->op != G_ATTENTION || n->nin > 3) continue;
            diag_error(n->src.file ? n->src : tb->config->buckets_at,
                       "batch.buckets needs every attention of the step to be masked by document: this one has no pos");
            if (n->src.file) diag_note(tb->config->buckets_at, "the buckets are here");
            diag_hint("write attention(q, k, v, causal = true, pos = data.pos), so that a window sees only its own tokens");
            return 1;
        }
        /* every other way a row's positions could meet (plan/kv.c's walk of the batch-1 forward) */
        if (tb->forward) {
            Arena ar = {0};
            Span at;
            const char *why = kv_window_local(tb->forward, tb->config->seq, &at, &ar);
            if (why) {
                diag_error(at.file ? at : tb->config->buckets_at,
                           "batch.buckets needs each window of a row kept apart from the others, but here %s", why);
                if (at.file) diag_note(tb->config->buckets_at, "the buckets are here");
                diag_hint("only attention(..., pos = data.pos) may mix positions, and positions come from data.pos "
                          "(docs/runtime.md, \"Sequence-length buckets\")");
            }
            arena_free(&ar);
            if (why) return 1;
        }
    }
    return 0;
}

/* offload.optimizer = nvme: what executables cannot carry out with it, each an error at its value.
 * The update streams the state chunk by chunk (docs/memory.md), which needs the ranged update
 * ZeRO uses; the GPU's update does not take a range, nor ZeRO's shards a store yet. */
static void offload_refusals(Host *h, const Sched *upd, const HostCuda *cuda) {
    const TrainConfig *ts = h->ts;
    /* offload.activations = nvme is carried out by both builds: a GPU build stages the copies through
     * bounded pinned host memory (runtime/gpu/gpu_act.c; docs/memory.md) */
    if (ts->offload_optimizer == STORE_HOST) {
        /* the state off the GPU: a CPU build has it in host memory already, so the setting would do nothing */
        if (!cuda || cuda->narch == 0) {
            diag_error(ts->offload_at[1], "offload.optimizer = host keeps the optimizer state off the GPU, but this build "
                                          "is for the CPU alone, where the state is in host memory already");
            diag_hint("build for a GPU with --cuda-arch (the state then stays in host memory and the CPU updates it), or "
                      "remove the setting");
        }
        return;
    }
    if (ts->offload_optimizer != STORE_NVME) return;
    const char *no_range = h->plan->mem.offload_chunk ? update_range_refusal(h->plan, upd->r, upd->mem, h->ar) : NULL;
    if (no_range) {
        diag_error(ts->offload_at[1], "offload.optimizer = nvme needs an optimizer whose update is elementwise, but %s",
                   no_range);
        diag_hint("the update streams the state through memory a chunk of parameters at a time; remove the setting with "
                  "this optimizer");
    }
    if (ts->zero > 0) {
        diag_error(ts->offload_at[1],
                   "offload.optimizer = nvme with parallel.zero = %lld is not carried out yet: each rank "
                   "would stream its shard of the state",
                   (long long)ts->zero);
        diag_hint("use zero = 0 with offload.optimizer = nvme, or keep the state in memory");
    }
}

int host_compile(const TrainBuild *tb, const Plan *plan, const HostSchedules *schedules, const char *input, const char *output,
                 FILE *emit, const HostCuda *cuda, Arena *ar) {
    CpuTarget target;
    const char *err = NULL;
    if (cpu_target_host(&target, ar, &err)) {
        diag_error_noloc("%s", err);
        return diag_finish();
    }
    Host H = {.ar = ar, .plan = plan, .ts = tb->config, .serve = tb->serve, .target = &host_target_cpu};
    Host *h = &H;
    h->ctx = LLVMContextCreate();
    h->m = cpu_module_new(h->ctx, &target, input);
    h->b = LLVMCreateBuilderInContext(h->ctx);
    host_types(h);

    const HostSchedules hs = *schedules;
    const PlanPhaseMem *pm = plan->mem.phase;
    Sched step = {.prefix = "step_", .r = hs.r[PLAN_STEP], .mem = &pm[PLAN_STEP]};
    Sched upd = {.prefix = "update_", .r = hs.r[PLAN_UPDATE], .mem = &pm[PLAN_UPDATE]};
    Sched lsch = {.prefix = "logits_", .r = hs.n > 2 ? hs.r[PLAN_LOGITS] : NULL, .mem = &pm[PLAN_LOGITS]};
    Sched csch = {.prefix = "chunk_", .r = hs.n > 3 ? hs.r[PLAN_CHUNK] : NULL, .mem = &pm[PLAN_CHUNK]};
    sched_kernels(h, &step, 1);
    sched_kernels(h, &upd, 0);
    LLVMValueRef fb = emit_forward(h, &step, 1), fl = emit_forward(h, &step, 0), fst = emit_stats(h, &step);
    const char *no_range = h->ts->zero > 0 ? update_range_refusal(h->plan, upd.r, upd.mem, h->ar) : NULL;
    if (no_range) {
        diag_error(h->ts->zero_at, "parallel.zero = %lld needs an optimizer whose update is elementwise, but %s",
                   (long long)h->ts->zero, no_range);
        diag_hint("each rank updates its shard of the parameters alone; use zero = 0 with this optimizer");
    }
    offload_refusals(h, &upd, cuda); /* (zero = 3 is carried out by both builds: emit_param_calls) */
    LLVMValueRef ou = emit_update(h, &upd), oi = emit_optimizer_init(h, tb->update->update);
    LLVMValueRef lrs = cpu_scalar_function(h->m, h->ts->lr, "lr_schedule"); /* the schedule sema lowered */
    /* generation: the logits at batch 1 (NULL, with a warning, when the model has none) */
    LLVMValueRef flog = NULL;
    if (lsch.r) {
        sched_kernels(h, &lsch, 1);
        flog = emit_logits(h, &lsch, hs.logits_node, plan->sched.vocab);
    }
    /* the forward over new tokens with the KV cache (NULL when the model cannot use it: kv.c) */
    LLVMValueRef fchunk = NULL;
    if (csch.r) {
        sched_kernels(h, &csch, 1);
        fchunk = emit_chunk(h, &csch, hs.chunk_node, plan->sched.kv.rows, plan->sched.vocab);
    }
    /* the hash covers the CPU functions alone: the GPU ones compute the same step, and a checkpoint
     * resumes on either device */
    const char *hash = diag_error_count() ? NULL : program_hash(h);
    Sched *scheds[4] = {&step, &upd, lsch.r ? &lsch : NULL, csch.r ? &csch : NULL};
    LLVMValueRef gpu = diag_error_count() ? NULL : host_cuda(h, scheds, &hs, cuda, output == NULL);
    if (!diag_error_count()) emit_descriptor(h, input, fb, fl, flog, fst, fchunk, oi, ou, lrs, hash, tb->update->update, gpu);
    int rc;
    if (!diag_error_count() && !output) {
        if (cpu_verify(h->m, ar, &err)) INTERNAL("the program's LLVM module fails LLVMVerifyModule: %s", err);
        const Graph *graphs[4] = {tb->step, tb->update, hs.n > 2 ? hs.g[2] : NULL, hs.n > 3 ? hs.g[3] : NULL};
        const Sched *all[4] = {scheds[0], scheds[1], scheds[2], csch.r ? &csch : NULL};
        print_program(h, emit, all, graphs, 4);
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

int host_schedules(const Plan *plan, HostSchedules *out, Arena *ar) {
    *out = plan->sched;
    for (int i = 0; i < out->n; i++)
        for (int k = 0; k < out->r[i]->nkernels; k++)
            out->r[i]->kernels[k]->name = arena_printf(ar, "%s%s", out->prefix[i], out->r[i]->kernels[k]->name);
    /* the update runs on a range of the parameter region whenever it can, at any parallel.zero (the
     * same kernels, so the program hash does not change with it): the GPU's kernels take the range */
    const FuseResult *u = out->r[PLAN_UPDATE];
    if (!update_range_refusal(plan, u, &plan->mem.phase[PLAN_UPDATE], ar))
        for (int k = 0; k < u->nkernels; k++) u->kernels[k]->ranged = 1;
    plan_warn_no_logits(out, plan->name);
    plan_warn_lora_unfused(out, plan->name);
    return diag_error_count() ? 1 : 0;
}
