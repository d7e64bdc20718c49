/* pipeline.h - the compiler's stages, in order, as one table (pipeline.c), and the context that
 * holds what each computed.
 *
 * Every way of running mbtc goes through the table: --emit=STAGE runs the stages that STAGE
 * consumes and prints it, -o runs them up to `object`, --check up to `check`, --verify-step up to
 * `update` (verify_step.c), --dump-dir every printable stage. A stage runs at most once a run; its
 * result stays in the Pipeline for the stages after it, so nothing is computed twice: the program
 * is parsed by `ast` and checked by `check` once (sema builds the step, update and batch-1
 * forward graphs in that one walk). `mbtc --emit=list` prints the table. */
#ifndef MBT_PIPELINE_H
#define MBT_PIPELINE_H
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "cpu.h"
#include "cuda_program.h"
#include "fuse.h"
#include "host.h"
#include "module.h"
#include "plan.h"
#include "sema.h"

/* The stages, in the table's order (pipeline.c's `stages` has one row each). */
typedef enum StageId {
    ST_TOKENS,   /* the lexer's tokens */
    ST_AST,      /* the syntax tree of the main module and its imports */
    ST_CHECK,    /* sema: names, types, shapes, settings */
    ST_IR,       /* the training step's forward graph */
    ST_GRAD,     /* the step differentiated (autodiff, in place) */
    ST_UPDATE,   /* the optimizer's update graph */
    ST_SCHEDULE, /* the learning-rate schedule lowered to the scalar IR */
    ST_FUSED,    /* both graphs lowered to the fused IR */
    ST_KERNELS,  /* the launches' GEMMs and generated kernels */
    ST_PLAN,     /* the step program and the memory plan */
    ST_LLVM,     /* the kernels as LLVM IR for the host CPU */
    ST_CUDA,     /* every schedule's kernels as one CUDA C translation unit */
    ST_PTX,      /* that unit compiled by NVRTC for each --cuda-arch */
    ST_SASS,     /* the cubins disassembled */
    ST_PROGRAM,  /* the whole program -o builds, as LLVM IR */
    ST_OBJECT,   /* -o: the object file, linked into the executable */
    ST_COUNT
} StageId;

/* What the command line asks of a run. */
typedef struct PipelineOptions {
    const char *input;        /* the .mbt file */
    const char *train;        /* --train (NULL: the first train block) */
    const char *output;       /* -o */
    const char *dump_dir;     /* --dump-dir */
    int emit;                 /* --emit's stage, or -1 */
    int opt;                  /* --opt: --emit=llvm after LLVM's O2 */
    int cuda_info;            /* --cuda-info: ptxas's figures after --emit=kernels */
    const char *const *archs; /* --cuda-arch */
    int narch;
    int64_t pad_gemm; /* --pad-gemm: parameters' leading dimensions reaching a GEMM padded to a multiple
                         of this (1: none; graph_pad.h) when they have at least pad_min rows */
    int64_t pad_min;
    int progress;        /* -v, or -o with stderr a terminal: each stage's time, one line on stderr */
    int64_t zero3_page;  /* --zero3-page: ZeRO-3's page in bytes; 0: the target's (4096, a GPU build's 2 MiB) */
    double offload_gbps; /* --offload-gbps: offload.activations' assumed copy rate (GB/s); 0: the plan's default */
} PipelineOptions;

/* The context: the options, and each stage's result once it has run. */
typedef struct Pipeline {
    Loader *ld;
    Arena *ar;
    PipelineOptions o;
    StageId goal;                  /* the furthest stage this run needs (sema builds what it consumes) */
    int dumping;                   /* printing into --dump-dir */
    unsigned char state[ST_COUNT]; /* 0 not run, 1 done, 2 failed (errors reported) */
    uint32_t source;               /* tokens: the main file's diag source */
    Module *main_mod;              /* ast */
    TrainBuild *tb;                /* check (a run past it): the step graph, the update graph, the settings */
    int first_bwd;                 /* grad: the step graph's first backward node */
    FusedGraph *fgraph[2];         /* fused: the step's and the update's fused IR */
    FuseResult *fused[2];          /* kernels: their launches and kernels */
    Plan *plan;                    /* plan */
    CpuTarget cpu;                 /* llvm */
    LLVMContextRef llvm_ctx;
    LLVMModuleRef llvm[2]; /* llvm: the step's and the update's kernels */
    HostSchedules hs;      /* the schedules -o builds (cuda, program, object) */
    int have_hs;
    CudaProgram *cuda;  /* cuda */
    NvrtcResult *nvrtc; /* ptx: [narch] */
    const char **sass;  /* sass: [narch], NULL where cuobjdump failed */
    const char *sass_err;
    const char *program; /* program: its printout */
} Pipeline;

/* Sets up a run of the table with these options; goal is the furthest stage it will need. */
void pipeline_init(Pipeline *p, Loader *ld, Arena *ar, const PipelineOptions *o, StageId goal);
/* Frees what the stages hold outside the arena (LLVM modules, the target machine). */
void pipeline_free(Pipeline *p);
/* Runs stage s and the stages it consumes, each once, each checked by its verifier (a failure is
 * an internal error). With o.progress, each stage that ran prints `mbtc: NAME  1.23 s  WHAT` on
 * stderr when it is done (its own time, not its inputs'). Returns 0, or 1 after errors were reported. */
int pipeline_run(Pipeline *p, StageId s);
/* A monotonic clock, in seconds (the stage times of o.progress). */
double pipeline_seconds(void);
/* Runs stage s and prints it to stdout; a stage without a printer is an error. Returns 0 or 1. */
int pipeline_emit(Pipeline *p, StageId s);
/* --dump-dir: runs every stage with a printer, in order, writing each printout to
 * DIR/NN-name.txt (NN its place in the table), then the CUDA program's files
 * (cuda_program_dump). Stops at the first stage that fails. Returns 0 or 1. */
int pipeline_dump(Pipeline *p, const char *dir);

/* The stage named name, or -1. */
int pipeline_stage(const char *name);
/* The names --emit takes, comma-separated ("tokens, ast, ..."), for the unknown-stage hint. */
const char *pipeline_stage_names(Arena *ar);
/* A stage's name. */
const char *pipeline_stage_name(StageId s);
/* Whether --emit can print stage s. */
int pipeline_printable(StageId s);
/* --emit=list: one line a stage, in order: its name and what it is. */
void pipeline_list(FILE *out);
#endif
