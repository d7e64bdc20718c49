/* cuda_program.c - a whole program's CUDA (cuda_program.h): the translation unit, its NVRTC
 * compilations, SASS through cuobjdump, the --cuda-info lines and --dump-dir.
 *
 * Pipeline position: fuse -> cuda -> [cuda_program] -> nvrtc. */
#include "cuda_program.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "diag.h"
#include "rt_kernels_cu.h" /* mbt_rt_kernels_cu: runtime/kernels/rt_kernels.cu as a string (the Makefile makes it) */

/* ---- the translation unit ------------------------------------------------------------------- */

/* What f printed, as a string in ar. */
static const char *cuda_capture(FILE *f, char **buf, size_t *len, Arena *ar) {
    if (fclose(f) != 0) INTERNAL("cuda: cannot print to memory");
    const char *s = arena_strndup(ar, *buf ? *buf : "", *buf ? *len : 0);
    free(*buf);
    *buf = NULL;
    return s;
}

CudaProgram *cuda_program_build(const CudaSchedule *s, int n, Arena *ar) {
    CudaProgram *p = arena_alloc(ar, sizeof *p);
    int total = 0, half = 0, attn = 0, kv = 0;
    for (int i = 0; i < n; i++) total += s[i].r ? s[i].r->nkernels : 0;
    p->kernels = arena_alloc(ar, sizeof(Kernel *) * (size_t)(total + 1));
    p->notes = arena_alloc(ar, sizeof(char *) * (size_t)(total + 1));
    p->launch = arena_alloc(ar, sizeof(CudaLaunch) * (size_t)(total + 1));
    p->kernel_source = arena_alloc(ar, sizeof(char *) * (size_t)(total + 1));
    p->same_as = arena_alloc(ar, sizeof(int) * (size_t)(total + 1));
    const char **code = arena_alloc(ar, sizeof(char *) * (size_t)(total + 1)); /* the function, unnamed */
    int *disjoint = arena_alloc(ar, sizeof(int) * (size_t)(total + 1));
    for (int i = 0; i < n; i++)
        for (int k = 0; s[i].r && k < s[i].r->nkernels; k++) {
            Kernel *kn = s[i].r->kernels[k];
            p->notes[p->nkernels] = fuse_kernel_ops_note(s[i].g, kn, ar);
            disjoint[p->nkernels] = s[i].disjoint;
            half |= cuda_kernel_uses_half(kn);
            if (cuda_kernel_uses_attention(kn) > attn) attn = cuda_kernel_uses_attention(kn);
            kv |= cuda_kernel_uses_kv(kn);
            p->kernels[p->nkernels++] = kn;
        }
    char *buf = NULL;
    size_t len = 0;
    FILE *tu = open_memstream(&buf, &len);
    if (!tu) INTERNAL("cuda: cannot open a memory stream");
    cuda_emit_prelude(tu, half, attn, kv);
    for (int k = 0; k < p->nkernels; k++) {
        char *kbuf = NULL;
        size_t klen = 0;
        FILE *one = open_memstream(&kbuf, &klen);
        if (!one) INTERNAL("cuda: cannot open a memory stream");
        cuda_emit_kernel(one, p->kernels[k], p->notes[k], disjoint[k], &p->launch[k]);
        const char *text = cuda_capture(one, &kbuf, &klen, ar);
        const char *fn = strstr(text, "extern \"C\" __global__");
        const char *named = fn ? strstr(fn, arena_printf(ar, " %s(", p->kernels[k]->name)) : NULL;
        if (!named) INTERNAL("cuda: no function %s in its own text", p->kernels[k]->name);
        code[k] = arena_printf(ar, "%.*s%s", (int)(named - fn), fn, named + 1 + strlen(p->kernels[k]->name));
        p->same_as[k] = -1;
        for (int j = 0; j < k && p->same_as[k] < 0; j++)
            if (p->same_as[j] < 0 && strcmp(code[j], code[k]) == 0) p->same_as[k] = j;
        if (p->same_as[k] < 0) {
            fprintf(tu, "\n%s", text);
            p->nfunctions++;
        } else {
            /* the header alone, with the function it is launched as */
            const char *close = strstr(text, " */\n");
            fprintf(tu, "\n%.*s * code: the same as %s's: launched as %s\n */\n", (int)(close - text), text,
                    p->kernels[p->same_as[k]]->name, p->kernels[p->same_as[k]]->name);
        }
        char *pbuf = NULL;
        size_t plen = 0;
        FILE *alone = open_memstream(&pbuf, &plen);
        if (!alone) INTERNAL("cuda: cannot open a memory stream");
        cuda_emit_prelude(alone, cuda_kernel_uses_half(p->kernels[k]), cuda_kernel_uses_attention(p->kernels[k]),
                          cuda_kernel_uses_kv(p->kernels[k]));
        fprintf(alone, "\n%s", text);
        p->kernel_source[k] = cuda_capture(alone, &pbuf, &plen, ar);
    }
    /* the runtime's own kernels (gradient accumulation, scaling, the norm's sums), in every module */
    fprintf(tu, "\n%s", mbt_rt_kernels_cu);
    p->source = cuda_capture(tu, &buf, &len, ar);
    return p;
}

const char *cuda_program_function(const CudaProgram *p, int k) {
    return p->kernels[p->same_as[k] >= 0 ? p->same_as[k] : k]->name;
}

int cuda_parse_archs(const char *list, const char **archs, int max, Arena *ar, const char **err) {
    int n = 0;
    const char *q = list;
    if (strcmp(list, "none") == 0) return 0;
    for (;;) {
        const char *c = strchr(q, ',');
        size_t l = c ? (size_t)(c - q) : strlen(q);
        const char *a = arena_strndup(ar, q, l);
        int ok = l >= 5 && strncmp(a, "sm_", 3) == 0;
        for (size_t i = 3; ok && i < l; i++) ok = (a[i] >= '0' && a[i] <= '9') || (i == l - 1 && a[i] == 'a');
        if (!ok) {
            *err = arena_printf(ar, "'%s' in --cuda-arch is not an architecture like sm_80 or sm_90", a);
            return -1;
        }
        if (n == max) {
            *err = arena_printf(ar, "--cuda-arch names more than %d architectures", max);
            return -1;
        }
        archs[n++] = a;
        if (!c) break;
        q = c + 1;
    }
    return n;
}

/* ---- compiling --------------------------------------------------------------------------------- */

/* Writes size bytes to path. Returns 0, or 1 after a diag error. */
static int cuda_write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        diag_error_noloc("cannot write '%s': %s", path, strerror(errno));
        return 1;
    }
    size_t w = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || w != size) {
        diag_error_noloc("cannot write '%s': %s", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* The source lines the log names (`mbt_program.cu(123): error ...`), each with 2 lines around,
 * numbered; all of them when the log names none. */
static void cuda_print_numbered(FILE *out, const char *src, const char *log, const char *name) {
    int nlines = 1;
    for (const char *c = src; *c; c++) nlines += *c == '\n';
    char *want = calloc((size_t)nlines + 2, 1);
    if (!want) INTERNAL("cuda: out of memory");
    int any = 0;
    size_t nl = strlen(name);
    for (const char *c = log; c && (c = strstr(c, name)) != NULL; c += nl) {
        if (c[nl] != '(') continue;
        int line = atoi(c + nl + 1);
        for (int d = line - 2; d <= line + 2; d++)
            if (d >= 1 && d <= nlines) want[d] = 1, any = 1;
    }
    int line = 1, gap = 0;
    for (const char *c = src; *c; line++) {
        const char *e = strchr(c, '\n');
        int n = e ? (int)(e - c) : (int)strlen(c);
        if (!any || want[line]) {
            if (gap) fprintf(out, "     ...\n");
            fprintf(out, "%5d  %.*s\n", line, n, c);
            gap = 0;
        } else gap = 1;
        c += n + (e ? 1 : 0);
    }
    free(want);
}

int cuda_program_compile(const CudaProgram *p, const char *const *archs, int narch, int want_ptx, NvrtcResult *res,
                         const char *what, Arena *ar) {
    const char *why = NULL;
    Nvrtc *nv = nvrtc_open(ar, &why);
    if (!nv) {
        diag_error_noloc("%s needs NVRTC, which is not installed here: %s", what, why);
        diag_hint("install the CUDA toolkit (libnvrtc.so) or put its lib64 directory on LD_LIBRARY_PATH; "
                  "--emit=cuda prints the CUDA source without it");
        return 1;
    }
    static const char name[] = "mbt_program.cu";
    int top = 0; /* the highest architecture: the PTX a newer GPU JIT-compiles */
    for (int a = 1; a < narch; a++)
        if (atoi(archs[a] + 3) > atoi(archs[top] + 3)) top = a;
    for (int a = 0; a < narch; a++) {
        const char *err = NULL;
        int ptx = want_ptx == CUDA_PTX_ALL || (want_ptx == CUDA_PTX_HIGHEST && a == top);
        if (nvrtc_compile(nv, p->source, name, archs[a], ptx, &res[a], ar, &err) == 0) continue;
        char tmpl[] = "/tmp/mbt-cuda-XXXXXX.cu";
        int fd = mkstemps(tmpl, 3);
        const char *file = NULL;
        if (fd >= 0) {
            size_t len = strlen(p->source);
            if (write(fd, p->source, len) == (ssize_t)len) file = tmpl;
            close(fd);
        }
        fprintf(stderr, "the generated CUDA source (%s), the lines NVRTC's log names:\n", name);
        cuda_print_numbered(stderr, p->source, err, name);
        diag_error_noloc("%s", err);
        if (file)
            diag_note(span_none(), "the source is in %s; to reproduce: nvcc -arch=%s -cubin %s -I/usr/local/cuda/include %s",
                      file, archs[a], nvrtc_options_line(), file);
        diag_note(span_none(), "this is a bug in mbtc's CUDA back end (compiler/cuda.c): please report it with the files above");
        return 1;
    }
    return 0;
}

/* ---- SASS --------------------------------------------------------------------------------------- */

/* The first of `tool` in $CUDA_HOME/bin, the PATH, /usr/local/cuda/bin; or NULL. */
static const char *cuda_find_tool(const char *tool, Arena *ar) {
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        const char *p = arena_printf(ar, "%s/bin/%s", home, tool);
        if (access(p, X_OK) == 0) return p;
    }
    const char *path = getenv("PATH");
    for (const char *q = path; q && *q;) {
        const char *c = strchr(q, ':');
        size_t l = c ? (size_t)(c - q) : strlen(q);
        const char *p = arena_printf(ar, "%.*s/%s", (int)l, q, tool);
        if (l && access(p, X_OK) == 0) return p;
        if (!c) break;
        q = c + 1;
    }
    const char *p = arena_printf(ar, "/usr/local/cuda/bin/%s", tool);
    return access(p, X_OK) == 0 ? p : NULL;
}

const char *cuda_sass(const NvrtcResult *r, Arena *ar, const char **err) {
    const char *tool = cuda_find_tool("cuobjdump", ar), *flags = "-sass";
    if (!tool) tool = cuda_find_tool("nvdisasm", ar), flags = "";
    if (!tool) {
        *err = "--emit=sass needs cuobjdump or nvdisasm (CUDA toolkit), found in neither $CUDA_HOME/bin, the PATH nor "
               "/usr/local/cuda/bin";
        return NULL;
    }
    char tmpl[] = "/tmp/mbt-sass-XXXXXX.cubin";
    int fd = mkstemps(tmpl, 6);
    if (fd < 0) {
        *err = arena_printf(ar, "cannot create a temporary file for the cubin: %s", strerror(errno));
        return NULL;
    }
    ssize_t w = write(fd, r->cubin, r->cubin_size);
    close(fd);
    if (w != (ssize_t)r->cubin_size) {
        unlink(tmpl);
        *err = arena_printf(ar, "cannot write the cubin to %s", tmpl);
        return NULL;
    }
    const char *cmd = arena_printf(ar, "'%s' %s '%s' 2>&1", tool, flags, tmpl);
    FILE *pipe = popen(cmd, "r");
    if (!pipe) {
        unlink(tmpl);
        *err = arena_printf(ar, "cannot run %s: %s", tool, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) INTERNAL("cuda: cannot open a memory stream");
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, pipe)) > 0) fwrite(chunk, 1, got, mem);
    int st = pclose(pipe);
    const char *text = cuda_capture(mem, &buf, &len, ar);
    unlink(tmpl);
    if (st != 0) {
        *err = arena_printf(ar, "%s %s failed (status %d): %s", tool, flags, st, text);
        return NULL;
    }
    return text;
}

/* ---- listings and the dump directory ------------------------------------------------------------ */

/* The blocks of `threads` threads an SM of architecture `arch` can hold with a kernel's registers
 * (a thread) and static shared memory (a block), as the CUDA occupancy calculator counts them:
 * registers are allocated per warp in units of 256, shared memory per block in units of 128 bytes
 * plus the 1 KB the driver reserves per block from sm_80 on, with the largest carveout of shared
 * memory; the limits per SM are those of the CUDA C++ Programming Guide's table of compute
 * capabilities. Sets *max_warps; -1 for an architecture not in the table. */
int cuda_occupancy(const char *arch, int threads, int registers, int shared, int *max_warps) {
    static const struct {
        const char *arch;
        int warps, blocks, shared, reserved;
    } lim[] = {
        {"sm_70", 64, 32, 96 * 1024, 0},     {"sm_75", 32, 16, 64 * 1024, 0},     {"sm_80", 64, 32, 164 * 1024, 1024},
        {"sm_86", 48, 16, 100 * 1024, 1024}, {"sm_87", 48, 16, 164 * 1024, 1024}, {"sm_89", 48, 24, 100 * 1024, 1024},
        {"sm_90", 64, 32, 228 * 1024, 1024},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
        if (strcmp(arch, lim[i].arch) != 0) continue;
        int warps = (threads + 31) / 32, warp_regs = (registers * 32 + 255) / 256 * 256;
        int blocks = lim[i].blocks < lim[i].warps / warps ? lim[i].blocks : lim[i].warps / warps;
        if (warp_regs > 0 && 65536 / warp_regs / warps < blocks) blocks = 65536 / warp_regs / warps;
        int per_block = (shared + lim[i].reserved + 127) / 128 * 128;
        if (per_block > 0 && lim[i].shared / per_block < blocks) blocks = lim[i].shared / per_block;
        *max_warps = lim[i].warps;
        return blocks;
    }
    return -1;
}

void cuda_print_info(FILE *out, const CudaProgram *p, const NvrtcResult *res, int narch) {
    for (int k = 0; k < p->nkernels; k++) {
        fprintf(out, "# ptxas %s:", p->kernels[k]->name);
        for (int a = 0; a < narch; a++) {
            const NvrtcKernelInfo *ki = nvrtc_find(&res[a], cuda_program_function(p, k));
            if (!ki) INTERNAL("cuda: ptxas reported nothing for kernel %s (%s)", p->kernels[k]->name, res[a].arch);
            fprintf(out, "%s %s %d registers, %d B spill stores, %d B spill loads, %d B stack, %d B smem", a ? ";" : "",
                    res[a].arch, ki->registers, ki->spill_stores, ki->spill_loads, ki->stack, ki->shared);
            int max_warps, threads = p->launch[k].block,
                           blocks = cuda_occupancy(res[a].arch, threads, ki->registers, ki->shared, &max_warps);
            if (blocks >= 0)
                fprintf(out, ", occupancy %d blocks of %d threads (%d%% of %d warps)", blocks, threads,
                        blocks * ((threads + 31) / 32) * 100 / max_warps, max_warps);
        }
        fprintf(out, "\n");
    }
}

/* The PTX of one kernel: the module's header (up to the first entry) and that entry. */
static const char *cuda_ptx_of(const char *ptx, const char *kname, Arena *ar) {
    const char *first = strstr(ptx, "// .globl");
    const char *at = strstr(ptx, arena_printf(ar, ".entry %s(", kname));
    if (!first || !at) return NULL;
    const char *start = at;
    while (start > ptx && !(start[-1] == '\n' && strncmp(start, "\t// .globl", 10) == 0 && start < at)) start--;
    const char *end = strstr(at, "\n}\n");
    end = end ? end + 3 : at + strlen(at);
    return arena_printf(ar, "%.*s%.*s", (int)(first - ptx), ptx, (int)(end - start), start);
}

/* The SASS of one kernel: cuobjdump's `Function : NAME` section. */
static const char *cuda_sass_of(const char *sass, const char *kname, Arena *ar) {
    const char *at = strstr(sass, arena_printf(ar, "Function : %s\n", kname));
    if (!at) return NULL;
    const char *end = strstr(at + 1, "Function : ");
    if (end)
        while (end > at && end[-1] != '\n') end--;
    return arena_printf(ar, "%.*s", end ? (int)(end - at) : (int)strlen(at), at);
}

int cuda_program_dump(const CudaProgram *p, const NvrtcResult *res, int narch, const char *dir, Arena *ar) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        diag_error_noloc("cannot create the dump directory '%s': %s", dir, strerror(errno));
        return 1;
    }
    if (cuda_write_file(arena_printf(ar, "%s/program.cu", dir), p->source, strlen(p->source))) return 1;
    const char **sass = arena_alloc(ar, sizeof(char *) * (size_t)(narch + 1));
    const char *sass_err = NULL;
    for (int a = 0; a < narch; a++) {
        const NvrtcResult *r = &res[a];
        if (cuda_write_file(arena_printf(ar, "%s/program.%s.cubin", dir, r->arch), r->cubin, r->cubin_size) ||
            cuda_write_file(arena_printf(ar, "%s/program.%s.ptxas.log", dir, r->arch), r->log, strlen(r->log)) ||
            (r->ptx && cuda_write_file(arena_printf(ar, "%s/program.%s.ptx", dir, r->arch), r->ptx, strlen(r->ptx))))
            return 1;
        sass[a] = cuda_sass(r, ar, &sass_err);
    }
    if (sass_err) diag_warning(span_none(), "no .sass files in '%s': %s", dir, sass_err);
    for (int k = 0; k < p->nkernels; k++) {
        const Kernel *kn = p->kernels[k];
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        if (!mem) INTERNAL("cuda: cannot open a memory stream");
        fprintf(mem, "kernel %s: %s, grid %" PRId64 "\n", kn->name, kir_kind_name(kn->kind), kn->grid);
        if (p->notes[k] && *p->notes[k]) fprintf(mem, "ops:\n%s", p->notes[k]);
        fprintf(mem, "body:\n");
        kir_print_body(mem, kn, 2);
        const char *kir = cuda_capture(mem, &buf, &len, ar);
        if (cuda_write_file(arena_printf(ar, "%s/%s.kir", dir, kn->name), kir, strlen(kir)) ||
            cuda_write_file(arena_printf(ar, "%s/%s.cu", dir, kn->name), p->kernel_source[k], strlen(p->kernel_source[k])))
            return 1;
        for (int a = 0; a < narch; a++) {
            const char *fname = cuda_program_function(p, k);
            const char *ptx = res[a].ptx ? cuda_ptx_of(res[a].ptx, fname, ar) : NULL;
            if (ptx && cuda_write_file(arena_printf(ar, "%s/%s.%s.ptx", dir, kn->name, res[a].arch), ptx, strlen(ptx))) return 1;
            const char *s = sass[a] ? cuda_sass_of(sass[a], fname, ar) : NULL;
            if (s && cuda_write_file(arena_printf(ar, "%s/%s.%s.sass", dir, kn->name, res[a].arch), s, strlen(s))) return 1;
        }
    }
    return 0;
}
