"""DistServe's placement search at the seed's scale: Llama-3.3-70B BF16 on 4 nodes x 8 H100 (an
instance up to 32 GPUs), the workload fitted to the first 600 s of the Azure conversation trace,
SLO TTFT 2 s and TPOT 100 ms, R = 20 req/s, 90% attainment.

Times Algorithm 1, Algorithm 2 (the paper's 1:1 units) and Algorithm 2 with up to 4:4 segments per
node, serially and across all cores, then checks the choice: every candidate Algorithm 1 scored
is simulated again finely (whole instances, 1000+ requests, 60 s samples, 7 bisection steps) and
the chosen prefill and decode configurations are compared with the best found that way.
Targets: Algorithm 1 <= 30 s, Algorithm 2 <= 60 s on this machine (DistServe: 1.3 min on 96 cores).

    .venv/bin/python benchmarks/simulation/placement_search.py [--skip-verify]
"""

from __future__ import annotations

import argparse
import os
import time

from fluidpd.core.metrics import Slo
from fluidpd.latency.calibration import latency_config
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.plan import estimator, fit_history
from fluidpd.placement.search import search
from fluidpd.placement.verify import fine, verify
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.registry import load_trace

RATE, SLO = 20.0, Slo(ttft_s=2.0, tbt_s=0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skip-verify", action="store_true", help="only time the searches")
    args = ap.parse_args()
    model, hw = get_model("llama-3.3-70b", "bf16"), get_hardware("h100")
    workload = fit_history(load_trace("azure_conv").window(0.0, 600.0))
    cores = os.cpu_count() or 1
    walls: dict[str, float] = {}
    chosen = {}
    for label, algo, segments in (("Algorithm 1", "1", 1), ("Algorithm 2", "2", 1), ("Algorithm 2 4:4", "2", 4)):
        for jobs in (1, cores):
            cfg = PlaceConfig(nodes=4, gpus_per_node=8, rate=RATE, algorithm=algo, max_segments=segments, jobs=jobs)
            est = estimator(model, hw, SLO, workload, cfg, latency_config(hw.name))
            t0 = time.perf_counter()
            p = search(est, cfg, RATE)
            wall = time.perf_counter() - t0
            walls[f"{label} x{jobs}"] = wall
            chosen[label] = (p, est)
            desc = (
                f"unit PP{p.unit.pp} {p.unit.prefill_segments}x TP{p.unit.prefill_tp} + "
                f"{p.unit.decode_segments}x TP{p.unit.decode_tp}, {p.unit.goodput_rps:.1f} req/s"
                if p.unit
                else f"prefill TP{p.prefill.tp} PP{p.prefill.pp} {p.prefill.goodput_rps:.1f} req/s, "
                f"decode TP{p.decode.tp} PP{p.decode.pp} {p.decode.goodput_rps:.1f} req/s"
            )
            print(
                f"{label:16s} {jobs} process(es): {wall:6.1f} s  {len(p.candidates)} simulated, {p.pruned} pruned  "
                f"{desc}, {p.total_gpus} GPUs"
            )
        if cores > 1:
            print(f"{label:16s} parallel speed-up {walls[f'{label} x1'] / walls[f'{label} x{cores}']:.2f}x")
    if not args.skip_verify:
        cfg = PlaceConfig(nodes=4, gpus_per_node=8, rate=RATE, algorithm="2", prune=False)
        t0 = time.perf_counter()
        every = search(estimator(model, hw, SLO, workload, cfg, latency_config(hw.name)), cfg, RATE)
        same = every.unit == chosen["Algorithm 2"][0].unit
        print(
            f"Algorithm 2 exhaustive ({len(every.candidates)} units, {time.perf_counter() - t0:.1f} s): "
            f"{'the same unit as' if same else 'a DIFFERENT unit from'} the pruned search"
        )
        p, est = chosen["Algorithm 1"]
        t0 = time.perf_counter()
        for c in verify(p, fine(est), cores):
            print(
                f"check {c.phase}: chosen TP{c.chosen[0]} PP{c.chosen[1]} {c.chosen_per_gpu:.3f} req/s/GPU, best of "
                f"{c.configurations} TP{c.best[0]} PP{c.best[1]} {c.best_per_gpu:.3f} ({c.ratio:.1%} of the best)"
            )
        print(f"check took {time.perf_counter() - t0:.1f} s")
    a1, a2 = walls[f"Algorithm 1 x{cores}"], walls[f"Algorithm 2 x{cores}"]
    a2r = walls[f"Algorithm 2 4:4 x{cores}"]
    print(
        f"placement_search: Algorithm 1 {a1:.1f} s (target 30 s), Algorithm 2 {a2:.1f} s, with 4:4 segments "
        f"{a2r:.1f} s (target 60 s), on {cores} cores"
    )


if __name__ == "__main__":
    main()
