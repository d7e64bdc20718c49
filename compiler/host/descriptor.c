/* descriptor.c - the `mbt_program` descriptor (RtProgram, runtime/rt_program.h): the train
 * block's settings, the parameter table, the batch-size ramp, the sizes of the regions, the
 * functions, and the program's hash (RtProgram.hash) over the module and the batch settings.
 * Every struct's values are set by field (RT_PROG_hash ...), the indices coming from the field
 * lists the runtime declares the structs from (rt_program_fields.h). */
#include <inttypes.h>
#include <string.h>

#include "diag.h"
#include "graph_pad.h"
#include "host_internal.h"

/* The batch-size ramp: the plan's step programs after the first, one RtRampStage each (the
 * step it starts at, its global batch and accumulation), or a null pointer without a ramp. The
 * micro-batch and the data ranks are the same in every program, so one forward_backward serves
 * them all; only the runtime's loop count and loss_scale change. A stage the block's `steps`
 * never reaches is kept: `--steps` may run past it. */
static LLVMValueRef emit_ramp_table(Host *h) {
    const Plan *p = h->plan;
    int n = p->nprograms - 1;
    if (n < 1) return LLVMConstPointerNull(h->ptr);
    LLVMValueRef *rows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)n);
    for (int i = 0; i < n; i++) {
        const PlanProgram *pg = &p->programs[i + 1];
        if (pg->micro != p->programs[0].micro || pg->data != p->programs[0].data || pg->first_step <= 0 ||
            pg->first_step <= p->programs[i].first_step || pg->global != pg->micro * pg->accumulation * pg->data)
            INTERNAL("host: step program %d (from step %" PRId64 ", global %" PRId64 " = %" PRId64 " x %" PRId64 " x %" PRId64
                     ") does not extend the batch schedule",
                     i + 2, pg->first_step, pg->global, pg->micro, pg->accumulation, pg->data);
        LLVMValueRef f[RT_RAMP_NFIELDS] = {0};
        f[RT_RAMP_step] = ci64(h, pg->first_step);
        f[RT_RAMP_global] = ci64(h, pg->global);
        f[RT_RAMP_accum] = ci64(h, pg->accumulation);
        rows[i] = named_struct(h->ramp_t, f, RT_RAMP_NFIELDS);
    }
    return table_global(h, h->ramp_t, rows, n, "mbt.ramp");
}

/* An i64 array as a private constant global (NULL pointer when empty). */
static LLVMValueRef i64_table(Host *h, const int64_t *v, int n, const char *name) {
    if (n < 1) return LLVMConstPointerNull(h->ptr);
    LLVMValueRef *c = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)n);
    for (int i = 0; i < n; i++) c[i] = ci64(h, v[i]);
    return table_global(h, h->i64, c, n, name);
}

/* The sequence-length curriculum (batch { buckets, curriculum }): per stage its first step, the
 * index of its first length in the lengths' table and their count; the runtime picks step s's
 * length as rt_train_seq_len does (train.c), and the compiler's train_seq_at the same way. */
static void emit_curriculum(Host *h, LLVMValueRef *stages, LLVMValueRef *lens) {
    const TrainConfig *ts = h->ts;
    int nl = 0;
    for (int i = 0; i < ts->ncurriculum; i++) nl += ts->curriculum[i].n;
    int64_t *st = arena_alloc(h->ar, sizeof(int64_t) * (size_t)(3 * ts->ncurriculum + 1));
    int64_t *l = arena_alloc(h->ar, sizeof(int64_t) * (size_t)(nl + 1));
    nl = 0;
    for (int i = 0; i < ts->ncurriculum; i++) {
        const CurriculumStage *c = &ts->curriculum[i];
        st[3 * i] = c->step, st[3 * i + 1] = nl, st[3 * i + 2] = c->n;
        for (int j = 0; j < c->n; j++) l[nl++] = c->lens[j];
    }
    *stages = i64_table(h, st, 3 * ts->ncurriculum, "mbt.curriculum");
    *lens = i64_table(h, l, nl, "mbt.curriculum_lens");
}

/* The curriculum as the hash's text: a checkpoint resumes only under the curriculum it was
 * trained with (the step's windows depend on it). */
static const char *curriculum_text(Host *h) {
    const TrainConfig *ts = h->ts;
    const char *t = "";
    for (int i = 0; i < ts->ncurriculum; i++) {
        t = arena_printf(h->ar, "%s\ncurriculum from=%" PRId64 " lens=", t, ts->curriculum[i].step);
        for (int j = 0; j < ts->curriculum[i].n; j++)
            t = arena_printf(h->ar, "%s%s%" PRId64, t, j ? "," : "", ts->curriculum[i].lens[j]);
    }
    return t;
}

/* The program's hash (RtProgram.hash): the LLVM module as it stands before the descriptor (every
 * kernel and host function, without the source file's name) followed by the batch settings the
 * runtime applies around them. Two compilations of one program hash alike wherever its file lies
 * and however its comments change; a change to the step's computation changes the hash. */
const char *program_hash(Host *h) {
    const Plan *p = h->plan;
    const TrainConfig *ts = h->ts;
    size_t idlen = 0, srclen = 0;
    const char *id0 = LLVMGetModuleIdentifier(h->m, &idlen);
    const char *id = arena_printf(h->ar, "%.*s", (int)idlen, id0);
    const char *src0 = LLVMGetSourceFileName(h->m, &srclen);
    const char *src = arena_printf(h->ar, "%.*s", (int)srclen, src0);
    LLVMSetModuleIdentifier(h->m, "", 0);
    LLVMSetSourceFileName(h->m, "", 0);
    char *ir = LLVMPrintModuleToString(h->m);
    LLVMSetModuleIdentifier(h->m, id, idlen);
    LLVMSetSourceFileName(h->m, src, srclen);
    /* Not the data-parallel degree, nor the accumulation it implies (global / micro / data): the
     * step's computation is one tree over the global batch's micro-batches at any degree
     * (docs/parallel.md), so a checkpoint of N ranks resumes with M. */
    const char *text =
        arena_printf(h->ar,
                     "%s\nbatch micro=%" PRId64 " seq=%" PRId64 " clip=%.17g lr=%.17g "
                     "shuffle=%d vocab=%" PRId64,
                     ir, p->programs[0].micro, p->seq, p->clip, p->has_lr ? p->lr_base : 1.0, ts->shuffle, p->sched.vocab);
    LLVMDisposeMessage(ir);
    for (int i = 0; i < p->nprograms; i++)
        text = arena_printf(h->ar, "%s\nstage from=%" PRId64 " global=%" PRId64, text, p->programs[i].first_step,
                            p->programs[i].global);
    text = arena_printf(h->ar, "%s%s", text, curriculum_text(h));
    for (int i = 0; i < p->step->nrunning; i++) /* what the runtime does after each step */
        text = arena_printf(h->ar, "%s\nrunning %s stat=%d momentum=%.17g", text,
                            graph_node(p->step, p->step->run_param[i])->name, p->step->run_stat[i], p->step->run_momentum[i]);
    char hex[HOST_ABI_CHECKSUM_CHARS + 1];
    host_abi_checksum(text, strlen(text), hex);
    return arena_printf(h->ar, "xxh3-128:%s", hex);
}

/* The parameter table (RtParam rows, "mbt.params"). */
static LLVMValueRef emit_param_table(Host *h) {
    const Plan *p = h->plan;
    const Graph *g = p->step;
    int np = p->mem.nparams, maxr = host_abi_max_rank();
    LLVMValueRef *rows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(np + 1));
    for (int i = 0; i < np; i++) {
        const PlanParam *pp = &p->mem.params[i];
        const GNode *n = graph_node(g, pp->node);
        if (n->rank > maxr) INTERNAL("host: parameter %s has rank %d", pp->name, n->rank);
        LLVMValueRef dims[64];
        /* The program's shape: a padded parameter (graph_pad.h) is its first pp->valid elements. */
        for (int d = 0; d < maxr; d++) dims[d] = ci64(h, d == 0 && n->rank ? graph_param_rows(n) : d < n->rank ? n->shape[d] : 0);
        int init = (int)n->iattr[0]; /* GInit and RtInitKind list the same initialisers in the same order */
        LLVMValueRef f[RT_PARAM_NFIELDS] = {0};
        f[RT_PARAM_name] = str_const(h, pp->name);
        f[RT_PARAM_rank] = ci32(h, n->rank);
        f[RT_PARAM_shape] = LLVMConstArray2(h->i64, dims, (uint64_t)maxr);
        f[RT_PARAM_numel] = ci64(h, pp->valid);
        f[RT_PARAM_offset] = ci64(h, pp->offset / 4);
        f[RT_PARAM_init] = ci32(h, init);
        f[RT_PARAM_init_a] = LLVMConstReal(h->f64, n->fattr[0]);
        f[RT_PARAM_init_b] = LLVMConstReal(h->f64, n->fattr[1]);
        rows[i] = named_struct(h->param_t, f, RT_PARAM_NFIELDS);
    }
    LLVMValueRef table = LLVMAddGlobal(h->m, LLVMArrayType2(h->param_t, (uint64_t)np), "mbt.params");
    LLVMSetInitializer(table, LLVMConstArray2(h->param_t, rows, (uint64_t)np));
    LLVMSetGlobalConstant(table, 1);
    LLVMSetLinkage(table, LLVMPrivateLinkage);
    return table;
}

/* The running statistics' table (RtProgram.running, running_momentum): for each running(buf, x, m)
 * the buffer's offset in the parameter region, its statistic's in the statistics region and its
 * element count (all in f32 elements), and m. */
static void emit_running_table(Host *h, LLVMValueRef *n, LLVMValueRef *table, LLVMValueRef *momentum) {
    const Plan *p = h->plan;
    const Graph *g = p->step;
    int nr = g->nrunning;
    LLVMValueRef *rows = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(3 * nr + 1));
    LLVMValueRef *ms = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(nr + 1));
    for (int i = 0; i < nr; i++) {
        int pi = -1, k = g->run_stat[i];
        for (int j = 0; j < p->mem.nparams; j++)
            if (p->mem.params[j].node == g->run_param[i]) pi = j;
        if (pi < 0 || k < 0 || k >= p->mem.nstats) INTERNAL("host: running statistic %d has no parameter or statistic", i);
        rows[3 * i] = ci64(h, p->mem.params[pi].offset / 4);
        rows[3 * i + 1] = ci64(h, p->mem.stat_offset[k] / 4);
        rows[3 * i + 2] = ci64(h, p->mem.params[pi].numel);
        ms[i] = LLVMConstReal(h->f64, g->run_momentum[i]);
    }
    *n = ci64(h, nr);
    *table = nr ? table_global(h, h->i64, rows, 3 * nr, "mbt.running") : LLVMConstPointerNull(h->ptr);
    *momentum = nr ? table_global(h, h->f64, ms, nr, "mbt.running_momentum") : LLVMConstPointerNull(h->ptr);
}

/* The train block's settings (RtTrainSettings), with the batch-size ramp's table. */
static LLVMValueRef train_settings(Host *h) {
    const Plan *p = h->plan;
    const TrainConfig *ts = h->ts;
    const PlanProgram *pg = &p->programs[0];
    LLVMValueRef ramp = emit_ramp_table(h), curr, curr_lens;
    emit_curriculum(h, &curr, &curr_lens);
    LLVMValueRef f[RT_TRAIN_NFIELDS] = {0};
    f[RT_TRAIN_name] = str_const(h, ts->name);
    f[RT_TRAIN_micro] = ci64(h, pg->micro);
    f[RT_TRAIN_seq] = ci64(h, p->seq);
    f[RT_TRAIN_global] = ci64(h, pg->global);
    f[RT_TRAIN_accum] = ci64(h, pg->accumulation);
    f[RT_TRAIN_steps] = ci64(h, p->steps);
    f[RT_TRAIN_seed] = ci64(h, ts->seed);
    f[RT_TRAIN_clip] = LLVMConstReal(h->f64, p->clip);
    f[RT_TRAIN_vocab] = ci64(h, p->sched.vocab);
    f[RT_TRAIN_ctx] = ci64(h, p->seq);
    f[RT_TRAIN_lr] = LLVMConstReal(h->f64, p->has_lr ? p->lr_base : 1.0);
    f[RT_TRAIN_data] = str_const(h, ts->data_glob);
    f[RT_TRAIN_val_data] = str_const(h, ts->val_glob);
    f[RT_TRAIN_shuffle] = ci32(h, ts->shuffle);
    f[RT_TRAIN_eval_every] = ci64(h, ts->eval_every);
    f[RT_TRAIN_eval_steps] = ci64(h, ts->eval_steps ? ts->eval_steps : 20);
    f[RT_TRAIN_data_ranks] = ci64(h, pg->data);
    f[RT_TRAIN_zero] = ci64(h, ts->zero);
    f[RT_TRAIN_nramp] = ci64(h, p->nprograms - 1);
    f[RT_TRAIN_ramp] = ramp;
    f[RT_TRAIN_ckpt_every] = ci64(h, ts->ckpt_every);
    f[RT_TRAIN_ckpt_dir] = str_const(h, ts->ckpt_dir);
    f[RT_TRAIN_ckpt_keep] = ci64(h, ts->ckpt_keep);
    f[RT_TRAIN_ckpt_continue_on_error] = ci32(h, ts->ckpt_continue_on_error);
    f[RT_TRAIN_docs] = ci64(h, ts->docs);
    f[RT_TRAIN_adapter_config] = str_const(h, ts->adapter_config);
    f[RT_TRAIN_adapter_modules] = str_const(h, ts->adapter_modules);
    f[RT_TRAIN_ncurriculum] = ci64(h, ts->ncurriculum);
    f[RT_TRAIN_curriculum] = curr;
    f[RT_TRAIN_curriculum_lens] = curr_lens;
    f[RT_TRAIN_offload_optimizer] = ci32(h, p->mem.offload_chunk ? STORE_NVME : p->mem.offload_host ? STORE_HOST : 0);
    f[RT_TRAIN_offload_chunk] = ci64(h, p->mem.offload_chunk);
    f[RT_TRAIN_offload_act_bytes] = ci64(h, p->mem.rc.noffloads ? p->mem.rc.store_bytes : 0);
    f[RT_TRAIN_offload_act] = ci32(h, p->mem.rc.noffloads ? p->mem.rc.offload : 0);
    f[RT_TRAIN_offload_gbps] = LLVMConstReal(h->f64, p->mem.rc.noffloads ? p->mem.rc.store_bw / 1e9 : 0);
    return named_struct(h->train_t, f, RT_TRAIN_NFIELDS);
}

/* RtPlanInfo: the plan's summary, phase by phase (PlanPhase and the runtime's RT_PHASE_* agree). */
static LLVMValueRef emit_plan_info(Host *h) {
    const PlanMemory *m = &h->plan->mem;
    if (host_abi_phases() != PLAN_NPHASES)
        INTERNAL("host: %d phases in the runtime, %d in the plan", host_abi_phases(), PLAN_NPHASES);
    LLVMValueRef arena[PLAN_NPHASES], kernels[PLAN_NPHASES], gemms[PLAN_NPHASES];
    for (int i = 0; i < PLAN_NPHASES; i++)
        arena[i] = ci64(h, m->phase[i].peak), kernels[i] = ci64(h, m->phase[i].kernels), gemms[i] = ci64(h, m->phase[i].gemms);
    LLVMValueRef f[RT_PLAN_INFO_NFIELDS] = {NULL};
    f[RT_PLAN_INFO_arena] = LLVMConstArray2(h->i64, arena, PLAN_NPHASES);
    f[RT_PLAN_INFO_kernels] = LLVMConstArray2(h->i64, kernels, PLAN_NPHASES);
    f[RT_PLAN_INFO_gemms] = LLVMConstArray2(h->i64, gemms, PLAN_NPHASES);
    f[RT_PLAN_INFO_input_bytes] = ci64(h, m->input_bytes);
    f[RT_PLAN_INFO_gather_window] = ci64(h, m->gather_window);
    f[RT_PLAN_INFO_gather_units] = ci64(h, m->gather_units);
    f[RT_PLAN_INFO_gather_page] = ci64(h, m->gather_page);
    f[RT_PLAN_INFO_gather_window_pages] = ci64(h, m->gather_window_pages);
    return named_struct(h->plan_t, f, RT_PLAN_INFO_NFIELDS);
}

void emit_descriptor(Host *h, const char *source, LLVMValueRef fb, LLVMValueRef fl, LLVMValueRef flog, LLVMValueRef fst,
                     LLVMValueRef fchunk, LLVMValueRef oinit, LLVMValueRef oupd, LLVMValueRef lrs, const char *hash,
                     const GraphUpdate *u, LLVMValueRef gpu) {
    const Plan *p = h->plan;
    LLVMValueRef fn0 = begin_fn(h, "mbt.strings", h->vd); /* a builder position for global strings */
    LLVMValueRef table = emit_param_table(h), train = train_settings(h);
    LLVMValueRef ge[RT_GEN_NFIELDS] = {0};
    /* The serve block of the train block's model (TrainBuild.serve), else sema's defaults for a
     * serve block (settings.c) with 64 tokens for generate. */
    static const char *const kv_dtypes[] = {"f32", "bf16", "f16", "fp8"};
    const ServeConfig *sv = h->serve;
    ge[RT_GEN_weights] = sv && sv->weights ? str_const(h, sv->weights) : LLVMConstPointerNull(h->ptr);
    ge[RT_GEN_temperature] = LLVMConstReal(h->f64, sv ? sv->temperature : 1.0);
    ge[RT_GEN_top_k] = ci64(h, sv ? sv->top_k : 0);
    ge[RT_GEN_max_tokens] = ci64(h, sv ? sv->max_tokens : 64);
    ge[RT_GEN_top_p] = LLVMConstReal(h->f64, sv ? sv->top_p : 1.0);
    ge[RT_GEN_name] = sv ? str_const(h, sv->name) : LLVMConstPointerNull(h->ptr);
    ge[RT_GEN_batch_tokens] = ci64(h, sv ? sv->tokens : 2048);
    ge[RT_GEN_prefill_chunk] = ci64(h, sv ? sv->prefill_chunk : 512);
    ge[RT_GEN_batch_seqs] = ci64(h, sv ? sv->seqs : 128);
    ge[RT_GEN_kv_block] = ci64(h, sv ? sv->kv_block : 16);
    ge[RT_GEN_kv_memory] = LLVMConstReal(h->f64, sv ? sv->kv_memory : 0.9);
    ge[RT_GEN_kv_dtype] = str_const(h, kv_dtypes[sv ? (int)sv->kv_dtype : (int)KV_BF16]);
    ge[RT_GEN_port] = ci64(h, sv ? sv->port : 8000);
    ge[RT_GEN_tokenizer] = sv && sv->tokenizer ? str_const(h, sv->tokenizer) : LLVMConstPointerNull(h->ptr);
    ge[RT_GEN_chat] = sv && sv->chat ? str_const(h, sv->chat) : LLVMConstPointerNull(h->ptr);
    LLVMValueRef null = LLVMConstPointerNull(h->ptr);
    LLVMValueRef *names = arena_alloc(h->ar, sizeof(LLVMValueRef) * (size_t)(u->nstate + 1));
    for (int j = 0; j < u->nstate; j++) names[j] = str_const(h, u->state_name[j]);
    LLVMValueRef state_names = table_global(h, h->ptr, names, u->nstate, "mbt.state_names");
    LLVMValueRef f[RT_PROG_NFIELDS] = {0};
    f[RT_PROG_abi_version] = ci32(h, host_abi_version());
    f[RT_PROG_source] = str_const(h, source);
    f[RT_PROG_train] = train;
    f[RT_PROG_generate] = named_struct(h->gen_t, ge, RT_GEN_NFIELDS);
    f[RT_PROG_params] = table;
    f[RT_PROG_nparams] = ci64(h, p->mem.nparams);
    f[RT_PROG_param_floats] = ci64(h, p->mem.param_bytes / 4);
    f[RT_PROG_state_floats] = ci64(h, p->mem.state_bytes / 4);
    f[RT_PROG_arena_bytes] = ci64(h, p->mem.arena_bytes);
    f[RT_PROG_pcast_bytes] = ci64(h, p->mem.pcast_bytes);
    f[RT_PROG_logits_seq] = ci64(h, p->seq);
    f[RT_PROG_forward_backward] = fb;
    f[RT_PROG_forward_loss] = fl ? fl : null;
    f[RT_PROG_forward_logits] = flog ? flog : null;
    f[RT_PROG_optimizer_init] = oinit ? oinit : null;
    f[RT_PROG_optimizer_update] = oupd;
    f[RT_PROG_lr_schedule] = lrs;
    f[RT_PROG_hash] = str_const(h, hash);
    f[RT_PROG_nstate] = ci64(h, u->nstate);
    f[RT_PROG_state_names] = state_names;
    f[RT_PROG_gpu] = gpu ? gpu : null;
    f[RT_PROG_plan] = emit_plan_info(h);
    f[RT_PROG_stat_floats] = ci64(h, p->mem.stat_bytes / 4);
    f[RT_PROG_forward_stats] = fst ? fst : null;
    f[RT_PROG_forward_chunk] = fchunk ? fchunk : null;
    emit_running_table(h, &f[RT_PROG_nrunning], &f[RT_PROG_running], &f[RT_PROG_running_momentum]);
    const PlanSchedules *s = &p->sched;
    LLVMValueRef kv[RT_KV_INFO_NFIELDS] = {0};
    int have = fchunk != NULL;
    kv[RT_KV_INFO_rows] = ci64(h, have ? s->kv.rows : 0);
    kv[RT_KV_INFO_block] = ci64(h, have ? s->kv.block : 0);
    kv[RT_KV_INFO_max_blocks] = ci64(h, have ? s->kv.max_blocks : 0);
    kv[RT_KV_INFO_layers] = ci64(h, have ? s->chunk.layers : 0);
    kv[RT_KV_INFO_heads] = ci64(h, have ? s->chunk.heads_kv : 0);
    kv[RT_KV_INFO_head_dim] = ci64(h, have ? s->chunk.head_dim : 0);
    kv[RT_KV_INFO_dtype_bytes] = ci64(h, have ? dtype_size(s->kv.kv_dt) : 0);
    kv[RT_KV_INFO_bytes_per_token] = ci64(h, have ? s->chunk.bytes_per_token : 0);
    kv[RT_KV_INFO_meta_bytes] = ci64(h, have ? s->chunk.meta_bytes : 0);
    f[RT_PROG_kv] = named_struct(h->kv_t, kv, RT_KV_INFO_NFIELDS);
    LLVMBuildRetVoid(h->b);
    LLVMDeleteFunction(fn0);
    LLVMValueRef desc = LLVMAddGlobal(h->m, h->prog_t, "mbt_program");
    LLVMSetInitializer(desc, named_struct(h->prog_t, f, RT_PROG_NFIELDS));
    LLVMSetGlobalConstant(desc, 1);
}
