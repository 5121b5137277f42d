"""The engine's prefill and decode step times on one GPU against the simulator's latency model for it
(issue 56's first GPU fidelity figure): the GPU check's `steps` part on its own.

A random-weight Llama-3.1-8B is written on the spot (bf16, `fluidpd/bench/gpu_check/synthetic.py`),
loaded on `--device`, and timed as `fluidpd profile` times steps (CUDA-synchronised, medians of 3 after
a warm-up): prefill chunks of 128-8k tokens (after 0 and 4k of context), decode batches of 1-256 at
contexts 128, 1k and 4k (as many as fit in 60% of the memory beside the weights). Each point beside
`RooflineModel(llama-3.1-8b, h100 | h200, latency_config(...))`'s prediction: error = predicted /
measured - 1, never fitted to these points. Writes `<out>/steps.json` and the measured profile
`<kind>-measured.json` (the simulator's `--gpu <kind>-measured` once shipped in fluidpd/specs/profiles/).
`--device cpu --tiny` is the dry run (a 2-layer model predicted as the 8B: numbers without meaning).

    python benchmarks/engine/gpu_step_fidelity.py --device cuda [--out results/gpu_step_fidelity]
    .venv/bin/python benchmarks/engine/gpu_step_fidelity.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fluidpd.bench.gpu_check import steps_check
from fluidpd.bench.gpu_check.context import CheckContext


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the dry run's shapes (seconds on a CPU)")
    ap.add_argument("--out", type=Path, default=Path("results/gpu_step_fidelity"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/fluidpd-gpu-check"), help="the written model")
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    ctx = CheckContext(args.device, args.out, args.work, args.tiny, time.monotonic() + args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    result = steps_check.check(ctx)
    (args.out / "steps.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'kind':8} {'tokens':>6} {'prior':>6} {'batch':>5} {'context':>7} {'measured ms':>11} {'predicted ms':>12} "
          f"{'error':>7}")  # fmt: skip
    for p in result.get("points", []):
        print(f"{p['kind']:8} {p.get('tokens', ''):>6} {p.get('prior', ''):>6} {p.get('batch', ''):>5} "
              f"{p.get('context', ''):>7} {p['measured_s'] * 1e3:11.2f} {p['predicted_s'] * 1e3:12.2f} "
              f"{p['error']:+7.1%}")  # fmt: skip
    s = result.get("summary", {})
    errors = ", ".join(
        f"{k} mean |error| {v['mean_abs_error']:.1%} (max {v['max_abs_error']:.1%}, {v['points']} points)"
        for k, v in s.items()
        if v.get("points")
    )
    label = "dry run, " if result.get("dry_run") else ""
    print(f"gpu step fidelity ({label}{result.get('gpu')} vs the {result.get('kind')} roofline): "
          f"{errors or 'no points'}; {'ok' if result.get('ok') else 'FAILED'}")  # fmt: skip
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
