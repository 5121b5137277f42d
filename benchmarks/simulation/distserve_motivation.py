"""DistServe's motivating example (its Figure 1) on the calibrated A100 latency model.

OPT-13B FP16 on A100-80GB, input 512, output 64, SLO TTFT 0.4 s and TPOT 40 ms: the goodput
(highest Poisson rate with >= 90% attainment) of one colocated GPU, of a GPU serving only
prefill (TTFT attainment), of a GPU serving only decode (TPOT attainment), and of 2 prefill + 1
decode GPUs (static-pd, joint attainment); then 2P1D's per-GPU goodput over the colocated GPU.
The seed: 1.6, 5.6, 10 and 10 req/s; 2.1x. The A100's knobs come from its calibration file
(`fluidpd experiment calibrate` fits them to these and the paper's other figures).

    .venv/bin/python benchmarks/simulation/distserve_motivation.py
"""

from __future__ import annotations

from fluidpd.bench.experiments.calibrate.fit import FIGURES, RATIO_TARGET, figure1
from fluidpd.latency.calibration import latency_config


def main() -> None:
    rates = figure1(latency_config("a100-80g"))
    for f in FIGURES:
        if f.key in rates:
            print(f"{f.source}: {rates[f.key]:.2f} req/s (seed {f.target:g}, {rates[f.key] / f.target - 1:+.1%})")
    ratio = rates["fig1_2p1d_rps"] / 3 / rates["fig1_colocated_rps"]
    worst = max(abs(rates[k] / f.target - 1) for f in FIGURES for k in [f.key] if k in rates)
    print(
        f"headline: per-GPU goodput 2P1D / colocated = {ratio:.2f}x (DistServe seed: {RATIO_TARGET}x); "
        f"Figure 1's four rates within {worst:.1%} of the seed"
    )


if __name__ == "__main__":
    main()
