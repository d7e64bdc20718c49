/* rt_program_fields.h - the field lists of the program ABI's structs (rt_program.h), one X-macro
 * per struct, in declaration order. Each entry is X(C type, name, machine type); the machine type
 * is how the compiler's host code lays the field out in LLVM: ptr, i32, i64, f64, dims (an int64
 * array of RT_ST_MAX_RANK), phases (an int64 array of RT_NPHASES), or train / generate / plan /
 * kvinfo (the nested structs).
 *
 * Three readers share each list, so they cannot drift apart: rt_program.h declares the structs
 * from it; compiler/host/host_abi.c takes offsetof and sizeof of every field from it; the host code
 * (compiler/host/host_internal.h) builds the LLVM struct types and an enum of field indices
 * (RT_STEP_gpu, RT_PROG_hash ...) from it, which its emitters use instead of bare numbers.
 *
 * This header includes nothing and names types only inside the macros, so the compiler may include
 * it without the runtime's headers. Adding, removing or reordering a field changes the ABI:
 * raise RT_ABI_VERSION (rt_program.h). */
#ifndef MBT_RT_PROGRAM_FIELDS_H
#define MBT_RT_PROGRAM_FIELDS_H

/* RtParam: one parameter of the model, as the checkpoint names it. */
#define RT_PARAM_FIELDS(X)                                                                                                       \
    X(const char *, name, ptr) /* dotted path: "h.3.attn.c_attn.weight" (the safetensors name) */                                \
    X(int, rank, i32)          /* 0..RT_ST_MAX_RANK */                                                                           \
    X(RtDims, shape, dims)     /* dims 0..rank-1 */                                                                              \
    X(int64_t, numel, i64)     /* product of shape (1 for a scalar) */                                                           \
    X(int64_t, offset, i64)    /* first element in the parameter region (and the gradient region) */                             \
    X(RtInitKind, init, i32)   /* its initialiser (rt_init_param) */                                                             \
    X(double, init_a, f64)     /* normal: mean; uniform: low; constant: the value */                                             \
    X(double, init_b, f64)     /* normal: std; uniform: high */

/* RtRampStage: one stage of a batch-size ramp. */
#define RT_RAMP_FIELDS(X)                                                                                                        \
    X(int64_t, step, i64)   /* 0-based optimizer step the stage starts at */                                                     \
    X(int64_t, global, i64) /* sequences per optimizer step */                                                                   \
    X(int64_t, accum, i64)  /* micro-batches per step and data-parallel rank */

/* RtTrainSettings: a train block's settings. */
#define RT_TRAIN_FIELDS(X)                                                                                                       \
    X(const char *, name, ptr)        /* the train block's name (`./prog train NAME`) */                                         \
    X(int64_t, micro, i64)            /* B: sequences per micro-batch */                                                         \
    X(int64_t, seq, i64)              /* T: tokens per sequence */                                                               \
    X(int64_t, global, i64)           /* sequences per optimizer step from step 0: micro x accum x data_ranks */                 \
    X(int64_t, accum, i64)            /* micro-batches per optimizer step and data-parallel rank, from step 0 */                 \
    X(int64_t, steps, i64)            /* optimizer steps */                                                                      \
    X(uint64_t, seed, i64)            /* initialisation, data order, dropout */                                                  \
    X(double, clip, f64)              /* global gradient-norm clip; 0: none */                                                   \
    X(int64_t, vocab, i64)            /* token ids are below this */                                                             \
    X(int64_t, ctx, i64)              /* the model's longest context (positions) */                                              \
    X(double, lr, f64)                /* the optimizer's base learning rate */                                                   \
    X(const char *, data, ptr)        /* glob of the training shards */                                                          \
    X(const char *, val_data, ptr)    /* glob of the held-out shards; NULL: hold out the tail of `data` */                       \
    X(int, shuffle, i32)              /* 1: seeded shuffle of the training windows each epoch */                                 \
    X(int64_t, eval_every, i64)       /* evaluate every N steps during training; 0: never */                                     \
    X(int64_t, eval_steps, i64)       /* micro-batches per evaluation (also what is held out without val_data) */                \
    X(int64_t, data_ranks, i64)       /* data-parallel ranks (parallel { data }), >= 1: processes, or one runs them all */       \
    X(int64_t, nramp, i64)            /* stages of a batch-size ramp after the first; 0: the batch never changes */              \
    X(const RtRampStage *, ramp, ptr) /* [nramp]: steps increasing, the first > 0; NULL when nramp is 0 */                       \
    X(int64_t, ckpt_every, i64)       /* `checkpoint { every }`: every N steps; 0: none (--ckpt-every overrides) */              \
    X(const char *, ckpt_dir, ptr)    /* `checkpoint { dir }` ("checkpoints" by default; --ckpt-dir overrides) */                \
    X(int64_t, ckpt_keep, i64)        /* `checkpoint { keep }`: the newest N are kept; 0: all */                                 \
    X(int64_t, docs, i64)             /* tokens(docs = EOT): the id ending each document (data.pos); -1: none */                 \
    X(int32_t, ckpt_continue_on_error,                                                                                           \
      i32)                /* `checkpoint { on_error = "continue" }`: 1, training goes on after a failed write */                 \
    X(int64_t, zero, i64) /* parallel { zero }: 0; 1 optimizer state sharded over the data ranks, 2 also the reduced gradient */ \
    X(const char *, adapter_config, ptr)  /* PEFT's adapter_config.json for the nn.LoRALinear layers; NULL: none */              \
    X(const char *, adapter_modules, ptr) /* "PATH N\n" a layer: N adapters stacked, 0 for one; "": no PEFT form */              \
    X(int64_t, ncurriculum, i64)          /* stages of the sequence-length curriculum (batch.buckets); 0: steps are seq long */  \
    X(const int64_t *, curriculum, ptr)   /* [3 x ncurriculum]: first step, first index in curriculum_lens, count */             \
    X(const int64_t *, curriculum_lens, ptr) /* the stages' lengths, each dividing seq */                                        \
    X(int32_t, offload_optimizer, i32) /* offload { optimizer }: 0 none (in memory); 2 nvme: in a store file (docs/memory.md) */ \
    X(int64_t, offload_chunk, i64)     /* nvme: parameters a chunk of the streamed update (the plan's); 0 without offload */     \
    X(int64_t, offload_act_bytes, i64) /* offload { activations }: the store file or pinned host memory copied to; 0 none */     \
    X(int32_t, offload_act, i32)       /* offload { activations }: 0 none, 1 host (pinned host memory), 2 nvme (a store file) */ \
    X(double, offload_gbps, f64)       /* offload { activations }: the copy rate the plan assumed (GB/s); 0 none */

/* RtGenerateSettings: the defaults of `./prog generate` and `./prog serve`, from the serve block
 * of the train block's model when the program has one (name non-NULL), else the built-in defaults
 * (docs/serve.md). */
#define RT_GEN_FIELDS(X)                                                                                                         \
    X(const char *, weights, ptr) /* default --weights; NULL: none (the flag is then required) */                                \
    X(double, temperature, f64)   /* 0: greedy */                                                                                \
    X(int64_t, top_k, i64)        /* 0: all tokens */                                                                            \
    X(int64_t, max_tokens, i64)                                                                                                  \
    X(double, top_p, f64)           /* nucleus sampling's mass; 1: all tokens */                                                 \
    X(const char *, name, ptr)      /* the serve block's name; NULL: the program has none */                                     \
    X(int64_t, batch_tokens, i64)   /* batch.tokens: new tokens an iteration (decodes + prefill chunks) */                       \
    X(int64_t, prefill_chunk, i64)  /* batch.prefill_chunk */                                                                    \
    X(int64_t, batch_seqs, i64)     /* batch.seqs: sequences an iteration */                                                     \
    X(int64_t, kv_block, i64)       /* kv.block: tokens a KV block */                                                            \
    X(double, kv_memory, f64)       /* kv.memory: the fraction of the memory budget the KV pool takes */                         \
    X(const char *, kv_dtype, ptr)  /* kv.dtype: "f32", "bf16", "f16" or "fp8" */                                                \
    X(int64_t, port, i64)           /* the HTTP port */                                                                          \
    X(const char *, tokenizer, ptr) /* tokenizer.json or vocab.json path; NULL: prompts are token ids */                         \
    X(const char *, chat, ptr)      /* chat template ("chatml", "llama3"); NULL: no /v1/chat/completions */

/* RtStep: everything one call of a generated function reads and writes. Fields not listed for a
 * function are unspecified during that call. With `gpu` set (RtGpuProgram's functions) every
 * pointer is a device address except logits, which is in host memory. */
#define RT_STEP_FIELDS(X)                                                                                                        \
    X(RtPool *, pool, ptr)         /* for rt_parallel_for / rt_sgemm_batched */                                                  \
    X(float *, params, ptr)        /* all: the parameter region (read; optimizer_update writes) */                               \
    X(float *, grads, ptr)         /* forward_backward accumulates (+=) into it; optimizer_update reads it */                    \
    X(float *, state, ptr)         /* optimizer_init / optimizer_update: the optimizer-state region */                           \
    X(unsigned char *, arena, ptr) /* forward_*: activation scratch, arena_bytes, RT_ALIGN-aligned */                            \
    X(const int32_t *, x, ptr)     /* forward_*: input token ids, [B, T] row-major, each below vocab */                          \
    X(const int32_t *, y, ptr)     /* forward_backward, forward_loss: target ids, [B, T] */                                      \
    X(const int32_t *, pos, ptr)   /* forward_*: with tokens(docs = ...), each token's position in its document, [B, T] */       \
    X(int64_t, B, i64)             /* forward_*: the batch shape (micro x seq; 1 x logits_seq for logits) */                     \
    X(int64_t, T, i64)                                                                                                           \
    X(int64_t, len, i64)       /* forward_logits: the context x[0, len), 1 <= len <= T, x[len, T) 0; forward_chunk: rows used */ \
    X(float *, logits, ptr)    /* forward_logits: out, [vocab] logits of position len - 1; forward_chunk: rows 0..len-1's */     \
    X(double, loss_scale, f64) /* forward_backward: the gradient seed, d(step objective) / d(this loss) */                       \
    X(double, loss, f64)       /* forward_backward, forward_loss: out, this micro-batch's loss */                                \
    X(double, lr, f64)         /* optimizer_update: this step's learning rate, base lr x lr_schedule(step) */                    \
    X(int64_t, t, i64)         /* optimizer_update: 1-based optimizer step (bias corrections) */                                 \
    X(int64_t, step, i64)      /* 0-based optimizer step (an RNG key, with micro and seed) */                                    \
    X(int64_t, micro, i64)     /* forward_backward: 0-based micro-batch within the step */                                       \
    X(uint64_t, seed, i64)     /* the run's seed */                                                                              \
    X(RtError *, err, ptr)     /* a function that fails fills it and returns its status */                                       \
    X(RtGpu *, gpu, ptr)       /* RtGpuProgram's functions: the GPU; NULL for the CPU functions */                               \
    X(int64_t, lo, i64)        /* optimizer_update: the elements [lo, hi) of the parameter region it updates (ZeRO's shard; */   \
    X(int64_t, hi, i64)        /* hi = 0: all); the state region then holds each variable's [lo, hi) in turn */                  \
    X(int64_t, state_stride, i64) /* optimizer_update: 0, or the floats from one state variable's [lo, hi) to the */             \
                                  /* next's in the state region (the host's chunks of a whole region's state) */                 \
    X(const float *, stats, ptr)  /* forward_backward, forward_loss: global_mean's statistics, stat_floats (read) */             \
    X(float *, stats_out, ptr)    /* forward_stats: out, this micro-batch's statistics, stat_floats, in host memory */           \
    X(int32_t *, kv, ptr)         /* forward_chunk: the metadata (RtKvInfo; compiler/fuse/fuse_kv.h) */                          \
    X(void *, kv_pool, ptr)       /* forward_chunk: the KV pool, which it reads and writes */                                    \
    X(void *, grad_hook, ptr)     /* forward_backward: NULL, or the runtime's; each gradient's add is followed by */             \
                                  /* rt_grad_ready(s, lo, hi) (rt_program.h) */                                                  \
    X(int64_t, training, i64) /* forward_stats: the key's training word (training(), dropout): 1 in the step's pass, 0 eval's */ \
    X(void *, act, ptr)       /* forward_backward with offload { activations = nvme }: the RtExec rt_act_copy takes */           \
    X(void *, param_hook, ptr)  /* forward_backward (CPU, GPU): NULL, or the runtime's (ZeRO-3); rt_param_need and */            \
                                /* rt_param_done (rt_program.h) around the parameters' uses */                                   \
    X(int64_t, casts_kept, i64) /* forward_backward: 1 when the arena holds this step's parameter casts, 2 when only */          \
                                /* the parameter casts' region is current (rt_program.h); 0: its launches that read */           \
                                /* only parameters run */                                                                        \
    X(void *, pcasts, ptr)      /* all: the parameter casts' region, pcast_bytes (rt_program.h); optimizer_update writes */      \
                                /* its [lo, hi) (a bf16 program), the step's casts write and read it */

/* RtKvInfo: forward_chunk's geometry (compiler/plan/kv.h). A call reads x[0, rows) (the new
 * tokens, padding rows 0) and the metadata at kv (rows x (4 + max_blocks) i32: each row's position,
 * sequence (-1: padding), its sequence's first position in this call, its slot, then rows block
 * tables of max_blocks), writes each row's key and value into the pool at kv_pool (slot s of
 * `bytes_per_token` bytes at s x bytes_per_token; slot = block id x block + position % block)
 * and the logits of the rows it uses (RtStep.len) into logits[len x vocab]. rows 0: no forward_chunk. */
#define RT_KV_INFO_FIELDS(X)                                                                                                     \
    X(int64_t, rows, i64)            /* new tokens a call */                                                                     \
    X(int64_t, block, i64)           /* tokens a block */                                                                        \
    X(int64_t, max_blocks, i64)      /* block table entries a sequence: ceil(logits_seq / block) */                              \
    X(int64_t, layers, i64)          /* attention layers */                                                                      \
    X(int64_t, heads, i64)           /* key/value heads a layer */                                                               \
    X(int64_t, head_dim, i64)        /* their width */                                                                           \
    X(int64_t, dtype_bytes, i64)     /* 4: f32, 2: bf16 or f16 */                                                                \
    X(int64_t, bytes_per_token, i64) /* layers x 2 x heads x head_dim x dtype_bytes */                                           \
    X(int64_t, meta_bytes, i64)      /* the metadata's bytes at kv */

/* RtGpuImage: one image of the program's CUDA module, embedded by mbtc (--cuda-arch). */
#define RT_GPU_IMAGE_FIELDS(X)                                                                                                   \
    X(const char *, arch, ptr) /* "sm_90" (a cubin) or "compute_90" (PTX) */                                                     \
    X(int32_t, ptx, i32)       /* 1: PTX text, data NUL-terminated; 0: a cubin (ELF) */                                          \
    X(const unsigned char *, data, ptr)                                                                                          \
    X(int64_t, size, i64) /* bytes (PTX: including the NUL) */

/* RtGpuKernel: one kernel launch site's function and geometry. */
#define RT_GPU_KERNEL_FIELDS(X)                                                                                                  \
    X(const char *, function, ptr) /* the __global__ function's name in the module */                                            \
    X(int32_t, block, i32)         /* threads per block (the kernel assumes exactly this) */                                     \
    X(int32_t, shared, i32)        /* bytes of static shared memory (informational: the cubin holds it) */                       \
    X(int64_t, blocks, i64)        /* blocks in the grid */                                                                      \
    X(int32_t, nbufs, i32)         /* its parameters: that many device pointers */

/* RtGpuProgram: the program's GPU side; the functions have the CPU functions' contracts with
 * device regions (RtStep.gpu set), a NULL one meaning the GPU cannot run that function. */
#define RT_GPU_PROG_FIELDS(X)                                                                                                    \
    X(const RtGpuImage *, images, ptr)                                                                                           \
    X(int64_t, nimages, i64)                                                                                                     \
    X(const RtGpuKernel *, kernels, ptr)                                                                                         \
    X(int64_t, nkernels, i64)                                                                                                    \
    X(const char *, module_hash, ptr) /* "xxh3-128:..." of the CUDA source: the JIT cache's key */                               \
    X(RtStepFn, forward_backward, ptr)                                                                                           \
    X(RtStepFn, forward_loss, ptr)                                                                                               \
    X(RtStepFn, forward_logits, ptr)                                                                                             \
    X(RtStepFn, optimizer_update, ptr)                                                                                           \
    X(RtStepFn, forward_stats, ptr)                                                                                              \
    X(RtStepFn, forward_chunk, ptr) /* the chunk phase (KV cache) on the GPU; NULL: none */

/* RtProgram: a compiled program, the descriptor plus its functions (rt_program.h describes each
 * function's contract and the hash). All pointers are to constant data with static storage. */
#define RT_PROG_FIELDS(X)                                                                                                        \
    X(int, abi_version, i32)         /* RT_ABI_VERSION */                                                                        \
    X(const char *, source, ptr)     /* the .mbt file it was compiled from (for --help) */                                       \
    X(RtTrainSettings, train, train) /* the train block */                                                                       \
    X(RtGenerateSettings, generate, generate)                                                                                    \
    X(const RtParam *, params, ptr) /* the parameter table, in declaration order */                                              \
    X(int64_t, nparams, i64)                                                                                                     \
    X(int64_t, param_floats, i64)       /* the parameter region, in f32 elements (also the gradient region's size) */            \
    X(int64_t, state_floats, i64)       /* the optimizer-state region, in f32 elements */                                        \
    X(int64_t, arena_bytes, i64)        /* the activation arena (the largest any function needs) */                              \
    X(int64_t, logits_seq, i64)         /* T of forward_logits: the longest context generation passes */                         \
    X(RtStepFn, forward_backward, ptr)  /* one micro-batch's loss and loss_scale x its gradients (+=) */                         \
    X(RtStepFn, forward_loss, ptr)      /* the same loss without gradients (evaluation); NULL: cannot evaluate */                \
    X(RtStepFn, forward_logits, ptr)    /* generation's logits at batch 1; NULL: cannot generate */                              \
    X(RtStepFn, optimizer_init, ptr)    /* the optimizer state's initial values; NULL: the runtime zeroes it */                  \
    X(RtStepFn, optimizer_update, ptr)  /* one optimizer step over every parameter */                                            \
    X(RtLrScheduleFn, lr_schedule, ptr) /* the learning-rate multiplier at 0-based step `step` */                                \
    X(const char *, hash, ptr)          /* "xxh3-128:" and 32 hex digits over the compiled step */                               \
    X(int64_t, nstate, i64)             /* optimizer state variables; the state region is nstate parts (rt_exec.h) */            \
    X(const char *const *, state_names,                                                                                          \
      ptr)                            /* [nstate]: "m", "v" (variable k holds parameter i at k x rt_state_part + offset_i) */    \
    X(const RtGpuProgram *, gpu, ptr) /* the CUDA side, or NULL (built without CUDA) */                                          \
    X(RtPlanInfo, plan, plan)         /* the memory plan's summary (./prog info) */                                              \
    X(int64_t, stat_floats, i64)      /* global_mean's statistics in f32 elements; 0: none (forward_stats NULL) */               \
    X(RtStepFn, forward_stats, ptr)   /* one micro-batch's statistics into stats_out (the step's statistics pass) */             \
    X(RtStepFn, forward_chunk, ptr)   /* new tokens with the paged KV cache (RtKvInfo); NULL: cannot */                          \
    X(RtKvInfo, kv, kvinfo)           /* its geometry */                                                                         \
    X(int64_t, nrunning, i64)         /* running statistics (`running`): after each optimizer step, for each i */                \
    X(const int64_t *, running, ptr)  /* [3 nrunning]: params[o + j] = (1 - m) params[o + j] + m stats[s + j], j < n: o, s, n */ \
    X(const double *, running_momentum, ptr) /* [nrunning]: m (o, s in f32 elements; docs/runtime.md) */                         \
    X(int64_t, pcast_bytes, i64) /* the parameter casts' region (RtStep.pcasts): 2 bytes a parameter element; 0: none */

/* RtPlanInfo: the memory plan's summary, per phase (RT_PHASE_*). */
#define RT_PLAN_INFO_FIELDS(X)                                                                                                   \
    X(RtPhases, arena, phases)     /* bytes from the arena's start; 0 for an absent function */                                  \
    X(RtPhases, kernels, phases)   /* generated kernels launched per call */                                                     \
    X(RtPhases, gemms, phases)     /* GEMMs per call */                                                                          \
    X(int64_t, input_bytes, i64)   /* data.x and data.y of one micro-batch */                                                    \
    X(int64_t, gather_window, i64) /* ZeRO-3: the most floats forward_backward's gathers hold at once (plan.h, PlanGather) */    \
    X(int64_t, gather_units, i64)  /* and how many gathers that is at most */                                                    \
    X(int64_t, gather_page, i64)   /* ZeRO-3: the bytes of the page the plan grouped and counted by (mbtc --zero3-page) */       \
    X(int64_t, gather_window_pages, i64) /* the most of those pages the gathers map at once */

#endif
