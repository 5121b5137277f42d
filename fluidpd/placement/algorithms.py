"""DistServe's placement Algorithms 1 (high node-affinity) and 2 (low node-affinity), as printed.

Algorithm 1 enumerates tensor (intra-op) degrees 1..M and pipeline (inter-op) degrees up to
N*M/intra_op, keeps for each phase the configuration with the best goodput per GPU, and
replicates it: n = ceil(R / goodput). Algorithm 2 enumerates pipeline degrees up to N (one stage
per node) and, per stage, a prefill and a decode segment that fit on one node together, scores
the unit by simulating both, keeps the best goodput per GPU, and replicates the unit. Beyond the
paper, a unit may pair several prefill segments with several decode segments per node
(`ratios`): the 1:1 unit idles whichever side is faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fluidpd.placement.estimator import GoodputEstimator


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration the search scored."""

    phase: str  # "prefill" | "decode" | "unit"
    tp: int
    pp: int
    goodput_rps: float
    gpus: int
    decode_tp: int = 0  # units: the decode segment's tp (tp is the prefill segment's)
    segments: tuple[int, int] = (1, 1)

    @property
    def per_gpu(self) -> float:
        return self.goodput_rps / self.gpus


@dataclass(slots=True)
class Algorithm1Result:
    """Algorithm 1's placement: n prefill instances of one config, m decode instances of another."""

    prefill: Candidate
    decode: Candidate
    prefill_instances: int
    decode_instances: int
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def total_gpus(self) -> int:
        return self.prefill_instances * self.prefill.gpus + self.decode_instances * self.decode.gpus


@dataclass(slots=True)
class Algorithm2Result:
    """Algorithm 2's placement: `instances` replicas of the best unit."""

    unit: Candidate
    instances: int
    candidates: list[Candidate] = field(default_factory=list)
    pruned: int = 0  # units not simulated: their bound could not beat the best

    @property
    def total_gpus(self) -> int:
        return self.instances * self.unit.gpus


def _better(c: Candidate, best: Candidate | None) -> bool:
    return best is None or c.per_gpu > best.per_gpu


def _replicas(rate: float, goodput: float) -> int:
    if goodput <= 0:
        raise ValueError("no configuration meets the SLOs at any rate: loosen them or add GPUs")
    return math.ceil(rate / goodput - 1e-9)


def algorithm1(
    est: GoodputEstimator,
    nodes: int,
    gpus_per_node: int,
    rate: float,
    evaluate: Callable[[list[tuple[str, int, int]]], list[float]] | None = None,
) -> Algorithm1Result:
    """Algorithm 1; `evaluate(jobs)` may score (phase, tp, pp) jobs in parallel (default: in turn)."""
    configs = [
        (tp, pp)
        for tp in range(1, gpus_per_node + 1)
        for pp in range(1, nodes * gpus_per_node // tp + 1)
        if est.valid(tp, pp)
    ]
    jobs = [(phase, tp, pp) for tp, pp in configs for phase in ("prefill", "decode")]
    goodputs = evaluate(jobs) if evaluate else [score(est, job) for job in jobs]
    best: dict[str, Candidate | None] = {"prefill": None, "decode": None}
    cands = []
    for (phase, tp, pp), g in zip(jobs, goodputs):
        c = Candidate(phase, tp, pp, g, tp * pp)
        cands.append(c)
        if _better(c, best[phase]):
            best[phase] = c
    p, d = best["prefill"], best["decode"]
    if p is None or d is None:
        raise ValueError("no feasible configuration: the model does not fit the GPUs")
    return Algorithm1Result(p, d, _replicas(rate, p.goodput_rps), _replicas(rate, d.goodput_rps), cands)


def algorithm2(
    est: GoodputEstimator,
    nodes: int,
    gpus_per_node: int,
    rate: float,
    ratios: Sequence[tuple[int, int]] = ((1, 1),),
    evaluate: Callable[[list[tuple]], list[float]] | None = None,
    batch: int = 4,
    prune: bool = True,
) -> Algorithm2Result:
    """Algorithm 2; `ratios`: (prefill, decode) segments per node to consider (the paper: 1:1).

    A unit serves at most what its segments serve alone, min(a x prefill, b x decode): units are
    simulated best bound first, `batch` at a time, and one whose bound per GPU cannot beat the best
    unit found so far is not simulated (the answer is the exhaustive search's, for less work;
    `prune=False` simulates every unit, as the paper's pseudocode does).
    """
    run = evaluate or (lambda jobs: [score(est, job) for job in jobs])
    segments = {pp: [tp for tp in range(1, gpus_per_node + 1) if est.valid(tp, pp)] for pp in range(1, nodes + 1)}
    phase_jobs = [(phase, tp, pp) for pp, tps in segments.items() for tp in tps for phase in ("prefill", "decode")]
    alone = dict(zip(phase_jobs, run(phase_jobs)))
    units = []
    for pp, tps in segments.items():
        for tp_p in tps:
            for tp_d in tps:
                for a, b in ratios:
                    if a * tp_p + b * tp_d <= gpus_per_node:
                        gpus = pp * (a * tp_p + b * tp_d)
                        bound = min(a * alone["prefill", tp_p, pp], b * alone["decode", tp_d, pp]) / gpus
                        units.append((bound, ("unit", pp, tp_p, tp_d, a, b)))
    if not units:
        raise ValueError("no feasible unit: a prefill and a decode segment do not fit one node")
    units.sort(key=lambda u: -u[0])
    best: Candidate | None = None
    cands: list[Candidate] = []
    i = 0
    while i < len(units) and (best is None or not prune or units[i][0] > best.per_gpu):
        chunk = [job for bound, job in units[i : i + batch] if best is None or not prune or bound > best.per_gpu]
        i += batch
        for (_, pp, tp_p, tp_d, a, b), g in zip(chunk, run(chunk)):
            c = Candidate("unit", tp_p, pp, g, pp * (a * tp_p + b * tp_d), tp_d, (a, b))
            cands.append(c)
            if _better(c, best):
                best = c
    assert best is not None
    return Algorithm2Result(best, _replicas(rate, best.goodput_rps), cands, pruned=len(units) - len(cands))


def score(est: GoodputEstimator, job: tuple) -> float:
    """One job: ("prefill" | "decode", tp, pp) or ("unit", pp, prefill_tp, decode_tp, a, b)."""
    return est.unit(*job[1:]) if job[0] == "unit" else getattr(est, job[0])(*job[1:])
