"""DistServe's motivating example (its Figure 1): a 13B model on A100-80GB, input 512, output 64.

Per-GPU goodput (highest Poisson rate with >= 90% joint SLO attainment, divided by GPUs) of one
colocated GPU vs a static-pd cluster of 2 prefill + 1 decode GPUs, at the same SLOs. The DistServe
seed reports 2.1x for 2P1D over colocated. SLOs are the paper's for this figure: TTFT 0.4 s,
TPOT 40 ms.

    .venv/bin/python benchmarks/distserve_motivation.py
"""

from __future__ import annotations

import sys

from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.goodput import goodput_rate_scale
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import fixed_lengths

SEED_RATIO = 2.1
DURATION_S = 120.0


def per_gpu_goodput(policy: str, workers: int, prefill_workers: int = 0) -> tuple[float, float]:
    setup = Setup(
        get_model("opt-13b", "fp16"),
        get_hardware("a100-80g"),
        Slo(0.4, 0.04),
        SimConfig(n_workers=workers, seed=0),
        PolicyConfig(prefill_workers=prefill_workers),
    )
    base = fixed_lengths(4000, 1.0, prompt=512, output=64, seed=0)  # 1 req/s: rate scale == req/s

    def attainment(rate: float) -> float:
        trace = base.scale_rate(rate).window(0.0, DURATION_S)
        return simulate(trace, policy, setup).summary["attainment"]

    rate = goodput_rate_scale(attainment, target=0.9, start=1.0, iters=10)
    return rate, rate / workers


def main() -> None:
    from tqdm import tqdm

    runs = [("colocated", 1, 0), ("static-pd", 3, 2)]
    out = {}
    for policy, workers, k in tqdm(runs, desc="goodput search", file=sys.stderr):
        out[policy] = per_gpu_goodput(policy, workers, k)
    co_rate, co_gpu = out["colocated"]
    pd_rate, pd_gpu = out["static-pd"]
    print(f"colocated, 1 x A100: goodput {co_rate:.2f} req/s = {co_gpu:.2f} req/s/GPU")
    print(f"static-pd 2P1D, 3 x A100: goodput {pd_rate:.2f} req/s = {pd_gpu:.2f} req/s/GPU")
    ratio = pd_gpu / co_gpu if co_gpu else float("inf")
    print(f"headline: per-GPU goodput 2P1D / colocated = {ratio:.2f}x (DistServe seed: {SEED_RATIO}x)")


if __name__ == "__main__":
    main()
