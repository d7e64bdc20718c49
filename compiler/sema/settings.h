/* settings.h - what sema settles about a train or serve block, for the stages after it.
 *
 * Pipeline position: sema (settings.c checks the blocks) -> [these numbers] -> plan, host code.
 * Plain numbers, strings and source spans (for the later stages' messages): nothing here points
 * into the syntax tree or sema's values, so a stage after sema needs no part of sema's insides.
 * sema.h's TrainBuild carries a train block's TrainConfig with its graphs. */
#ifndef MBT_SETTINGS_H
#define MBT_SETTINGS_H

#include <stdint.h>

#include "diag.h"

typedef struct ScalarProg ScalarProg; /* scalar.h: the learning-rate schedule, lowered */

typedef enum Precision { PREC_F32, PREC_BF16, PREC_F16 } Precision;
typedef enum Storage { STORE_NONE, STORE_HOST, STORE_NVME } Storage;
typedef enum PipeSchedule { PIPE_1F1B, PIPE_GPIPE } PipeSchedule;
typedef enum KvDtype { KV_F32, KV_BF16, KV_F16, KV_FP8 } KvDtype;

enum { /* TrainConfig.recompute bits */
       RECOMPUTE_GELU = 1,
       RECOMPUTE_LAYERNORM = 2,
       RECOMPUTE_ATTENTION = 4,
       RECOMPUTE_MLP = 8,
       RECOMPUTE_ALL = 16,
};

typedef struct RampStep {
    int64_t step, global, accumulation; /* from `step` on, the global batch and its accumulation */
} RampStep;

/* One stage of a sequence-length curriculum: from `step` on, the lengths lens[0..n) in turn, one a
 * step (n = 1: a single length). */
typedef struct CurriculumStage {
    int64_t step;
    int64_t *lens;
    int n;
} CurriculumStage;

typedef struct TrainConfig {
    const char *name;
    Span at;                   /* the block's name: where messages about the whole block point */
    Span lr_at;                /* the `lr` setting's value (at when there is none) */
    const char *schedule_text; /* "lr.cosine(step, warmup = 20, total = 400, min_ratio = 0.1)", NULL: none */
    const ScalarProg *lr;      /* the schedule lowered (scalar.h); the constant 1.0 without `lr` */
    int lr_batch;              /* a factor of the schedule reads the global batch (lr.batch_scale) */
    /* tokens(PATH) or tokens([PATH_A, PATH_B, ...]): several data sets (one per adapter of
     * nn.MultiLoRALinear), the globs one a line, each micro-batch's rows dealt out in equal
     * contiguous blocks, block n from data set n (docs/runtime.md, "Several data sets") */
    const char *data_glob, *val_glob;
    int64_t data_sets; /* 1, or the length of the list */
    Span data_sets_at;
    int shuffle;
    int64_t seq;
    /* tokens(..., docs = EOT): the token id that ends each document (-1: no documents). The
     * runtime then packs documents into the micro-batch's rows and data.pos holds each token's
     * position in its document (docs/runtime.md, "Documents and packing"). */
    int64_t docs; /* -2 after an error in docs = ... (the block then builds nothing) */
    Span docs_at;
    /* batch { buckets = [...], curriculum = [...] }: sequence-length buckets and the curriculum
     * that picks one per step (docs/runtime.md, "Sequence-length buckets"). Stage i runs from
     * step curriculum[i].step on, cycling over its lengths one a step; without `curriculum` one
     * stage from step 0 cycles over every bucket. nbuckets 0: none (every step is seq long). */
    int64_t *buckets;
    int nbuckets;
    Span buckets_at;
    CurriculumStage *curriculum;
    int ncurriculum;
    int64_t global, micro, tokens, accumulation; /* tokens = 0 when micro is fixed */
    RampStep *ramp;
    int nramp;
    int64_t data_par, tensor_par, pipeline_par, sequence_par, expert_par, zero;
    /* the values of the settings that executables do not carry out yet (host_refuses points at
     * them): parallel.tensor, pipeline, sequence, expert and zero, recompute, offload.activations
     * and offload.optimizer; len 0 where the setting is not given */
    Span par_at[4], zero_at, recompute_at, offload_at[2];
    PipeSchedule schedule;
    int64_t blocks; /* length of the model's longest list of sub-models */
    Precision precision;
    unsigned recompute;
    Storage offload_activations, offload_optimizer;
    /* offload.activations: the copies' assumed rate in GB/s (mbtc --offload-gbps, set by the
     * pipeline after sema; 0: the plan's default for host or nvme, plan_offload.c) */
    double offload_gbps;
    /* offload.activations: the build is for a GPU (--cuda-arch other than none; set by the pipeline
     * after sema): its launches are timed at a GPU's rate, nvme's copies go through pinned staging */
    int offload_gpu;
    /* parallel.zero = 3: the bytes of a page the gathers map (mbtc --zero3-page, set by the pipeline
     * after sema): the CPU's 4096, a GPU build's allocation granularity (2 MiB by default); the
     * plan groups its gathers by it and counts its window in it (plan_gather.c) */
    int64_t zero3_page;
    int64_t ckpt_every, ckpt_keep; /* ckpt_every = 0: no checkpoints */
    const char *ckpt_dir;
    int ckpt_continue_on_error;
    /* the model's nn.LoRALinear / MultiLoRALinear adapters (groups.c): PEFT's adapter_config.json
     * and the layers' dotted paths one a line with their adapter counts, for --save-adapter; NULL
     * when the model has none (config NULL and modules "": they have no PEFT form) */
    const char *adapter_config, *adapter_modules;
    int64_t eval_every, eval_steps; /* eval_every = 0: no evaluation */
    int64_t steps, seed;
    double clip;
} TrainConfig;

/* The window length of 0-based step `step`: its curriculum stage's lengths in turn, counted from
 * the stage's first step; seq before the first stage and without buckets. The runtime's
 * rt_train_seq_len computes the same from the program's table. */
static inline int64_t train_seq_at(const TrainConfig *c, int64_t step) {
    const CurriculumStage *st = NULL;
    for (int i = 0; i < c->ncurriculum && c->curriculum[i].step <= step; i++) st = &c->curriculum[i];
    return st && st->n > 0 ? st->lens[(step - st->step) % st->n] : c->seq;
}

typedef struct ServeConfig {
    const char *name;
    Span at; /* the block's name */
    const char *weights;
    int64_t tokens, prefill_chunk, seqs;
    int64_t kv_block;
    double kv_memory;
    KvDtype kv_dtype;
    double temperature, top_p;
    int64_t top_k, max_tokens;
    int64_t port;
    const char *tokenizer; /* path, or NULL: prompts are token ids */
    const char *chat;      /* "chatml" or "llama3", or NULL: no /v1/chat/completions */
} ServeConfig;

#endif
