#!/usr/bin/env bash
# FluidPD's CUDA path in one prepared GPU run (issue 56): install the wheel bundle the GPU image
# lacks, check that everything imports, then the engine's device tests, `fluidpd generate` and
# `fluidpd serve` on a random-weight Llama-3.1-8B written on the spot, and step times against the
# simulator's latency model; results as JSON under the output folder.
#
#   .venv/bin/python scripts/gpu_bundle.py                 # here, once: .whl/ (6 MB)
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=600)   # on the GPU machine
#   DEVICE=cpu bash scripts/gpu_check.sh OUTDIR --tiny     # the dry run (the test suite runs it)
#
# OUTDIR defaults to $OUT (the device tool's folder that comes back), else out/gpu_check.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-out/gpu_check}}
shift $(($# > 0 ? 1 : 0))
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# the bundle (no registry there, Python 3.12 wheels) into a private site folder; the CPU dry run uses this venv
if [[ "${DEVICE:-cuda}" == cuda* ]] && compgen -G ".whl/*.whl" >/dev/null; then
    site=${TMPDIR:-/tmp}/fluidpd-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "gpu_check: installing the bundle failed" >&2; exit 3; }
    export PYTHONPATH=$site:$PWD
fi
budget=${GPU_CHECK_BUDGET_S:-540}
work=()  # the written 8B model (16 GB) in memory where there is room: a slow disk would take minutes
if [[ "${DEVICE:-cuda}" == cuda* ]] && (( $(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}') > 20000000 )); then
    work=(--work /dev/shm/fluidpd-gpu-check)
fi
timeout $((budget + 30)) "$py" -m fluidpd.bench.gpu_check --device "${DEVICE:-cuda}" --out "$out" \
    --budget-s "$budget" "${work[@]}" "$@" 2>&1 | tee "$out/gpu_check.log"
