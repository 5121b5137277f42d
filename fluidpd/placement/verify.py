"""Is the chosen placement the best? Every feasible configuration the search scored is scored
again by a finer simulation (every lane of every instance, more requests, more bisection steps),
and the chosen configuration's per-GPU goodput is compared with the best found that way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fluidpd.placement.result import Placement
from fluidpd.placement.search import Evaluator
from fluidpd.placement.simulated import SimulatedGoodput


@dataclass(slots=True)
class PhaseCheck:
    """One phase: the chosen configuration's and the best configuration's per-GPU goodput, finely."""

    phase: str
    chosen: tuple[int, ...]
    chosen_per_gpu: float
    best: tuple[int, ...]
    best_per_gpu: float
    configurations: int

    @property
    def ratio(self) -> float:
        """chosen / best (1.0: the search chose the best)."""
        return self.chosen_per_gpu / self.best_per_gpu if self.best_per_gpu > 0 else 1.0


def fine(est: SimulatedGoodput, requests: int = 1000, iters: int = 7, sample_s: float = 60.0) -> SimulatedGoodput:
    """The estimator with whole instances simulated, longer samples and a finer rate search."""
    return dataclasses.replace(
        est, one_lane=False, requests=requests, iters=iters, sample_s=sample_s, _cache={}, sizes={}
    )


def verify(placement: Placement, exact: SimulatedGoodput, processes: int = 1) -> list[PhaseCheck]:
    """Score every candidate of `placement` with `exact` and compare the chosen ones with the best."""
    jobs: list[tuple] = []
    keys: list[tuple] = []
    for c in placement.candidates:
        if c.phase == "unit":
            a, b = c.segments
            jobs.append(("unit", c.pp, c.tp, c.decode_tp, a, b))
            keys.append(("unit", c.pp, c.tp, c.decode_tp, a, b))
        else:
            jobs.append((c.phase, c.tp, c.pp))
            keys.append((c.phase, c.tp, c.pp))
    gpus = [c.gpus for c in placement.candidates]
    per_gpu = [g / n for g, n in zip(Evaluator(exact, processes)(jobs), gpus)]
    chosen: dict[str, tuple]
    if placement.unit is not None:
        u = placement.unit
        chosen = {"unit": ("unit", u.pp, u.prefill_tp, u.decode_tp, u.prefill_segments, u.decode_segments)}
    else:
        chosen = {
            "prefill": ("prefill", placement.prefill.tp, placement.prefill.pp),
            "decode": ("decode", placement.decode.tp, placement.decode.pp),
        }
    out = []
    for phase, key in chosen.items():
        scored = {k: v for k, v in zip(keys, per_gpu) if k[0] == phase}
        best = max(scored, key=lambda k: scored[k])
        out.append(PhaseCheck(phase, key[1:], scored[key], best[1:], scored[best], len(scored)))
    return out
