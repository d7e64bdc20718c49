/* test_cuda.c - unit tests of the CUDA back end's code generator (compiler/cuda.c) and NVRTC
 * driver (compiler/nvrtc.c). No GPU is needed: the generated source is checked for the launch
 * geometry and forms cuda.c promises, and, where libnvrtc loads, compiled for sm_80 with ptxas's
 * figures read back. Without NVRTC the compiling cases print a `# skipped` line and are neither
 * passed nor failed (the cuda layer of tests/run.sh reports the SKIP).
 *
 * What is covered:
 *   - nvrtc_parse_ptxas on a fixed ptxas -v log (registers, spills, stack, shared memory);
 *   - thread mode with float4 for unit-stride f32 kernels, vectors for broadcast rows (gid % n)
 *     and one load for gid / n where 4 divides n, MbtBf16x4 for bf16, scalar otherwise;
 *   - warp mode for short reductions, block mode with shared memory for long ones; a loop that
 *     loads and stores one buffer (a scatter) or reads its own accumulator is never split;
 *   - with NVRTC: the kernels above compile with zero spills, a test kernel built to spill (96
 *     live floats under __launch_bounds__(1024, 2), 32 registers) reports spills, and a syntax
 *     error comes back as an error carrying NVRTC's log. */
#include <math.h>

#include "kir_build.h"
#include "unit.h"

#include "arena.h"
#include "cuda.h"
#include "kir.h"
#include "cuda_program.h"
#include "nvrtc.h"

/* ---- building kernels ------------------------------------------------------------------------ */

/* The kernel's CUDA text and launch. */
static char *emit(const Kernel *k, CudaLaunch *L) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) exit(1);
    cuda_emit_kernel(f, k, "%1 test  test.mbt:1:1\n", 1, L);
    fclose(f);
    return buf;
}

/* out[gid] = x[gid] * 2 + y[gid], grid n */
static KB *k_axpy(int64_t n) {
    KB *t = kb_start("k_axpy", KK_ELEMENTWISE, n);
    int x = B1(t, DT_F32, n, 0), y = B1(t, DT_F32, n, 0), o = B1(t, DT_F32, n, 1);
    int lx = kb_load(t->b, x, t->g), ly = kb_load(t->b, y, t->g);
    int m = kb_op(t->b, K_MUL, KT_F32, 2, lx, kb_const_f(t->b, KT_F32, 2.0), -1);
    kb_store(t->b, o, t->g, kb_op(t->b, K_ADD, KT_F32, 2, m, ly, -1));
    kir_finish(t->k);
    return t;
}

/* out[gid] = max over i < len of x[gid * len + i], then sum of exp(x - max): a softmax row */
static KB *k_row(const char *name, int64_t rows, int64_t len) {
    KB *t = kb_start(name, KK_ROW, rows);
    int x = B1(t, DT_F32, rows * len, 0), o = B1(t, DT_F32, rows, 1);
    int base = kb_op(t->b, K_MUL, KT_I64, 2, t->g, kb_const_i(t->b, KT_I64, len), -1);
    int mx = kb_acc(t->b, KT_F32, K_MAX, -INFINITY);
    int i = kb_loop(t->b, len);
    kb_accum(t->b, mx, kb_load(t->b, x, kb_op(t->b, K_ADD, KT_I64, 2, base, i, -1)));
    kb_endloop(t->b);
    int s = kb_acc(t->b, KT_F32, K_ADD, 0.0);
    int j = kb_loop(t->b, len);
    int v = kb_load(t->b, x, kb_op(t->b, K_ADD, KT_I64, 2, base, j, -1));
    kb_accum(t->b, s, kb_op(t->b, K_EXP, KT_F32, 1, kb_op(t->b, K_SUB, KT_F32, 2, v, mx, -1), -1, -1));
    kb_endloop(t->b);
    kb_store(t->b, o, t->g, s);
    kir_finish(t->k);
    return t;
}

/* ---- cases ------------------------------------------------------------------------------------- */

static void parse_ptxas(void) {
    static const char log[] = "ptxas info    : 0 bytes gmem\n"
                              "ptxas info    : Compiling entry function 'k_a' for 'sm_90'\n"
                              "ptxas info    : Function properties for k_a\n"
                              "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
                              "ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem, 400 bytes cmem[0]\n"
                              "ptxas info    : Compiling entry function 'k_b' for 'sm_90'\n"
                              "ptxas info    : Function properties for k_b\n"
                              "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                              "ptxas info    : Used 14 registers, used 0 barriers\n";
    Arena ar = {0};
    NvrtcKernelInfo *info = NULL;
    int n = nvrtc_parse_ptxas(log, &info, &ar);
    CHECK(n == 2, "found %d kernels, want 2", n);
    if (n == 2) {
        CHECK(strcmp(info[0].name, "k_a") == 0, "first kernel '%s'", info[0].name);
        CHECK(info[0].registers == 40 && info[0].spill_stores == 12 && info[0].spill_loads == 16 && info[0].stack == 8 &&
                  info[0].shared == 64,
              "k_a: %d registers, %d/%d spills, %d stack, %d smem", info[0].registers, info[0].spill_stores, info[0].spill_loads,
              info[0].stack, info[0].shared);
        CHECK(info[1].registers == 14 && info[1].spill_stores == 0 && info[1].shared == 0, "k_b: %d registers",
              info[1].registers);
    }
    arena_free(&ar);
}

static void thread_mode_vectorised(void) {
    KB *t = k_axpy(4096);
    CudaLaunch L;
    char *s = emit(t->k, &L);
    CHECK(L.mode == CUDA_THREAD && L.vector == 4 && L.block == 256, "mode %s, vector %d", cuda_mode_name(L.mode), L.vector);
    CHECK(L.blocks == 4, "%lld blocks for 4096 items, 4 a thread, 256 threads", (long long)L.blocks);
    CHECK(strstr(s, "const float4 p0v = *reinterpret_cast<const float4 *>(p0 + gid0);") != NULL, "no float4 load of p0");
    CHECK(strstr(s, "*reinterpret_cast<float4 *>(p2 + gid0) = p2v;") != NULL, "no float4 store of p2");
    CHECK(strstr(s, "const float *__restrict__ p0") != NULL, "p0 is not const __restrict__");
    CHECK(strstr(s, "%1 test  test.mbt:1:1") != NULL, "the fused ops' note is missing");
    free(s);
    /* a grid not a multiple of 4: scalar */
    KB *u = k_axpy(1001);
    s = emit(u->k, &L);
    CHECK(L.vector == 1 && !strstr(s, "float4"), "grid 1001 vectorised");
    free(s);
    kb_done(t), kb_done(u);
}

/* out[gid] = x[gid OP n] (+ y[gid] when `also_at_gid`): one kernel of the broadcast cases */
static char *emit_broadcast(KOp op, int64_t n, int also_at_gid, DType dt, CudaLaunch *L) {
    KB *t = kb_start("k_bcast", KK_ELEMENTWISE, 1024);
    int x = B1(t, dt, also_at_gid ? 1024 : (op == K_IMOD ? n : 1024 / n), 0), o = B1(t, DT_F32, 1024, 1);
    int off = kb_op(t->b, op, KT_I64, 2, t->g, kb_const_i(t->b, KT_I64, n), -1);
    KType vt = dt == DT_F32 ? KT_F32 : KT_BF16;
    int v = kb_load(t->b, x, off);
    if (also_at_gid) v = kb_op(t->b, K_ADD, vt, 2, v, kb_load(t->b, x, t->g), -1);
    if (vt != KT_F32) v = kb_op(t->b, K_CAST, KT_F32, 1, v, -1, -1);
    kb_store(t->b, o, t->g, v);
    kir_finish(t->k);
    char *s = emit(t->k, L);
    kb_done(t);
    return s;
}

/* Index division and remainder of gid by a constant: in 32 bits while the grid is at most 2^32
 * (gid below it), in 64 past that; below 2^31 the remainder is an `int` (index_narrowing). */
static void index_divmod_width(void) {
    for (int big = 0; big < 2; big++) {
        const int64_t grid = big ? ((int64_t)1 << 32) + 8 : 1024;
        KB *t = kb_start("k_divmod", KK_ELEMENTWISE, grid);
        int x = B1(t, DT_F32, 6, 0), o = B1(t, DT_F32, grid, 1);
        int off = kb_op(t->b, K_IMOD, KT_I64, 2, t->g, kb_const_i(t->b, KT_I64, 6), -1);
        kb_store(t->b, o, t->g, kb_load(t->b, x, off));
        kir_finish(t->k);
        CudaLaunch L;
        char *s = emit(t->k, &L);
        const char *want = big ? "(long long)((unsigned long long)gid % 6ULL)" : "const int imod2 = (int)((unsigned)gid % 6U);";
        CHECK(strstr(s, want) != NULL, "grid %lld: no `%s`", (long long)grid, want);
        free(s);
        kb_done(t);
    }
}

/* 32-bit index arithmetic (cuda.c's cuda_ranges): offsets whose every value fits in an int are
 * ints, computed from int operands; a product that can pass 2^31, and anything computed from it
 * or from a loaded i64 (data, not an index), stays 64-bit, reading a narrowed operand widened. */
static void index_narrowing(void) {
    const int64_t grid = 1024;
    KB *t = kb_start("k_narrow", KK_ELEMENTWISE, grid);
    int x = B1(t, DT_F32, 3 * grid + 5, 0), w = B1(t, DT_F32, 7, 0), d = B1(t, DT_I64, grid, 0), o = B1(t, DT_F32, grid, 1);
    int o2 = B1(t, DT_F32, grid, 1), o3 = B1(t, DT_F32, grid, 1);
    int m = OP2(t, K_MUL, KT_I64, t->g, C_i(t, KT_I64, 3)); /* %m: [0, 3069] */
    int a = OP2(t, K_ADD, KT_I64, m, C_i(t, KT_I64, 5));    /* [5, 3074] */
    ST(t, o, t->g, LD(t, x, a));
    int big = OP2(t, K_MUL, KT_I64, t->g, C_i(t, KT_I64, (int64_t)1 << 22)); /* up to 1023 * 2^22 > 2^31 */
    ST(t, o2, t->g, LD(t, w, OP2(t, K_IMOD, KT_I64, big, C_i(t, KT_I64, 7))));
    int v = LD(t, d, t->g); /* an i64 of data: no range */
    int mix = OP2(t, K_ADD, KT_I64, v, m);
    ST(t, o3, t->g, OP1(t, K_CAST, KT_F32, mix));
    kir_finish(t->k);
    CudaLaunch L;
    char *s = emit(t->k, &L);
    char want[160];
    snprintf(want, sizeof want, "const int mul%d = (int)gid * 3;", m);
    CHECK(strstr(s, want) != NULL, "no `%s`", want);
    snprintf(want, sizeof want, "const int add%d = mul%d + 5;", a, m);
    CHECK(strstr(s, want) != NULL, "no `%s`", want);
    snprintf(want, sizeof want, "p0[(long long)add%d]", a);
    CHECK(strstr(s, want) != NULL, "no `%s`", want);
    snprintf(want, sizeof want, "const long long mul%d = gid * 4194304LL;", big);
    CHECK(strstr(s, want) != NULL, "no `%s` (a product past 2^31 narrowed?)", want);
    /* below 2^32 still: an unsigned 32-bit remainder, kept as a long long (its operand is one) */
    snprintf(want, sizeof want, "const long long imod%d = (long long)((unsigned)mul%d %% 7U);", big + 2, big);
    CHECK(strstr(s, want) != NULL, "no `%s`", want);
    snprintf(want, sizeof want, "const long long add%d = load%d + (long long)mul%d;", mix, v, m);
    CHECK(strstr(s, want) != NULL, "no `%s` (data narrowed?)", want);
    free(s);
    kb_done(t);
}

/* A select whose arm has loads of its own (cuda.c's cuda_arms) becomes an if/else with the arm's
 * offsets and loads inside; an arm of arithmetic on shared values stays a select, as does every
 * select of a kernel that loads a buffer it stores (a load moved past the store would change). */
static void select_arms(void) {
    for (int rmw = 0; rmw < 2; rmw++) {
        KB *t = kb_start("k_arms", KK_ELEMENTWISE, 64);
        int x = B1(t, DT_F32, 32, 0), y = B1(t, DT_F32, 32, 0), z = B1(t, DT_F32, 64, 0), o = B1(t, DT_F32, 64, 1);
        int lt = OP2(t, K_LT, KT_BOOL, t->g, C_i(t, KT_I64, 32));
        int xo = OP2(t, K_MIN, KT_I64, t->g, C_i(t, KT_I64, 31));
        int yo = OP2(t, K_MAX, KT_I64, OP2(t, K_SUB, KT_I64, t->g, C_i(t, KT_I64, 32)), C_i(t, KT_I64, 0));
        int lx = LD(t, x, xo), ly = LD(t, y, yo);
        int sel = kb_op(t->b, K_SELECT, KT_F32, 3, lt, lx, ly);
        int v = LD(t, rmw ? o : z, t->g); /* used by the condition too: not an arm's own */
        int pos = OP2(t, K_GT, KT_BOOL, v, C_f(t, KT_F32, 0.0));
        int sel2 = kb_op(t->b, K_SELECT, KT_F32, 3, pos, OP2(t, K_MUL, KT_F32, v, C_f(t, KT_F32, 2.0)), v);
        ST(t, o, t->g, OP2(t, K_ADD, KT_F32, sel, sel2));
        kir_finish(t->k);
        CudaLaunch L;
        char *s = emit(t->k, &L);
        char want[200];
        snprintf(want, sizeof want, "float select%d; /* each arm's own offsets and loads where it is taken */", sel);
        const char *at = strstr(s, want);
        if (rmw) CHECK(!at && !strstr(s, "each arm's own"), "a kernel loading what it stores got arms");
        else {
            CHECK(at != NULL, "no `%s`", want);
            snprintf(want, sizeof want, "if (lt%d) {", lt);
            const char *i1 = at ? strstr(at, want) : NULL;
            snprintf(want, sizeof want, "const float load%d = p0[(long long)min%d];", lx, xo);
            const char *l1 = i1 ? strstr(i1, want) : NULL;
            const char *e1 = l1 ? strstr(l1, "} else {") : NULL;
            snprintf(want, sizeof want, "const int sub%d = (int)gid - 32;", yo - 1);
            const char *s2 = e1 ? strstr(e1, want) : NULL;
            snprintf(want, sizeof want, "const float load%d = p1[(long long)max%d];", ly, yo);
            const char *l2 = s2 ? strstr(s2, want) : NULL;
            CHECK(i1 && l1 && e1 && s2 && l2 && strstr(l2, "}"), "select %%%d: the arms' chains are not inside its if/else:\n%s",
                  sel, s);
            snprintf(want, sizeof want, "float select%d;", sel2);
            CHECK(!strstr(s, want), "select %%%d (arithmetic arms) became an if/else", sel2);
        }
        free(s);
        kb_done(t);
    }
}

/* A broadcast row (gid mod n, 4 | n) is one vector at gid0 mod n; gid / n (4 | n) one scalar for
 * the four work items; other divisors, or one buffer read two ways, are not vectorised; 2-byte
 * elements come in 8-byte vectors. */
static void thread_mode_broadcasts(void) {
    CudaLaunch L;
    char *s = emit_broadcast(K_IMOD, 8, 0, DT_F32, &L);
    CHECK(L.vector == 4 &&
              strstr(s, "const float4 p0v = *reinterpret_cast<const float4 *>(p0 + (long long)((unsigned)gid0 % 8U));"),
          "gid %% 8: vector %d", L.vector);
    free(s);
    s = emit_broadcast(K_IDIV, 8, 0, DT_F32, &L);
    CHECK(L.vector == 4 && strstr(s, "const float p0s = p0[(long long)((unsigned)gid0 / 8U)];") && strstr(s, "= p0s;"),
          "gid / 8: vector %d", L.vector);
    free(s);
    s = emit_broadcast(K_IMOD, 6, 0, DT_F32, &L);
    CHECK(L.vector == 1 && !strstr(s, "float4"), "gid %% 6 vectorised");
    free(s);
    s = emit_broadcast(K_IMOD, 8, 1, DT_F32, &L);
    CHECK(L.vector == 1, "a buffer read at gid and at gid %% 8 vectorised");
    free(s);
    s = emit_broadcast(K_IMOD, 8, 0, DT_BF16, &L);
    CHECK(L.vector == 4 &&
              strstr(s, "const MbtBf16x4 p0v = *reinterpret_cast<const MbtBf16x4 *>(p0 + (long long)((unsigned)gid0 % 8U));") &&
              strstr(s, "__bfloat162float(p0v.w)") && strstr(s, "float4 p1v;"),
          "bf16 gid %% 8: vector %d", L.vector);
    free(s);
}

static void warp_and_block_modes(void) {
    KB *t = k_row("k_row_short", 64, 100);
    CudaLaunch L;
    char *s = emit(t->k, &L);
    CHECK(L.mode == CUDA_WARP && L.block == 128 && L.per_block == 4 && L.blocks == 16, "short rows: %s, block %d, %lld blocks",
          cuda_mode_name(L.mode), L.block, (long long)L.blocks);
    CHECK(strstr(s, "acc3 = mbt_max(acc3, mbt_warp_reduce(acc3_part, MbtMax()));") != NULL, "no warp max tree");
    CHECK(strstr(s, "for (long long i4 = lane; i4 < 100LL; i4 += 32)") != NULL, "the loop is not split across lanes");
    CHECK(strstr(s, "if (lane == 0) p1[gid] =") != NULL, "the row's store is not made by lane 0 alone");
    free(s);
    KB *u = k_row("k_row_long", 4, 4096);
    s = emit(u->k, &L);
    CHECK(L.mode == CUDA_BLOCK && L.block == 256 && L.shared == 64 && L.blocks == 4, "long rows: %s, block %d, shared %d",
          cuda_mode_name(L.mode), L.block, L.shared);
    CHECK(strstr(s, "mbt_block_reduce<8>(acc") != NULL, "no block tree");
    CHECK(strstr(s, "i4 += 256)") != NULL, "the loop is not split across the block");
    free(s);
    kb_done(t), kb_done(u);
}

static void never_split(void) {
    /* a scatter: out[idx[r]] += g[r] for r < 64, per column gid: the loop loads and stores out */
    KB *t = kb_start("k_scatter", KK_SCATTER, 8);
    int idx = B1(t, DT_I32, 64, 0), g = B1(t, DT_F32, 512, 0), o = B1(t, DT_F32, 128, 1);
    int cnt = kb_acc(t->b, KT_F32, K_ADD, 0.0);
    int r = kb_loop(t->b, 64);
    int row = kb_op(t->b, K_CAST, KT_I64, 1, kb_load(t->b, idx, r), -1, -1);
    int off = kb_op(t->b, K_ADD, KT_I64, 2, kb_op(t->b, K_MUL, KT_I64, 2, row, kb_const_i(t->b, KT_I64, 8), -1), t->g, -1);
    int gv = kb_load(t->b, g,
                     kb_op(t->b, K_ADD, KT_I64, 2, kb_op(t->b, K_MUL, KT_I64, 2, r, kb_const_i(t->b, KT_I64, 8), -1), t->g, -1));
    kb_store(t->b, o, off, kb_op(t->b, K_ADD, KT_F32, 2, kb_load(t->b, o, off), gv, -1));
    kb_accum(t->b, cnt, gv);
    kb_endloop(t->b);
    kir_finish(t->k);
    CudaLaunch L;
    char *s = emit(t->k, &L);
    CHECK(L.mode == CUDA_THREAD, "a read-modify-write loop was split: %s", cuda_mode_name(L.mode));
    free(s);
    kb_done(t);
    /* a loop reading the accumulator it folds into (a running value) */
    t = kb_start("k_running", KK_ROW, 8);
    int x = B1(t, DT_F32, 800, 0);
    o = B1(t, DT_F32, 800, 1);
    int a = kb_acc(t->b, KT_F32, K_ADD, 0.0);
    int i = kb_loop(t->b, 100);
    int at = kb_op(t->b, K_ADD, KT_I64, 2, kb_op(t->b, K_MUL, KT_I64, 2, t->g, kb_const_i(t->b, KT_I64, 100), -1), i, -1);
    kb_accum(t->b, a, kb_load(t->b, x, at));
    kb_store(t->b, o, at, a);
    kb_endloop(t->b);
    kir_finish(t->k);
    s = emit(t->k, &L);
    CHECK(L.mode == CUDA_THREAD, "a cumulative sum was split: %s", cuda_mode_name(L.mode));
    free(s);
    kb_done(t);
}

/* ---- with NVRTC ------------------------------------------------------------------------------------ */

static Nvrtc *nv;

static void nvrtc_generated_kernels(void) {
    KB *ks[4] = {k_axpy(4096), k_axpy(1001), k_row("k_row_short", 64, 100), k_row("k_row_long", 4, 4096)};
    ks[1]->k->name = "k_axpy_tail";
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cuda_emit_prelude(f, 0, 0, 0);
    for (int i = 0; i < 4; i++) cuda_emit_kernel(f, ks[i]->k, NULL, 1, NULL);
    fclose(f);
    Arena ar = {0};
    NvrtcResult r;
    const char *err = NULL;
    int rc = nvrtc_compile(nv, buf, "test.cu", "sm_80", 1, &r, &ar, &err);
    CHECK(rc == 0, "NVRTC failed: %s", err ? err : "?");
    if (rc == 0) {
        CHECK(r.nkernels == 4, "ptxas reported %d kernels", r.nkernels);
        CHECK(r.ptx && strstr(r.ptx, ".entry k_row_long("), "no PTX entry for k_row_long");
        CHECK(r.cubin_size > 0, "empty cubin");
        for (int i = 0; i < r.nkernels; i++)
            CHECK(r.info[i].spill_stores == 0 && r.info[i].spill_loads == 0 && r.info[i].stack == 0, "%s spills: %d/%d, stack %d",
                  r.info[i].name, r.info[i].spill_stores, r.info[i].spill_loads, r.info[i].stack);
        const NvrtcKernelInfo *lk = nvrtc_find(&r, "k_row_long");
        CHECK(lk && lk->shared == 64, "k_row_long: %d B smem, want 64", lk ? lk->shared : -1);
    }
    free(buf);
    arena_free(&ar);
    for (int i = 0; i < 4; i++) kb_done(ks[i]);
}

static void nvrtc_reports_spills(void) {
    static const char src[] = "extern \"C\" __global__ void __launch_bounds__(1024, 2) mbt_test_spill(float *p, int n) {\n"
                              "    float a[96];\n"
                              "#pragma unroll\n"
                              "    for (int i = 0; i < 96; i++) a[i] = p[i * n + threadIdx.x];\n"
                              "    float s = 0.0f;\n"
                              "#pragma unroll\n"
                              "    for (int i = 0; i < 96; i++) s += a[i] * a[95 - i] * a[(i * 7) % 96];\n"
                              "    p[threadIdx.x] = s;\n"
                              "}\n";
    Arena ar = {0};
    NvrtcResult r;
    const char *err = NULL;
    int rc = nvrtc_compile(nv, src, "spill.cu", "sm_80", 0, &r, &ar, &err);
    CHECK(rc == 0, "NVRTC failed: %s", err ? err : "?");
    const NvrtcKernelInfo *k = rc == 0 ? nvrtc_find(&r, "mbt_test_spill") : NULL;
    CHECK(k && k->registers <= 32 && k->spill_stores > 0 && k->spill_loads > 0,
          "the spilling kernel: %d registers, %d/%d B spills", k ? k->registers : -1, k ? k->spill_stores : -1,
          k ? k->spill_loads : -1);
    arena_free(&ar);
}

static void nvrtc_error_has_log(void) {
    Arena ar = {0};
    NvrtcResult r;
    const char *err = NULL;
    int rc = nvrtc_compile(nv, "extern \"C\" __global__ void k(float *p) { p[0] = undeclared; }\n", "bad.cu", "sm_90", 0, &r, &ar,
                           &err);
    CHECK(rc == 1, "a kernel using an undeclared name compiled");
    CHECK(err && strstr(err, "bad.cu(1)") && strstr(err, "undeclared"), "the error lacks NVRTC's log: %s", err ? err : "(none)");
    arena_free(&ar);
}

/* cuda_occupancy against what the CUDA occupancy calculator gives, and one case measured: Nsight
 * Compute's 12.5% (2 blocks of 128 threads) for the wmma attention forward's 175 registers and
 * 41216 B of shared memory on an H100 (../shared/perf/h100-2026-11-25.md). */
static void occupancy(void) {
    int w = 0;
    CHECK(cuda_occupancy("sm_90", 128, 175, 41216, &w) == 2 && w == 64, "the measured H100 case: %d blocks",
          cuda_occupancy("sm_90", 128, 175, 41216, &w));
    CHECK(cuda_occupancy("sm_80", 256, 32, 0, &w) == 8, "32 registers, 256 threads: the warps' limit, 8 blocks");
    CHECK(cuda_occupancy("sm_80", 128, 20, 0, &w) == 16, "few registers, 128 threads: 16 blocks (64 warps)");
    CHECK(cuda_occupancy("sm_80", 1024, 16, 0, &w) == 2, "1024 threads: 2 blocks");
    CHECK(cuda_occupancy("sm_80", 128, 98, 36864, &w) == 4, "98 registers (104 allocated): 19 warps, 4 blocks");
    CHECK(cuda_occupancy("sm_80", 128, 32, 48 * 1024, &w) == 3, "48 KB + 1 KB reserved of 164 KB: 3 blocks");
    CHECK(cuda_occupancy("sm_90", 128, 32, 48 * 1024, &w) == 4, "48 KB + 1 KB reserved of 228 KB: 4 blocks");
    CHECK(cuda_occupancy("sm_75", 128, 32, 0, &w) == 8 && w == 32, "sm_75: 32 warps an SM, 8 blocks");
    CHECK(cuda_occupancy("sm_86", 128, 255, 0, &w) == 2 && w == 48, "255 registers (256): 8 warps, 2 blocks");
    CHECK(cuda_occupancy("sm_100", 128, 32, 0, &w) == -1, "an architecture not in the table");
}

int main(void) {
    RUN(parse_ptxas);
    RUN(occupancy);
    RUN(thread_mode_vectorised);
    RUN(thread_mode_broadcasts);
    RUN(index_divmod_width);
    RUN(index_narrowing);
    RUN(select_arms);
    RUN(warp_and_block_modes);
    RUN(never_split);
    Arena ar = {0};
    const char *why = NULL;
    nv = nvrtc_open(&ar, &why);
    if (nv) {
        RUN(nvrtc_generated_kernels);
        RUN(nvrtc_reports_spills);
        RUN(nvrtc_error_has_log);
    } else printf("# skipped the NVRTC cases: %s\n", why);
    return unit_finish();
}
