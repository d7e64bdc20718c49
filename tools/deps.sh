#!/usr/bin/env bash
# tools/deps.sh - find what the build needs, install what is missing from Debian's packages
# when running as root, and say what was found. Called by `make` (and `make test`) before
# anything is compiled.
#
#   tools/deps.sh build   re2c, lemon, a C compiler, LLVM 19, OpenBLAS, xxHash, jansson, libmicrohttpd, liburing, Open
#                         MPI's mpirun and libmpi (and, optionally, CUDA)
#   tools/deps.sh test    the above plus what the tests use (clang 19 with libFuzzer, python3-torch)
#   tools/deps.sh bench   the build's plus what `make bench` compares against (Debian's
#                         python3-torch, imported by /usr/bin/python3)
set -u
what=${1:-build}

need_pkgs=()
say() { printf 'mbt: %s\n' "$*"; }

have() { command -v "$1" >/dev/null 2>&1; }

# --- build tools -----------------------------------------------------------------------
have cc || have gcc || need_pkgs+=(gcc)
have make || need_pkgs+=(make)
have re2c || need_pkgs+=(re2c)
if ! have lemon || [ ! -f /usr/share/lemon/lempar.c ]; then need_pkgs+=(lemon); fi
LLVM_CONFIG=${LLVM_CONFIG:-llvm-config-19}
have "$LLVM_CONFIG" || need_pkgs+=(llvm-19-dev)
# OpenBLAS for the runtime's GEMMs: Debian's libopenblas-dev pulls in the pthread flavour, whose
# headers and libraries (the static libopenblas.a included) live under openblas-pthread/.
multiarch=$( (cc -print-multiarch || gcc -print-multiarch) 2>/dev/null)
multiarch=${multiarch:-x86_64-linux-gnu}
openblas_inc=/usr/include/$multiarch/openblas-pthread
openblas_dir=/usr/lib/$multiarch/openblas-pthread
[ -f "$openblas_inc/cblas.h" ] || need_pkgs+=(libopenblas-dev)
# xxHash (XXH3-128) for checkpoint checksums and the program hash, used header-only
[ -f /usr/include/xxhash.h ] || need_pkgs+=(libxxhash-dev)
# jansson, the runtime's JSON reader and writer (executables link its static libjansson.a)
[ -f /usr/include/jansson.h ] || need_pkgs+=(libjansson-dev)
# libmicrohttpd, the HTTP server of `PROG serve` (executables link its static libmicrohttpd.a)
[ -f /usr/include/microhttpd.h ] || need_pkgs+=(libmicrohttpd-dev)

# liburing, the NVMe store's asynchronous I/O (executables link its static liburing.a)
[ -f /usr/include/liburing.h ] || need_pkgs+=(liburing-dev)

# Open MPI, for running data-parallel ranks with mpirun (docs/parallel.md). Executables open
# libmpi.so.40 with dlopen only when mpirun or srun started them, so nothing links it and a run
# without MPI needs none; the comm layer of the tests runs ranks under mpirun. openmpi-bin brings
# mpirun and depends on libopenmpi3 (Debian 12's name for the library package).
if ! have mpirun || ! ls /usr/lib/"$multiarch"/libmpi.so.40 >/dev/null 2>&1; then need_pkgs+=(openmpi-bin libopenmpi3); fi

# --- test tools -------------------------------------------------------------------------
if [ "$what" = test ]; then
    have clang-19 || need_pkgs+=(clang-19)
    # the emulated GPU (tests/cudaemu) compiles each program's CUDA C as C++ for the host
    have g++ || need_pkgs+=(g++)
    # the format layer: the C sources in the house style (.clang-format, tools/format.sh)
    have clang-format-19 || need_pkgs+=(clang-format-19)
    [ -d /usr/lib/llvm-19/lib/clang/19/lib/linux ] || need_pkgs+=(libclang-rt-19-dev)
    # srun and sbatch (tests/comm/slurm.sh starts a Slurm cluster of its own on this machine):
    # Slurm's daemons and client, munge (its authentication) and PMIx's library (srun --mpi=pmix)
    have slurmd || [ -x /usr/sbin/slurmd ] || need_pkgs+=(slurmd)
    have slurmctld || [ -x /usr/sbin/slurmctld ] || need_pkgs+=(slurmctld)
    have srun || need_pkgs+=(slurm-client)
    [ -x /usr/sbin/munged ] || need_pkgs+=(munge)
    [ -e /usr/lib/"$multiarch"/libpmix.so ] || need_pkgs+=(libpmix-dev)
    # two hosts in network namespaces (tests/comm/hosts.sh): iproute2's ip
    have ip || [ -x /usr/sbin/ip ] || need_pkgs+=(iproute2)
    # the PyTorch oracle (tests/torch/): Debian's torch, run as /usr/bin/python3
    /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need_pkgs+=(python3-torch)
fi

# --- benchmark tools --------------------------------------------------------------------
# Debian's PyTorch (CPU), for /usr/bin/python3 - not whatever python3 comes first on PATH.
if [ "$what" = bench ]; then
    /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need_pkgs+=(python3-torch)
fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && have apt-get; then
        say "installing missing Debian packages: ${need_pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -qq "${need_pkgs[@]}" >/tmp/mbt-apt.log 2>&1; then
            apt-get update -qq >/tmp/mbt-apt.log 2>&1
            if ! apt-get install -y -qq "${need_pkgs[@]}" >>/tmp/mbt-apt.log 2>&1; then
                say "apt-get install failed; its log is in /tmp/mbt-apt.log:"
                tail -n 20 /tmp/mbt-apt.log
                exit 1
            fi
        fi
    else
        say "missing Debian packages: ${need_pkgs[*]}"
        say "install them with:  sudo apt-get install ${need_pkgs[*]}"
        exit 1
    fi
fi

say "found re2c $(re2c --version | awk '{print $2}'), lemon (template /usr/share/lemon/lempar.c), $("$LLVM_CONFIG" --version | sed 's/^/LLVM /')"
if [ -f "$openblas_dir/libopenblas.a" ]; then
    say "found OpenBLAS in $openblas_dir; executables link its static libopenblas.a"
else
    say "found OpenBLAS headers in $openblas_inc but no static libopenblas.a; executables link -lopenblas"
fi
if [ "$what" = test ]; then say "found $(clang-19 --version | head -n 1) with libFuzzer"; fi
say "found $(mpirun --version 2>/dev/null | head -n 1) (data-parallel ranks; docs/parallel.md)"
# The serve layer's peers from PyPI (tests only, never the product): the official `openai` client
# and Hugging Face's `tokenizers`, in a virtual environment of /usr/bin/python3 that also sees
# Debian's packages (tests/serve/run.sh uses it when it is there). No network: the serve layer
# prints SKIP for the checks that need them.
if [ "$what" = test ]; then
    venv=${MBT_TEST_VENV:-build/pyenv}
    if ! "$venv/bin/python3" -c 'import openai, tokenizers' >/dev/null 2>&1; then
        if /usr/bin/python3 -m venv --system-site-packages "$venv" >/tmp/mbt-pip.log 2>&1 &&
            timeout 300 "$venv/bin/pip" install -q openai tokenizers >>/tmp/mbt-pip.log 2>&1; then
            say "installed openai and tokenizers from PyPI into $venv (the serve layer's peers)"
        else
            say "could not install openai and tokenizers from PyPI (log: /tmp/mbt-pip.log); their serve checks will SKIP"
        fi
    else
        say "found openai and tokenizers in $venv (the serve layer's peers)"
    fi
    # PEFT (tests/torch/peft.case loads what --save-adapter writes), in a venv of its own that
    # also sees Debian's torch: the transformers that peft imports must run on Debian's torch
    # 1.13.0a0, and the last such releases pin tokenizers < 0.20 and huggingface_hub < 1.0, older
    # than the serve layer's peers above (one venv would downgrade them). Debian's torch is a
    # pre-release, which peft's `torch>=1.13.0` does not accept, so pip would fetch a second
    # torch from PyPI (about 1 GB): peft, transformers and accelerate are installed --no-deps,
    # their other requirements first. Versions pinned so that the check is reproducible.
    pvenv=${MBT_PEFT_VENV:-build/pyenv-peft}
    if ! "$pvenv/bin/python3" -c 'import peft' >/dev/null 2>&1; then
        if /usr/bin/python3 -m venv --system-site-packages "$pvenv" >/tmp/mbt-pip-peft.log 2>&1 &&
            timeout 300 "$pvenv/bin/pip" install -q 'huggingface_hub>=0.23,<0.24' 'tokenizers>=0.19,<0.20' \
                'safetensors>=0.4.3,<0.5' regex tqdm filelock requests pyyaml psutil packaging numpy >>/tmp/mbt-pip-peft.log 2>&1 &&
            timeout 300 "$pvenv/bin/pip" install -q --no-deps peft==0.11.1 transformers==4.40.2 accelerate==0.30.1 >>/tmp/mbt-pip-peft.log 2>&1 &&
            "$pvenv/bin/python3" -c 'import peft' >>/tmp/mbt-pip-peft.log 2>&1; then
            say "installed peft 0.11.1 from PyPI into $pvenv (tests/torch/peft.case)"
        else
            say "could not install peft from PyPI (log: /tmp/mbt-pip-peft.log); tests/torch/peft.case will SKIP"
        fi
    else
        say "found peft $("$pvenv/bin/python3" -c 'import peft; print(peft.__version__)' 2>/dev/null) in $pvenv (tests/torch/peft.case)"
    fi
fi
if [ "$what" = bench ]; then say "found PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) for /usr/bin/python3"; fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$CUDA_HOME/include/nvrtc.h" ]; then
    say "found CUDA at $CUDA_HOME (used by the CUDA back end; a GPU is not needed to build)"
else
    say "CUDA not found at $CUDA_HOME: the CUDA back end will be unavailable (set CUDA_HOME= to point at it)"
fi
exit 0
