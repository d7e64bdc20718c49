# Makefile - builds mbtc (build/mbtc) and runs the tests.
#
#   make              check/install build dependencies, build build/mbtc
#   make demo         build, generate data, compile and train examples/tiny.mbt (~2 min on 2 cores),
#                     print its loss against the known optimum and generated samples
#   make test         everything below `make test` in docs/testing.md (ends with "N passed, N failed")
#   make fuzz         run the front-end fuzzer until stopped (FUZZ_SECONDS=N to bound it;
#                     FUZZ_TARGET=safetensors fuzzes the safetensors reader instead, and data,
#                     state, cli or verify_step the executable's inputs: docs/testing.md)
#   make bench        CPU training step time against PyTorch (docs/bench.md; not part of make test;
#                     BENCH_ARGS="--rounds 5 --threads 4 --cases tiny" passes options to bench/run.py)
#   make test-gpu     the training step with --device cuda against the CPU's, reruns, MBT_DEBUG and
#                     MBT_TRACE (tests/gpu/run.sh, docs/testing.md; prints SKIP without a GPU)
#   make bench-gpu    GPT-2 124M on one GPU: mbt against PyTorch eager/compiled, f32/bf16, MFU
#                     (bench/gpu.py, docs/bench.md; SKIP without a GPU; BENCH_GPU_ARGS passes options)
#   make asan         build a copy with AddressSanitizer + UBSan in build/asan
#   make format       format the C sources with clang-format-19 and .clang-format (tools/format.sh;
#                     make test's format layer checks them)
#   make clean
#
#   make install      PREFIX=DIR (default /usr/local): mbtc, its runtime library and the stdlib;
#                     the tree can be moved (docs/install.md)
#   make dist         the same as a relocatable tarball, build/mbt-VERSION-ARCH.tar.gz
#
# Variables: LLVM_CONFIG (default llvm-config-19), LLVM_STATIC=1 (link LLVM into mbtc), CUDA_HOME (default /usr/local/cuda),
# BUILD (output directory, default build), SAN=1 (sanitizers), OPENBLAS_DIR / OPENBLAS_INC /
# BLAS_LIBS (where OpenBLAS is and how executables link it; see the runtime section).

BUILD       ?= build
CC          ?= cc
LEMON       ?= lemon
LEMPAR      ?= /usr/share/lemon/lempar.c
RE2C        ?= re2c
CLANG_FUZZ  ?= clang-19
FUZZ_SECONDS ?= 0
FUZZ_TARGET ?= frontend

WARN     = -Wall -Wextra -Werror
CSTD     = -std=c11 -D_GNU_SOURCE
OPT      ?= -O2 -g
SAN_KINDS = address,undefined
SANFLAGS = $(if $(SAN),-fsanitize=$(SAN_KINDS) -fno-omit-frame-pointer -fno-sanitize-recover=all)
# Every object writes its header dependencies next to itself (-MMD -MP; included at the end), so
# editing any header rebuilds exactly what includes it.
DEPFLAGS = -MMD -MP

# ---- the compiler's folders, in pipeline order (docs/architecture.md) -------------------------
#   support/  arena, diagnostics, install paths  front/   lexer, grammar, AST, modules
#   sema/     names, types, shapes, settings     ir/      graph IR, its builder, autodiff
#   fuse/     fusion into launches               kir/     the kernel IR
#   plan/     the step program, the memory plan  backend/cpu, backend/cuda   LLVM, CUDA C + NVRTC
#   host/     host code, descriptor, linking     ref/     the float64 references, verify-step
# main.c is the command line, pipeline.c the stage table.
COMPILER_DIRS = compiler compiler/support compiler/front compiler/sema compiler/ir compiler/fuse compiler/kir \
                compiler/plan compiler/backend/cpu compiler/backend/cuda compiler/host compiler/ref
RUNTIME_DIRS  = runtime runtime/base runtime/cpu runtime/gpu runtime/io runtime/exec runtime/cli runtime/comm runtime/serve runtime/offload
INC      = $(addprefix -I,$(COMPILER_DIRS)) -I$(BUILD)/gen
RT_INC   = $(addprefix -I,$(RUNTIME_DIRS))
CFLAGS_ALL = $(CSTD) $(OPT) $(WARN) $(SANFLAGS) $(INC) $(CFLAGS)
LDFLAGS_ALL = $(SANFLAGS) $(LDFLAGS)

ALL_COMPILER_SRCS = $(filter-out compiler/main.c,$(wildcard $(addsuffix /*.c,$(COMPILER_DIRS))))
# LLVM (the CPU back end and the host code): these files include llvm-c headers and are compiled
# with llvm-config's flags, its include directory as -isystem so that -Werror holds our code and
# not LLVM's headers. Deferred (`=`) because tools/deps.sh may install llvm-19-dev after this file
# is read. verify_step.c reads step dumps with the runtime's safetensors reader; pipeline.c, the
# stage table, drives them all. These stay out of LIB_SRCS (the fuzzer builds those alone) but go
# into libmbtc.a, and what calls them (mbtc, test_cpu) links LLVM_LIBS and libmbtrt.a.
LLVM_CONFIG ?= llvm-config-19
LLVM_CFLAGS  = $(patsubst -I%,-isystem %,$(shell $(LLVM_CONFIG) --cflags))
LLVM_COMPONENTS = core analysis passes target x86 orcjit executionengine mcjit native
# LLVM_STATIC=1 links LLVM's static archives (Debian's llvm-19-dev ships them) into mbtc and the
# tests that JIT, so that mbtc runs where LLVM's shared libraries are not installed (a GPU node).
# libstdc++, libgcc and zlib go in statically too. `--link-static --system-libs` also names
# libz3 and libxml2, which these components do not use, and -lzstd, which LLVM's compression
# does: its static archive where libzstd-dev is installed, else the runtime library libzstd.so.1
# (on every Debian and Ubuntu system: apt depends on it). `ldd build/mbtc` then lists libc, libm
# and at most libzstd.
ifeq ($(LLVM_STATIC),1)
ZSTD_LIB     = $(firstword $(wildcard /usr/lib/$(MULTIARCH)/libzstd.a /usr/lib/$(MULTIARCH)/libzstd.so.1) -lzstd)
LLVM_LIBS    = $(shell $(LLVM_CONFIG) --link-static --ldflags --libs $(LLVM_COMPONENTS)) $(ZSTD_LIB) \
               -static-libgcc -Wl,-Bstatic -lz -lstdc++ -Wl,-Bdynamic -lrt -ldl -lm
else
LLVM_LIBS    = $(shell $(LLVM_CONFIG) --ldflags --libs $(LLVM_COMPONENTS) --system-libs)
endif
LLVM_SRCS    = $(wildcard compiler/backend/cpu/*.c compiler/host/*.c) compiler/ref/verify_step.c compiler/pipeline.c
# step_dump.c (the step-dump reader of verify_step.c) needs the runtime's headers, not LLVM's: it
# stays out of LIB_SRCS too, and its fuzzer (fuzz_verify_step) links it with the safetensors reader.
RT_COMPILER_SRCS = compiler/ref/step_dump.c
LIB_SRCS     = $(filter-out $(LLVM_SRCS) $(RT_COMPILER_SRCS),$(ALL_COMPILER_SRCS))
GEN_SRCS     = $(BUILD)/gen/mbt.c $(BUILD)/gen/lexer.c

LIB_OBJS  = $(patsubst %.c,$(BUILD)/obj/%.o,$(ALL_COMPILER_SRCS)) $(BUILD)/obj/gen/mbt.o $(BUILD)/obj/gen/lexer.o
LLVM_OBJS = $(patsubst %.c,$(BUILD)/obj/%.o,$(LLVM_SRCS)) $(BUILD)/obj/compiler/main.o

UNIT_SRCS = $(wildcard tests/unit/test_*.c)
UNIT_BINS = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))

.PHONY: install dist all demo test test-quick test-gpu unit asan fuzz fuzz-build bench bench-gpu bench-serve clean deps deps-test format
.DELETE_ON_ERROR:

all: $(BUILD)/mbtc

deps:
	@tools/deps.sh build

$(BUILD)/.deps-ok: tools/deps.sh
	@mkdir -p $(BUILD)
	@tools/deps.sh build
	@touch $@

# ---- generated front end (never in the source tree) ------------------------------------------
# lemon exits non-zero when the grammar has conflicts, so a conflicting grammar fails the build.
# lempar.c is a prerequisite only once it exists: on a fresh machine tools/deps.sh (.deps-ok)
# installs lemon first, and a missing file must not stop make before that runs.
$(BUILD)/gen/mbt.c $(BUILD)/gen/mbt.h: compiler/front/mbt.y $(wildcard $(LEMPAR)) | $(BUILD)/.deps-ok
	@mkdir -p $(BUILD)/gen
	$(LEMON) -q -T$(LEMPAR) -d$(BUILD)/gen compiler/front/mbt.y

$(BUILD)/gen/lexer.c: compiler/front/lexer.re $(BUILD)/gen/mbt.h | $(BUILD)/.deps-ok
	@mkdir -p $(BUILD)/gen
	$(RE2C) -W --no-generation-date -o $@ compiler/front/lexer.re

# ---- objects -----------------------------------------------------------------------------------
# Generated headers every compiler object may include: they exist before the first compile, and
# afterwards the .d files name what each object really reads.
GEN_HDRS = $(BUILD)/gen/mbt.h $(BUILD)/gen/rt_kernels_cu.h $(BUILD)/gen/rt_attention_cuh.h $(BUILD)/gen/rt_attention_tc_cuh.h $(BUILD)/gen/rt_attention_fa2_cuh.h $(BUILD)/gen/rt_kv_attention_cuh.h

$(BUILD)/obj/compiler/%.o: compiler/%.c | $(GEN_HDRS) $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(OBJ_EXTRA) $(DEPFLAGS) -c $< -o $@

$(LLVM_OBJS): OBJ_EXTRA = $(LLVM_CFLAGS) $(RT_INC)
$(patsubst %.c,$(BUILD)/obj/%.o,$(RT_COMPILER_SRCS)): OBJ_EXTRA = $(RT_INC)
# mbtc finds its runtime library, the static libraries executables link and the stdlib relative to
# itself (compiler/support/install.c: an installed tree's <bindir>/../lib/mbt and
# <bindir>/../share/mbt/stdlib, else a build directory's); the build tree's paths are compiled in
# only as the last fallback of an uninstalled build (build/asan/mbtc). RT_LDLIBS_INSTALLED is
# RT_LDLIBS with each archive path made its bare name, which `make install` copies into lib/mbt.
RT_ARCHIVES = $(filter %.a,$(RT_LDLIBS))
RT_LDLIBS_INSTALLED = $(foreach w,$(RT_LDLIBS),$(if $(filter %.a,$(w)),$(notdir $(w)),$(w)))
$(BUILD)/obj/compiler/support/install.o: OBJ_EXTRA = -DMBT_SOURCE_STDLIB='"$(CURDIR)/stdlib"' \
    -DMBT_RT_LIB='"$(CURDIR)/$(BUILD)/libmbtrt.a"' -DMBT_RT_LDLIBS='"$(RT_LDLIBS)"' \
    -DMBT_RT_LDLIBS_INSTALLED='"$(RT_LDLIBS_INSTALLED)"'
# install.o bakes in RT_LDLIBS: a change of the libraries executables link must rebuild it.
$(BUILD)/obj/compiler/support/install.o: Makefile
# link.o bakes in the C compiler driver that links executables (CC, the one libmbtrt.a was built
# with: a sanitized libmbtrt needs that compiler's sanitizer runtime): a change must rebuild it.
$(BUILD)/obj/compiler/host/link.o: OBJ_EXTRA = $(LLVM_CFLAGS) $(RT_INC) -DMBT_LINK_CC='"$(CC)"'
$(BUILD)/obj/compiler/host/link.o: Makefile

# Generated code: same warnings, minus the unused-parameter noise lemon's template produces.
$(BUILD)/obj/gen/mbt.o: $(BUILD)/gen/mbt.c | $(GEN_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) -Wno-unused-parameter -Wno-unused-variable -c $< -o $@

$(BUILD)/obj/gen/lexer.o: $(BUILD)/gen/lexer.c | $(GEN_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) -c $< -o $@

$(BUILD)/libmbtc.a: $(LIB_OBJS)
	rm -f $@
	ar rcs $@ $^

# A stamp names how mbtc links LLVM (llvm-link.static or .shared), so that a change of LLVM_STATIC
# relinks it.
LLVM_LINK = $(BUILD)/llvm-link.$(if $(filter 1,$(LLVM_STATIC)),static,shared)
$(LLVM_LINK):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/llvm-link.*
	@touch $@

$(BUILD)/mbtc: $(BUILD)/obj/compiler/main.o $(BUILD)/libmbtc.a $(BUILD)/libmbtrt.a $(LLVM_LINK)
	$(CC) $(LDFLAGS_ALL) -o $@ $(filter-out $(LLVM_LINK),$^) $(LLVM_LIBS) $(JANSSON_LIBS) -lm

# ---- runtime (libmbtrt) -------------------------------------------------------------------------
# The library linked into every executable mbtc builds (runtime/rt.h is its whole surface; the
# ABI with generated code is runtime/rt_program.h), and the tools built on it. Runtime objects see
# only runtime/ headers: the runtime never includes the compiler. `all` gains the library and
# build/mbt-gendata (a second `all:` line adds prerequisites). main.c (the executables' `main`) is
# in the archive too: a linker takes it only when nothing else defines main.
# The GPU (gpu_api.c: the CUDA driver, cuBLASLt and NCCL through dlopen; gpu.c: device, module,
# memory, launches; gpu_blas.c: GEMMs on cuBLASLt; gpu_timing.c: MBT_DEBUG timing, MBT_TRACE) needs
# no CUDA to build or link; exec.c runs a program on the CPU or the GPU.
RT_SRCS  = $(wildcard $(addsuffix /*.c,$(RUNTIME_DIRS)))
RT_OBJS  = $(patsubst %.c,$(BUILD)/obj/%.o,$(RT_SRCS))

# OpenBLAS, from Debian's libopenblas-dev (tools/deps.sh installs it), whose default flavour is
# the pthread build in /usr/lib/<multiarch>/openblas-pthread. That package ships the static
# archive libopenblas.a, and executables link it statically when it is there: they then run on a
# machine without OpenBLAS installed (cblas_sgemm pulls no Fortran, so no libgfortran; the cost
# is ~25 MB of kernels for every CPU type in each executable). Without the archive they link
# -lopenblas. Override with OPENBLAS_DIR=, OPENBLAS_INC= or BLAS_LIBS=. These are deferred (`=`)
# so that they are looked up after tools/deps.sh has installed the package.
MULTIARCH    := $(shell $(CC) -print-multiarch 2>/dev/null)
OPENBLAS_DIR ?= /usr/lib/$(MULTIARCH)/openblas-pthread
OPENBLAS_INC ?= /usr/include/$(MULTIARCH)/openblas-pthread
BLAS_CFLAGS  = -I$(OPENBLAS_INC)
BLAS_LIBS    ?= $(if $(wildcard $(OPENBLAS_DIR)/libopenblas.a),$(OPENBLAS_DIR)/libopenblas.a,-lopenblas)
# jansson, from Debian's libjansson-dev (tools/deps.sh installs it): the runtime's one JSON reader
# and writer (runtime/io/json.c). The package ships the static libjansson.a, and executables link
# it statically when it is there, as they do OpenBLAS, so that they run on a machine without
# jansson installed (it adds ~50 KB); without the archive they link -ljansson. Override with
# JANSSON_LIBS=.
JANSSON_LIBS ?= $(if $(wildcard /usr/lib/$(MULTIARCH)/libjansson.a),/usr/lib/$(MULTIARCH)/libjansson.a,-ljansson)
# libmicrohttpd, from Debian's libmicrohttpd-dev (tools/deps.sh installs it): the HTTP server of
# `PROG serve` (runtime/serve/server.c; docs/serve.md says why this library). The package ships
# the static libmicrohttpd.a, linked as jansson's is; Debian builds it with HTTPS, so it needs
# GnuTLS, which is linked dynamically: libgnutls30 is on every Debian system (apt itself links
# it), while a static GnuTLS would drag in nettle, gmp, p11-kit and more. Without the archive,
# -lmicrohttpd. Override with MHD_LIBS=.
# GnuTLS is named by its soname (-l:libgnutls.so.30) where that is there, so that linking a program
# needs the runtime package alone, not libgnutls28-dev's libgnutls.so link.
MHD_GNUTLS = $(if $(wildcard /usr/lib/$(MULTIARCH)/libgnutls.so.30),-l:libgnutls.so.30,-lgnutls)
MHD_LIBS ?= $(if $(wildcard /usr/lib/$(MULTIARCH)/libmicrohttpd.a),/usr/lib/$(MULTIARCH)/libmicrohttpd.a $(MHD_GNUTLS),-lmicrohttpd)
# liburing, from Debian's liburing-dev (tools/deps.sh installs it): the NVMe store's asynchronous
# reads and writes (runtime/offload/store.c; docs/memory.md). The package ships the static
# liburing.a, linked as jansson's is (it adds ~20 KB and no dependency); without the archive,
# -luring. Override with URING_LIBS=.
URING_LIBS ?= $(if $(wildcard /usr/lib/$(MULTIARCH)/liburing.a),/usr/lib/$(MULTIARCH)/liburing.a,-luring)
# What an executable links after its own objects and build/libmbtrt.a. The compiler driver
# (mbtc -o) links generated programs with exactly this; tools and tests here use it too. -ldl is
# for dlopen (the GPU's libraries): part of libc since glibc 2.34, where -ldl links an empty stub.
# Under SAN=1 (make asan) it ends with the sanitizer flags, so that build/asan/mbtc -o links its
# executables (an object and a libmbtrt.a both instrumented) with the sanitizers' runtime.
RT_LDLIBS = $(BLAS_LIBS) $(JANSSON_LIBS) $(MHD_LIBS) $(URING_LIBS) -lpthread -ldl -lm $(SANFLAGS)

RT_CFLAGS = $(CSTD) $(OPT) $(WARN) $(SANFLAGS) $(RT_INC) $(BLAS_CFLAGS) $(CFLAGS)

all: $(BUILD)/libmbtrt.a $(BUILD)/mbt-gendata

$(BUILD)/obj/runtime/%.o: runtime/%.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/libmbtrt.a: $(RT_OBJS)
	rm -f $@
	ar rcs $@ $^

# The runtime's CUDA sources as C strings for the compiler: runtime/kernels/rt_kernels.cu (its own
# kernels, which compiler/cuda_program.c appends to every program's CUDA source) as mbt_rt_kernels_cu,
# and rt_attention.cuh (the attention templates compiler/cuda.c puts after the prelude) as
# mbt_rt_attention_cuh: each line becomes "line\n" with backslashes, double quotes, tabs and
# question marks (trigraphs, which -std=c11 enables) escaped.
CUDA_HOME ?= /usr/local/cuda
define cuda_string
	@mkdir -p $(BUILD)/gen
	{ printf '/* generated from $< by the Makefile: do not edit */\n'; \
	  printf 'static const char $(1)[] =\n'; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/?/\\?/g' -e 's/^/    "/' -e 's/$$/\\n"/' $<; \
	  printf '    "";\n'; } > $@.tmp && mv $@.tmp $@
endef
$(BUILD)/gen/%_cu.h: runtime/kernels/%.cu
	$(call cuda_string,mbt_$*_cu)
$(BUILD)/gen/%_cuh.h: runtime/kernels/%.cuh
	$(call cuda_string,mbt_$*_cuh)


# gpu_internal.h declares the CUDA types, constants and functions the runtime uses without
# including CUDA's headers. Where the toolkit's headers are, tests/unit/gpu_decls_check.c checks
# those declarations against them at compile time (skipped on a machine without CUDA).
GPU_DECLS_CHECK = $(if $(wildcard $(CUDA_HOME)/include/cuda.h),$(BUILD)/obj/runtime/gpu_decls.ok)
$(BUILD)/obj/runtime/gpu_decls.ok: tests/unit/gpu_decls_check.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(RT_CFLAGS) -isystem $(CUDA_HOME)/include -fsyntax-only -MMD -MP -MF $@.d -MT $@ $< && touch $@

all: $(GPU_DECLS_CHECK)

# bench/lora_products.c: fused LoRA's products timed alone (bench/lora.py, docs/bench.md).
all: $(BUILD)/bench/lora_products
$(BUILD)/bench/lora_products: bench/lora_products.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/bench
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# mbt-gendata: a synthetic token corpus with a known entropy rate (docs/runtime.md).
$(BUILD)/mbt-gendata: tools/gendata.c $(BUILD)/libmbtrt.a
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# Runtime unit tests link libmbtrt, not the compiler (the shorter stem wins over the rule below).
$(BUILD)/tests/test_rt_%: tests/unit/test_rt_%.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) -Itests/unit -Itests/cudaemu $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# A hand-written program on the RtProgram ABI (tests/runtime/bigram_program.c), linked the way
# mbtc will link generated ones: the program's object, libmbtrt (with its main) and RT_LDLIBS.
# bigram_micro16 is the same model with micro-batch 16 and no accumulation; test_rt_train runs both
# (and gendata) from its own directory.
BIGRAM_BINS = $(BUILD)/tests/bigram $(BUILD)/tests/bigram_micro16

$(BUILD)/tests/bigram: tests/runtime/bigram_program.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

$(BUILD)/tests/bigram_micro16: tests/runtime/bigram_program.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) -DBIGRAM_MICRO=16 -DBIGRAM_GLOBAL=16 $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

$(BUILD)/tests/test_rt_train: $(BIGRAM_BINS) $(BUILD)/mbt-gendata

# test_rt_gpu drives the GPU runtime through a CPU stand-in for the CUDA driver and cuBLASLt
# (tests/cudaemu/fake_cuda.c, fake_cublaslt.c), loaded from beside the test as both libraries.
$(BUILD)/tests/libmbt_fake_cuda.so: tests/cudaemu/fake_cuda.c tests/cudaemu/fake_cublaslt.c | $(BUILD)/.deps-ok
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) -Itests/cudaemu -shared -fPIC $(filter %.c,$^) -o $@ $(LDFLAGS_ALL) -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas

# ... and a stand-in for NCCL (tests/cudaemu/fake_nccl.c) for the emulated GPU's ranks (MBT_LIBNCCL).
$(BUILD)/tests/libmbt_fake_nccl.so: tests/cudaemu/fake_nccl.c | $(BUILD)/.deps-ok
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) -shared -fPIC $< -o $@ $(LDFLAGS_ALL) -lpthread

$(BUILD)/tests/test_rt_gpu: $(BUILD)/tests/libmbt_fake_cuda.so $(BUILD)/tests/libmbt_fake_nccl.so

# st_compare: the largest relative difference of the tensors two safetensors files share (the
# exec and verify layers of tests/run.sh compare weights and gradients with it).
$(BUILD)/tests/st_compare: tests/tools/st_compare.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# comm_check: the collectives across processes (tests/comm/run.sh runs it under mpirun and as tcp
# ranks; docs/parallel.md).
$(BUILD)/tests/comm_check: tests/comm/comm_check.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# sv_tokenize: the serving tokenizer (runtime/serve/tokenizer.c) from the command line, which the
# serve layer compares with Hugging Face's tokenizers.
$(BUILD)/tests/sv_tokenize: tests/tools/sv_tokenize.c $(BUILD)/libmbtrt.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(RT_CFLAGS) $(DEPFLAGS) $< $(BUILD)/libmbtrt.a $(RT_LDLIBS) -o $@ $(LDFLAGS_ALL)

# ---- tests -------------------------------------------------------------------------------------
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libmbtc.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) -Itests/unit $< $(BUILD)/libmbtc.a -lm -o $@ $(LDFLAGS_ALL)

# The CPU back end's tests JIT-compile kernels and the schedule: they include llvm-c headers and link LLVM.
$(BUILD)/tests/test_cpu $(BUILD)/tests/test_schedule: $(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libmbtc.a
	@mkdir -p $(BUILD)/tests
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) $(LLVM_CFLAGS) -Itests/unit $< $(BUILD)/libmbtc.a $(LLVM_LIBS) -lm -o $@ $(LDFLAGS_ALL)

unit: $(UNIT_BINS) $(BUILD)/tests/st_compare $(BUILD)/tests/comm_check $(BUILD)/tests/sv_tokenize

deps-test:
	@tools/deps.sh test

# The sanitizer build: mbtc, the unit tests and libmbtrt.a (what its mbtc -o links executables
# with), all instrumented.
asan:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 OPT="-O1 -g" $(BUILD)/asan/mbtc $(BUILD)/asan/libmbtrt.a unit

# The fuzz target links the whole front end and checker with libFuzzer, ASan and UBSan.
FUZZ_FLAGS = $(CSTD) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(INC)
FUZZ_RT_TARGETS = data cli state
fuzz-build: $(BUILD)/fuzz/fuzz_frontend $(BUILD)/fuzz/fuzz_safetensors $(BUILD)/fuzz/fuzz_verify_step \
	$(addprefix $(BUILD)/fuzz/fuzz_,$(FUZZ_RT_TARGETS))

# The front end and checker's objects, instrumented as -fsanitize=fuzzer instruments (fuzzer-no-link:
# the same coverage, without libFuzzer's main), compiled once for both targets that link them
# (fuzz_frontend, fuzz_verify_step) and one file at a time, so that make -j spreads them.
FUZZ_LIB_OBJS = $(patsubst %.c,$(BUILD)/fuzz/libobj/%.o,$(LIB_SRCS) $(GEN_SRCS))
$(BUILD)/fuzz/libobj/%.o: %.c $(GEN_HDRS) $(wildcard $(addsuffix /*.h,$(COMPILER_DIRS)))
	@mkdir -p $(dir $@)
	$(CLANG_FUZZ) $(CSTD) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all $(INC) \
		-Wno-unused-parameter -c -o $@ $<

$(BUILD)/fuzz/fuzz_frontend: tests/fuzz/fuzz_frontend.c $(FUZZ_LIB_OBJS) $(GEN_HDRS) $(wildcard $(addsuffix /*.h,$(COMPILER_DIRS)))
	@mkdir -p $(BUILD)/fuzz
	$(CLANG_FUZZ) $(FUZZ_FLAGS) -Wno-unused-parameter -o $@ tests/fuzz/fuzz_frontend.c $(FUZZ_LIB_OBJS) -lm

# The safetensors reader's fuzz target links only the runtime files the reader needs, and jansson
# (Debian's build, not instrumented: libFuzzer's coverage sees the schema checks, not the parser).
FUZZ_ST_SRCS = runtime/base/rt_error.c runtime/base/rt_file.c runtime/io/json.c runtime/io/safetensors.c
$(BUILD)/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c $(FUZZ_ST_SRCS) $(wildcard $(addsuffix /*.h,$(RUNTIME_DIRS)))
	@mkdir -p $(BUILD)/fuzz
	$(CLANG_FUZZ) $(CSTD) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(WARN) $(RT_INC) \
		-o $@ tests/fuzz/fuzz_safetensors.c $(FUZZ_ST_SRCS) $(JANSSON_LIBS) -lm

# --verify-step's step-dump reader (compiler/ref/step_dump.c) against a step graph the front end
# builds: the front end and checker as fuzz_frontend links them, and the safetensors reader.
$(BUILD)/fuzz/fuzz_verify_step: tests/fuzz/fuzz_verify_step.c $(FUZZ_LIB_OBJS) $(RT_COMPILER_SRCS) $(FUZZ_ST_SRCS) \
		$(GEN_HDRS) $(wildcard $(addsuffix /*.h,$(COMPILER_DIRS) $(RUNTIME_DIRS)))
	@mkdir -p $(BUILD)/fuzz
	$(CLANG_FUZZ) $(FUZZ_FLAGS) $(RT_INC) -Wno-unused-parameter -o $@ tests/fuzz/fuzz_verify_step.c $(FUZZ_LIB_OBJS) \
		$(RT_COMPILER_SRCS) $(FUZZ_ST_SRCS) $(JANSSON_LIBS) -lm

# The executable's inputs (token shards, state.json, the command line) are fuzzed against the whole
# runtime built with the fuzzer's instrumentation and the sanitizers (its own objects, in
# BUILD/fuzz/obj; main.c left out) and a fixed program descriptor, tests/runtime/bigram_program.c.
FUZZ_RT_SRCS = $(filter-out runtime/cli/main.c,$(RT_SRCS)) tests/runtime/bigram_program.c
FUZZ_RT_OBJS = $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(FUZZ_RT_SRCS))
$(BUILD)/fuzz/obj/%.o: %.c $(wildcard $(addsuffix /*.h,$(RUNTIME_DIRS)))
	@mkdir -p $(dir $@)
	$(CLANG_FUZZ) $(CSTD) -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all $(WARN) $(RT_INC) \
		-I$(OPENBLAS_INC) -c -o $@ $<
$(addprefix $(BUILD)/fuzz/fuzz_,$(FUZZ_RT_TARGETS)): $(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_RT_OBJS)
	$(CLANG_FUZZ) $(CSTD) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(WARN) $(RT_INC) \
		-o $@ $< $(FUZZ_RT_OBJS) $(RT_LDLIBS)

fuzz: $(BUILD)/fuzz/fuzz_$(FUZZ_TARGET)
	tests/fuzz/run.sh $(BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGET)

# make test's builds (the compiler and unit tests, the sanitizer build, the fuzz targets) are one
# make, a job a core (CI's `make test` has no -j; 2 cores build them in about half the time), or
# the jobs make was given (-jN, or a parent make's jobserver).
TEST_JOBS = $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))
test: deps-test
	@$(MAKE) --no-print-directory $(TEST_JOBS) all unit asan fuzz-build
	@tests/run.sh $(BUILD)

# The same without the sanitizer build and the fuzzer: for a quick loop while editing.
test-quick: all unit
	@MBT_QUICK=1 tests/run.sh $(BUILD)

# The GPU's training step against the CPU's (docs/testing.md, "The GPU tests"); without a GPU it
# prints SKIP and `0 passed, 0 failed`. Not part of `make test`.
test-gpu: deps-test
	@$(MAKE) --no-print-directory all
	@tests/gpu/run.sh $(BUILD)

demo: all
	@tools/demo.sh $(BUILD)

# ---- benchmarks (docs/bench.md) ----------------------------------------------------------------
# Never timed tests: tables and JSON under bench/results/. PyTorch is Debian's python3-torch,
# run by /usr/bin/python3 (tools/deps.sh bench installs it when missing and running as root).
BENCH_ARGS ?=
bench: all
	@tools/deps.sh bench
	@/usr/bin/python3 bench/run.py --build $(BUILD) $(BENCH_ARGS)
	@/usr/bin/python3 bench/ckpt.py --build $(BUILD)
	@/usr/bin/python3 bench/packing.py --build $(BUILD)
	@/usr/bin/python3 bench/buckets.py --build $(BUILD)
	@/usr/bin/python3 bench/lora.py --build $(BUILD)
	@/usr/bin/python3 bench/dp.py --build $(BUILD)
	@/usr/bin/python3 bench/offload.py --build $(BUILD)
	@/usr/bin/python3 bench/memory.py --build $(BUILD)

# On a GPU (docs/bench.md, "On a GPU"): GPT-2 124M at 1024 tokens a sequence and the largest
# micro-batch mbt trains (bf16); PyTorch with CUDA is the --python bench/gpu.py is given
# (BENCH_GPU_ARGS="--python /path/to/python"; later options win, e.g. "--batch 16"); without a GPU
# it prints SKIP. Then the memory settings on the GPU (docs/bench.md, "Memory settings on a GPU":
# bench/memory.py --gpu, GPT-2 124M bf16 at micro 64 x 1024; SKIP without a GPU). Then serving (docs/bench.md, "Serving on a GPU"): bench/serve_gpu.py's decode
# tokens/s per batch against the HBM bound and TTFT/TPOT against transformers' generate, for GPT-2
# 124M and a Llama-style model (BENCH_SERVE_GPU_ARGS="--python /path/to/python"; SKIP without a GPU).
BENCH_GPU_ARGS ?=
BENCH_SERVE_GPU_ARGS ?=
bench-gpu: all
	@/usr/bin/python3 bench/gpu.py --build $(BUILD) --seq 1024 --batch max $(BENCH_GPU_ARGS)
	@/usr/bin/python3 bench/memory.py --gpu --build $(BUILD)
	@/usr/bin/python3 bench/serve_gpu.py --build $(BUILD) $(BENCH_SERVE_GPU_ARGS)

# Serving (docs/serve.md, "Benchmark"): bench/serve.py's table for three arms - no chunking, a
# budget of 512 tokens, a budget of 2048 - on the serve layer's small GPT (tests/serve/gpt.mbt),
# 200 requests at BENCH_SERVE_RATE requests/s (Poisson); then the same three arms on GPT-2 124M
# with the KV cache, BENCH_SERVE_GPT2_PROMPTS requests at BENCH_SERVE_GPT2_RATE requests/s.
BENCH_SERVE_RATE ?= 50
BENCH_SERVE_GPT2_RATE ?= 1
BENCH_SERVE_GPT2_PROMPTS ?= 30
BENCH_SERVE_DIR = $(BUILD)/tmp/bench-serve
bench-serve: all
	@mkdir -p $(BENCH_SERVE_DIR)
	@$(BUILD)/mbt-gendata --out-dir $(BENCH_SERVE_DIR)/d --name t --vocab 320 --tokens 100000 --val-tokens 0 >/dev/null
	@$(BUILD)/mbtc tests/serve/gpt.mbt -o $(BENCH_SERVE_DIR)/gpt
	@$(BENCH_SERVE_DIR)/gpt train --data $(BENCH_SERVE_DIR)/d/t_train.bin --steps 200 \
		--save-weights $(BENCH_SERVE_DIR)/gpt.safetensors >/dev/null
	@/usr/bin/python3 bench/serve.py --prog $(BENCH_SERVE_DIR)/gpt --weights $(BENCH_SERVE_DIR)/gpt.safetensors \
		--vocab 320 --num-prompts 200 --request-rate $(BENCH_SERVE_RATE) --input-len uniform:4:24 --output-len uniform:4:8 \
		--arms "no-chunking:--batch-tokens 4096 --prefill-chunk 4096;budget-512:--batch-tokens 512 --prefill-chunk 512;budget-2048:--batch-tokens 2048 --prefill-chunk 512"
	@# GPT-2 124M (bench/gpt2_124m.mbt: context 64) with the KV cache, weights after one step from
	@# its initialisers (the timing does not depend on what the weights say: outputs run to max_tokens)
	@$(BUILD)/mbtc -I examples bench/gpt2_124m.mbt -o $(BENCH_SERVE_DIR)/gpt2
	@$(BUILD)/mbt-gendata --out-dir $(BENCH_SERVE_DIR)/d2 --name t --vocab 1024 --tokens 20000 --val-tokens 0 >/dev/null
	@$(BENCH_SERVE_DIR)/gpt2 train --data $(BENCH_SERVE_DIR)/d2/t_train.bin --steps 1 \
		--save-weights $(BENCH_SERVE_DIR)/gpt2.safetensors >/dev/null
	@/usr/bin/python3 bench/serve.py --prog $(BENCH_SERVE_DIR)/gpt2 --weights $(BENCH_SERVE_DIR)/gpt2.safetensors \
		--vocab 1024 --num-prompts $(BENCH_SERVE_GPT2_PROMPTS) --request-rate $(BENCH_SERVE_GPT2_RATE) \
		--input-len uniform:16:40 --output-len uniform:8:16 \
		--arms "no-chunking:--batch-tokens 4096 --prefill-chunk 4096;budget-512:--batch-tokens 512 --prefill-chunk 512;budget-2048:--batch-tokens 2048 --prefill-chunk 512"

# ---- install and carry (docs/install.md) -------------------------------------------------------
# make install PREFIX=P: P/bin/mbtc and mbt-gendata, P/lib/mbt/libmbtrt.a with the static archives
# executables link (RT_ARCHIVES: OpenBLAS's and jansson's where they are linked statically),
# P/share/mbt/stdlib. mbtc finds them relative to itself, so P can be moved. DESTDIR stages.
# make dist: that tree as build/mbt-VERSION-ARCH.tar.gz (one folder, mbt-VERSION-ARCH).
PREFIX  ?= /usr/local
VERSION  = $(shell sed -n 's/^#define MBT_VERSION "\(.*\)"/\1/p' compiler/main.c)
ARCH    := $(shell uname -m)
DIST     = mbt-$(VERSION)-$(ARCH)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/mbt $(DESTDIR)$(PREFIX)/share/mbt
	install -m 755 $(BUILD)/mbtc $(BUILD)/mbt-gendata $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/libmbtrt.a $(RT_ARCHIVES) $(DESTDIR)$(PREFIX)/lib/mbt/
	rm -rf $(DESTDIR)$(PREFIX)/share/mbt/stdlib
	install -d $(DESTDIR)$(PREFIX)/share/mbt/stdlib
	install -m 644 stdlib/*.mbt $(DESTDIR)$(PREFIX)/share/mbt/stdlib/

dist: all
	rm -rf $(BUILD)/dist $(BUILD)/$(DIST).tar.gz
	@$(MAKE) --no-print-directory install PREFIX=$(abspath $(BUILD))/dist/$(DIST) DESTDIR=
	tar -C $(BUILD)/dist -czf $(BUILD)/$(DIST).tar.gz $(DIST)
	@echo "built $(BUILD)/$(DIST).tar.gz"

format:
	@tools/format.sh

clean:
	rm -rf $(BUILD)

# Header dependencies written by -MMD (absent before the first build, when everything is built).
-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d $(BUILD)/obj/*/*/*/*.d $(BUILD)/tests/*.d $(BUILD)/*.d)
