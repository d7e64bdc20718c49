/* main.c - the mbtc command line: reads the options and hands them to the stage table
 * (pipeline.h), which runs what --emit, --dump-dir, -o, --check or --verify-step need.
 * Exit status: 0 success, 1 user errors, 2 internal error. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "diag.h"
#include "install.h"
#include "module.h"
#include "cuda_program.h"
#include "fuse.h"
#include "pipeline.h"
#include "verify_step.h"

#define MBT_VERSION "0.1.0"

static void usage(FILE *out) {
    fprintf(out, "usage: mbtc [options] FILE.mbt\n"
                 "\n"
                 "options:\n"
                 "  --check            parse and check the program (names, types, shapes, settings); no output\n"
                 "  --emit=STAGE       print a stage to stdout; --emit=list lists them in order, one a line:\n"
                 "                     tokens, ast, ir (the training step's forward graph), grad (forward and\n"
                 "                     backward graph), update (the optimizer's update graph), schedule (the\n"
                 "                     learning-rate schedule as scalar IR), fused (both graphs as the fused\n"
                 "                     IR), kernels (the fused IR partitioned into GEMMs and generated kernels,\n"
                 "                     with their bodies), plan (the step program and the memory plan of the\n"
                 "                     fused schedules), llvm (the generated kernels as LLVM IR for the host\n"
                 "                     CPU), cuda (every kernel of the step, update and logits schedules as\n"
                 "                     CUDA C), ptx, sass (that source compiled by NVRTC for each --cuda-arch;\n"
                 "                     sass needs cuobjdump or nvdisasm), program (the whole program -o builds,\n"
                 "                     before optimisation: every kernel, the step functions that launch them\n"
                 "                     and the descriptor, as LLVM IR)\n"
                 "  --opt              with --emit=llvm: the IR after LLVM's O2 pipeline for this CPU\n"
                 "  --cuda-arch=LIST   GPU architectures -o builds cubins for (with the PTX of the highest, which\n"
                 "                     newer GPUs compile on first use), and those of ptx, sass, --cuda-info and\n"
                 "                     --dump-dir (default sm_80,sm_90; none: -o builds for the CPU alone)\n"
                 "  --offload-gbps=R   offload.activations: time the copies at R GB/s (measured; default 20 for host,\n"
                 "                     1 for nvme: docs/memory.md)\n"
                 "  --zero3-page=N     parallel.zero = 3: the bytes of a page the parameter gathers map, a power of\n"
                 "                     two from 4096 to 1 GiB: the plan groups its gathers by it and bounds their\n"
                 "                     memory in it; a GPU run refuses another than the device's granularity\n"
                 "                     (default: 2097152 when built for a GPU, 4096 with --cuda-arch=none;\n"
                 "                     docs/parallel.md, \"ZeRO-3 on the GPU\")\n"
                 "  --pad-gemm=N       store each parameter's leading dimension that reaches a GEMM as its m or n\n"
                 "                     (the vocabulary) padded to a multiple of N, a power of two up to 1024;\n"
                 "                     1: never (default: 64 for dimensions of 1024 and more when built for a\n"
                 "                     GPU, 1 with --cuda-arch=none; docs/cuda.md, \"Aligned GEMM shapes\")\n"
                 "  --no-lora-fusion   keep LoRA's down and up products two GEMMs (the fused LoRA launch is the\n"
                 "                     default: docs/architecture.md, \"Fusion\"); for benchmarks and checks\n"
                 "  --no-ce-fusion     keep cross-entropy's gradient an elementwise kernel with a buffer of its\n"
                 "                     own (the classifier kernel is the default: docs/cuda.md); for checks\n"
                 "  --cuda-info        with --emit=kernels: a '# ptxas' line a kernel (registers, spills, shared\n"
                 "                     memory and the occupancy they allow, per architecture; needs NVRTC)\n"
                 "  --dump-dir DIR     write every stage --emit prints to DIR/NN-STAGE.txt, and every kernel's\n"
                 "                     CUDA stages: .kir, .cu, .ARCH.ptx, .ARCH.sass, and the program's .cu,\n"
                 "                     .ARCH.cubin, .ARCH.ptx, .ARCH.ptxas.log (needs NVRTC)\n"
                 "  --train NAME       the train block -o and --emit=ir and after build (default: the first)\n"
                 "  -o FILE            build the executable FILE for a train block (train, eval; see docs/cli.md)\n"
                 "  -v, --verbose      print each stage's time on stderr as it finishes (the default for -o\n"
                 "                     when stderr is a terminal)\n"
                 "  --verify-step F    check a step the executable computed (`PROG train --steps 1 --dump-step F`)\n"
                 "                     against the reference evaluator in double precision: loss and gradients\n"
                 "  -I DIR             add DIR to the module search path (before $MBT_PATH and the stdlib)\n"
                 "  --color            colour diagnostics (default: when stderr is a terminal)\n"
                 "  --no-color         never colour diagnostics\n"
                 "  --version          print the version, and the runtime library and stdlib this mbtc uses\n"
                 "  -h, --help         print this help\n"
                 "\n"
                 "environment:\n"
                 "  MBT_PATH           colon-separated directories searched for imports\n"
                 "  MBT_CUDA_ARCH      the default of --cuda-arch (none: executables for the CPU alone)\n"
                 "  MBT_CACHE_DIR      NVRTC's output cache (default $XDG_CACHE_HOME/mbt or ~/.cache/mbt; off: none)\n"
                 "\n"
                 "exit status: 0 success, 1 errors in the program, 2 internal compiler error\n");
}

/* --version: the version, then where this mbtc finds its runtime library and its stdlib (an
 * installed tree's, relative to mbtc itself, or the build tree's: docs/install.md). */
static void print_version(Arena *ar) {
    const char *lib = NULL, *ldlibs = NULL, *err = NULL;
    const char *stdlib = install_stdlib(ar);
    printf("mbtc %s\n", MBT_VERSION);
    if (install_runtime(ar, &lib, &ldlibs, &err)) printf("runtime: not found (%s)\n", err);
    else printf("runtime: %s\n", lib);
    printf("stdlib: %s\n", stdlib ? stdlib : "not found");
}

/* The command line, parsed. */
typedef struct Cli {
    PipelineOptions o;
    const char *emit;      /* --emit's stage name */
    const char *verify;    /* --verify-step's dump */
    const char *arch_list; /* --cuda-arch, else $MBT_CUDA_ARCH, else sm_80,sm_90 */
    const char *pad;       /* --pad-gemm, or NULL */
    const char *gbps;      /* --offload-gbps, or NULL */
    const char *z3page;    /* --zero3-page, or NULL */
    int check;
    int verbose; /* -v, --verbose: the stages' times on stderr */
    PtrVec incdirs;
    const char *archs[8]; /* --cuda-arch, split */
} Cli;

/* Reads argv into c. Returns -1 to go on, else the exit status (--help, --version, a bad option). */
static int parse_args(Cli *c, int argc, char **argv, Arena *ar) {
    PipelineOptions *o = &c->o;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--check") == 0) c->check = 1;
        else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) c->verbose = 1;
        else if (strncmp(a, "--emit=", 7) == 0) c->emit = a + 7;
        else if (strcmp(a, "--opt") == 0) o->opt = 1;
        else if (strncmp(a, "--cuda-arch=", 12) == 0) c->arch_list = a + 12;
        else if (strcmp(a, "--cuda-arch") == 0 && i + 1 < argc) c->arch_list = argv[++i];
        else if (strcmp(a, "--cuda-info") == 0) o->cuda_info = 1;
        else if (strcmp(a, "--no-lora-fusion") == 0) fuse_lora_chain = 0;
        else if (strcmp(a, "--no-ce-fusion") == 0) fuse_ce_fused = 0;
        else if (strncmp(a, "--pad-gemm=", 11) == 0) c->pad = a + 11;
        else if (strncmp(a, "--offload-gbps=", 15) == 0) c->gbps = a + 15;
        else if (strcmp(a, "--offload-gbps") == 0 && i + 1 < argc) c->gbps = argv[++i];
        else if (strncmp(a, "--zero3-page=", 13) == 0) c->z3page = a + 13;
        else if (strcmp(a, "--zero3-page") == 0 && i + 1 < argc) c->z3page = argv[++i];
        else if (strcmp(a, "--pad-gemm") == 0 && i + 1 < argc) c->pad = argv[++i];
        else if (strcmp(a, "--dump-dir") == 0 && i + 1 < argc) o->dump_dir = argv[++i];
        else if (strncmp(a, "--dump-dir=", 11) == 0) o->dump_dir = a + 11;
        else if (strcmp(a, "-o") == 0 && i + 1 < argc) o->output = argv[++i];
        else if (strcmp(a, "--verify-step") == 0 && i + 1 < argc) c->verify = argv[++i];
        else if (strncmp(a, "--verify-step=", 14) == 0) c->verify = a + 14;
        else if (strcmp(a, "--train") == 0) o->train = i + 1 < argc ? argv[++i] : "";
        else if (strncmp(a, "--train=", 8) == 0) o->train = a + 8;
        else if (strcmp(a, "-I") == 0 && i + 1 < argc) ptrvec_push(ar, &c->incdirs, argv[++i]);
        else if (strncmp(a, "-I", 2) == 0 && a[2]) ptrvec_push(ar, &c->incdirs, (void *)(a + 2));
        else if (strcmp(a, "--color") == 0) diag_set_color(1);
        else if (strcmp(a, "--no-color") == 0) diag_set_color(0);
        else if (strcmp(a, "--version") == 0) {
            print_version(ar);
            return 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (i + 1 == argc && (strcmp(a, "-o") == 0 || strcmp(a, "--verify-step") == 0 || strcmp(a, "--cuda-arch") == 0 ||
                                     strcmp(a, "--dump-dir") == 0 || strcmp(a, "-I") == 0 || strcmp(a, "--pad-gemm") == 0 ||
                                     strcmp(a, "--offload-gbps") == 0 || strcmp(a, "--zero3-page") == 0)) {
            static const char *const what[][2] = {
                {"-o", "FILE"}, {"--verify-step", "DUMP"}, {"--cuda-arch", "LIST"},    {"--dump-dir", "DIR"},
                {"-I", "DIR"},  {"--pad-gemm", "N"},       {"--offload-gbps", "RATE"}, {"--zero3-page", "BYTES"}};
            for (size_t w = 0; w < sizeof what / sizeof *what; w++)
                if (strcmp(a, what[w][0]) == 0) diag_error_noloc("%s needs a %s after it", a, what[w][1]);
            if (strcmp(a, "-o") == 0) diag_hint("for example: mbtc prog.mbt -o prog (builds the executable 'prog')");
            else diag_hint("run 'mbtc --help' for the options");
            return 1;
        } else if (a[0] == '-' && a[1]) {
            diag_error_noloc("unknown option '%s'", a);
            diag_hint("run 'mbtc --help' for the options");
            return 1;
        } else if (o->input) {
            diag_error_noloc("more than one input file ('%s' and '%s')", o->input, a);
            return 1;
        } else o->input = a;
    }
    return -1;
}

/* -o's path, before anything runs: not a directory, not the source, in a directory mbtc can write
 * (the modules the source imports are checked once they are known: pipeline.c, run_object).
 * Returns 0, or 1 after reporting. */
static int check_output(const char *out, const char *in, Arena *ar) {
    struct stat so, si;
    if (stat(out, &so) == 0) {
        if (S_ISDIR(so.st_mode)) {
            diag_error_noloc("-o '%s' is a directory: give the path of the executable to write", out);
            return 1;
        }
        /* The linker writes the path itself: a FIFO or a device node there would make it fail
         * (or block) after the whole compilation, or replace /dev/null. */
        if (!S_ISREG(so.st_mode)) {
            diag_error_noloc("-o '%s' is %s, not a regular file: give the path of the executable to write", out,
                             S_ISFIFO(so.st_mode)   ? "a FIFO (named pipe)"
                             : S_ISCHR(so.st_mode)  ? "a character device"
                             : S_ISBLK(so.st_mode)  ? "a block device"
                             : S_ISSOCK(so.st_mode) ? "a socket"
                                                    : "not a regular file");
            return 1;
        }
        if (stat(in, &si) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino) {
            diag_error_noloc("-o '%s' is the source file '%s': it would be overwritten", out, in);
            diag_hint("give the executable another name, e.g. -o prog");
            return 1;
        }
    }
    const char *slash = strrchr(out, '/');
    const char *dir = !slash ? "." : slash == out ? "/" : arena_printf(ar, "%.*s", (int)(slash - out), out);
    if (access(dir, W_OK | X_OK) != 0) {
        diag_error_noloc("cannot write the executable '%s': directory '%s': %s", out, dir, strerror(errno));
        return 1;
    }
    return 0;
}

/* The options that go together, each refusal with its reason. Returns 0, or 1 after reporting. */
static int check_args(Cli *c, Arena *ar) {
    PipelineOptions *o = &c->o;
    if (!o->input) {
        diag_error_noloc("no input file");
        usage(stderr);
        return 1;
    }
    o->emit = c->emit ? pipeline_stage(c->emit) : -1;
    if (c->emit && o->emit < 0) {
        diag_error_noloc("unknown stage '%s' for --emit", c->emit);
        diag_hint("the stages available are: %s", pipeline_stage_names(ar));
        return 1;
    }
    if (o->train && !*o->train) {
        diag_error_noloc("'--train' needs the name of a train block");
        return 1;
    }
    if (c->verify && (c->emit || o->output || c->check)) {
        diag_error_noloc("'--verify-step' is a mode of its own: give it without --emit, -o or --check");
        return 1;
    }
    if (o->train && !(o->emit > ST_CHECK) && !(o->output && !c->check && !c->emit) && !c->verify && !o->dump_dir) {
        diag_error_noloc("'--train %s' selects the train block for -o or --emit=ir, grad, plan, kernels or llvm, and none "
                         "is given",
                         o->train);
        return 1;
    }
    if (o->opt && o->emit != ST_LLVM) {
        diag_error_noloc("'--opt' prints the optimised LLVM IR of --emit=llvm, and --emit=llvm is not given");
        return 1;
    }
    const char *err = NULL;
    o->narch = cuda_parse_archs(c->arch_list, c->archs, 8, ar, &err);
    o->archs = c->archs;
    if (o->narch < 0) {
        diag_error_noloc("%s", err);
        return 1;
    }
    /* Aligned GEMM shapes: by default only a program built for a GPU pads (cuBLAS is 5-7x slower
     * on GPT-2's vocabulary than on it padded to 64), and only dimensions of 1024 rows and more
     * (at most 6% more work: a vocabulary of 16 would quadruple its output layer's). */
    o->pad_gemm = o->narch > 0 ? 64 : 1;
    o->pad_min = 1024;
    if (c->pad) {
        char *end = NULL;
        long v = strtol(c->pad, &end, 10);
        if (!*c->pad || *end || v < 1 || v > 1024 || (v & (v - 1)) != 0) {
            diag_error_noloc("--pad-gemm=%s: the padding is a power of two from 1 (none) to 1024", c->pad);
            diag_hint("for example --pad-gemm=64 (a GPU's GEMMs like multiples of 64), or --pad-gemm=1 to pad nothing");
            return 1;
        }
        o->pad_gemm = v;
        o->pad_min = 0;
    }
    if (c->gbps) {
        char *end = NULL;
        double v = strtod(c->gbps, &end);
        if (!*c->gbps || *end || !(v >= 0.001 && v <= 10000)) {
            diag_error_noloc("--offload-gbps=%s: the copies' rate is a number of GB/s from 0.001 to 10000", c->gbps);
            diag_hint("for example --offload-gbps=50 (pinned copies over PCIe 5.0 x16), as measured on the machine");
            return 1;
        }
        o->offload_gbps = v;
    }
    if (c->z3page) {
        char *end = NULL;
        long long v = strtoll(c->z3page, &end, 10);
        if (!*c->z3page || *end || v < 4096 || v > (1LL << 30) || (v & (v - 1)) != 0) {
            diag_error_noloc("--zero3-page=%s: ZeRO-3's page is a power of two of bytes from 4096 to 1073741824", c->z3page);
            diag_hint("the device's allocation granularity: 2097152 on the GPUs we know (the default when built for one)");
            return 1;
        }
        o->zero3_page = v;
    }
    if (o->narch == 0 && (o->cuda_info || o->dump_dir || o->emit == ST_PTX || o->emit == ST_SASS)) {
        diag_error_noloc("--cuda-arch=none: --emit=ptx, sass, --cuda-info and --dump-dir need an architecture");
        return 1;
    }
    if (o->cuda_info && o->emit != ST_KERNELS) {
        diag_error_noloc("'--cuda-info' adds ptxas's figures to --emit=kernels, and --emit=kernels is not given");
        return 1;
    }
    if (o->dump_dir && (o->output || c->check || c->verify || (c->emit && o->emit != ST_CUDA))) {
        diag_error_noloc("'--dump-dir' writes every stage and the CUDA stages of every kernel: give it alone or with "
                         "--emit=cuda");
        return 1;
    }
    if (o->output && !c->check && !c->emit && !c->verify && check_output(o->output, o->input, ar)) return 1;
    return 0;
}

/* The furthest stage the run needs. */
static StageId goal_of(const Cli *c) {
    const PipelineOptions *o = &c->o;
    if (c->verify) return ST_UPDATE;
    if (o->dump_dir) return ST_PROGRAM;
    if (o->emit >= 0) return o->cuda_info ? ST_PTX : (StageId)o->emit;
    return o->output && !c->check ? ST_OBJECT : ST_CHECK;
}

/* Runs the table as the options ask; returns the exit status. */
static int run(Pipeline *p, const Cli *c) {
    const PipelineOptions *o = &c->o;
    if (c->verify) return verify_step(p, c->verify);
    if (o->emit >= 0 || o->dump_dir) {
        /* the dump first: it prints ir before grad differentiates that graph in place; the stage
         * emitted with it (cuda) is then printed from what the dump computed */
        if (o->dump_dir) pipeline_dump(p, o->dump_dir);
        if (o->emit >= 0) pipeline_emit(p, (StageId)o->emit);
        return diag_finish();
    }
    if (o->output && !c->check) {
        double t0 = pipeline_seconds();
        if (pipeline_run(p, ST_OBJECT) == 0 && o->progress)
            fprintf(stderr, "mbtc: wrote %s in %.2f s\n", o->output, pipeline_seconds() - t0);
        return diag_finish();
    }
    if (pipeline_run(p, ST_CHECK) || c->check) return diag_finish();
    diag_error_noloc("no output file: give -o FILE to build an executable");
    diag_hint("use --check to check a program, or --emit=ast to print it");
    return diag_finish();
}

int main(int argc, char **argv) {
    Arena ar = {0};
    Cli c = {.o = {.emit = -1}};
    c.arch_list = getenv("MBT_CUDA_ARCH") && *getenv("MBT_CUDA_ARCH") ? getenv("MBT_CUDA_ARCH") : "sm_80,sm_90";
    diag_set_color(isatty(2));
    int rc = parse_args(&c, argc, argv, &ar);
    if (rc < 0 && c.emit && strcmp(c.emit, "list") == 0) {
        pipeline_list(stdout);
        rc = 0;
    }
    if (rc < 0 && check_args(&c, &ar)) rc = 1;
    /* progress: asked for, or a build (-o alone) whose stderr a person watches */
    c.o.progress = c.verbose || (c.o.output && !c.check && c.o.emit < 0 && !c.o.dump_dir && !c.verify && isatty(2));
    if (rc < 0) {
        Loader ld;
        loader_init(&ld, &ar, (const char **)c.incdirs.v, c.incdirs.n, install_stdlib(&ar));
        Pipeline p;
        pipeline_init(&p, &ld, &ar, &c.o, goal_of(&c));
        rc = run(&p, &c);
        pipeline_free(&p);
    }
    arena_free(&ar);
    return rc;
}
