"""A placement search: pick the algorithm, score every candidate (in parallel where it pays) and
describe the result (`Placement`, the JSON that `fluidpd place --out` writes and `--placement`
reads back)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from fluidpd.placement.algorithms import (
    Algorithm1Result,
    Algorithm2Result,
    Candidate,
    algorithm1,
    algorithm2,
    score,
)
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.estimator import GoodputEstimator

Progress = Callable[[int, int], None]  # (jobs done, jobs in all)
PARALLEL_MIN_JOBS = 8  # below this, starting processes costs more than it saves


@dataclass(slots=True)
class PhasePlan:
    """`instances` copies of one tp x pp instance for one phase."""

    tp: int
    pp: int
    instances: int
    goodput_rps: float

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def to_json(self) -> dict:
        per_gpu = self.goodput_rps / self.gpus
        return {
            "tp": self.tp,
            "pp": self.pp,
            "instances": self.instances,
            "goodput_rps": self.goodput_rps,
            "goodput_per_gpu": per_gpu,
        }


@dataclass(slots=True)
class UnitPlan:
    """Algorithm 2's unit: per stage, prefill and decode segments on one node."""

    pp: int
    prefill_tp: int
    decode_tp: int
    instances: int
    goodput_rps: float
    prefill_segments: int = 1
    decode_segments: int = 1

    @property
    def gpus(self) -> int:
        return self.pp * (self.prefill_segments * self.prefill_tp + self.decode_segments * self.decode_tp)

    def to_json(self) -> dict:
        return {
            "pp": self.pp,
            "prefill_tp": self.prefill_tp,
            "decode_tp": self.decode_tp,
            "prefill_segments": self.prefill_segments,
            "decode_segments": self.decode_segments,
            "instances": self.instances,
            "goodput_rps": self.goodput_rps,
            "goodput_per_gpu": self.goodput_rps / self.gpus,
        }


@dataclass(slots=True)
class Placement:
    """What a search chose, and what it scored on the way."""

    algorithm: int
    prefill: PhasePlan
    decode: PhasePlan
    rate: float
    unit: UnitPlan | None = None
    cluster_gpus: int = 0
    search_wall_s: float = 0.0
    reason: str = ""
    candidates: list[Candidate] = field(default_factory=list)
    pruned: int = 0  # Algorithm 2: units whose bound ruled them out unsimulated

    @property
    def total_gpus(self) -> int:
        if self.unit is not None:
            return self.unit.instances * self.unit.gpus
        return self.prefill.instances * self.prefill.gpus + self.decode.instances * self.decode.gpus

    @property
    def fits(self) -> bool:
        """Whether R's GPUs fit the cluster (the seed's example replicates past its N x M)."""
        return not self.cluster_gpus or self.total_gpus <= self.cluster_gpus

    def prefill_share(self) -> float:
        """Share of the placement's GPUs that prefill."""
        p = self.prefill.instances * self.prefill.gpus
        return p / (p + self.decode.instances * self.decode.gpus)

    def to_json(self) -> dict:
        out = {
            "algorithm": self.algorithm,
            "rate_rps": self.rate,
            "prefill": self.prefill.to_json(),
            "decode": self.decode.to_json(),
            "total_gpus": self.total_gpus,
            "cluster_gpus": self.cluster_gpus,
            "fits": self.fits,
            "search_wall_s": self.search_wall_s,
            "reason": self.reason,
            "pruned_units": self.pruned,
            "candidates": [
                {
                    "phase": c.phase,
                    "tp": c.tp,
                    "pp": c.pp,
                    "decode_tp": c.decode_tp,
                    "segments": list(c.segments),
                    "gpus": c.gpus,
                    "goodput_rps": c.goodput_rps,
                    "goodput_per_gpu": c.per_gpu,
                }
                for c in self.candidates
            ],
        }
        if self.unit is not None:
            out["unit"] = self.unit.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> Placement:
        try:

            def phase(d: dict) -> PhasePlan:
                return PhasePlan(int(d["tp"]), int(d["pp"]), int(d["instances"]), float(d["goodput_rps"]))

            unit = data.get("unit")
            return cls(
                int(data["algorithm"]),
                phase(data["prefill"]),
                phase(data["decode"]),
                float(data.get("rate_rps", 0.0)),
                None
                if unit is None
                else UnitPlan(
                    int(unit["pp"]),
                    int(unit["prefill_tp"]),
                    int(unit["decode_tp"]),
                    int(unit["instances"]),
                    float(unit["goodput_rps"]),
                    int(unit.get("prefill_segments", 1)),
                    int(unit.get("decode_segments", 1)),
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a placement file (as fluidpd place --out writes): {exc}") from None


def load_placement(path: str | os.PathLike) -> Placement:
    """A placement written by `fluidpd place --out`."""
    try:
        return Placement.from_json(json.loads(Path(path).read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None


def from_algorithm1(res: Algorithm1Result, rate: float) -> Placement:
    p, d = res.prefill, res.decode
    return Placement(
        1,
        PhasePlan(p.tp, p.pp, res.prefill_instances, p.goodput_rps),
        PhasePlan(d.tp, d.pp, res.decode_instances, d.goodput_rps),
        rate,
        candidates=res.candidates,
    )


def from_algorithm2(res: Algorithm2Result, est: GoodputEstimator, rate: float) -> Placement:
    u = res.unit
    a, b = u.segments
    return Placement(
        2,
        PhasePlan(u.tp, u.pp, res.instances * a, est.prefill(u.tp, u.pp)),
        PhasePlan(u.decode_tp, u.pp, res.instances * b, est.decode(u.decode_tp, u.pp)),
        rate,
        UnitPlan(u.pp, u.tp, u.decode_tp, res.instances, u.goodput_rps, a, b),
        candidates=res.candidates,
    )


# --- scoring candidates -----------------------------------------------------------------------
_EST: GoodputEstimator | None = None


def _init(est: GoodputEstimator) -> None:
    global _EST
    _EST = est


def _score_in_worker(job: tuple) -> tuple[float, dict]:
    assert _EST is not None
    g = score(_EST, job)
    cache = getattr(_EST, "_cache", {})
    return g, {k: v for k, v in cache.items() if isinstance(v, float)}


class Evaluator:
    """Scores a batch of jobs, across `processes` (forked, each with a copy of the estimator)."""

    def __init__(self, est: GoodputEstimator, processes: int = 1, progress: Progress | None = None):
        self.est, self.processes, self.progress = est, max(1, processes), progress
        self.done = self.total = 0

    def __call__(self, jobs: list[tuple]) -> list[float]:
        self.total += len(jobs)
        if self.processes == 1 or len(jobs) < PARALLEL_MIN_JOBS:
            out = []
            for job in jobs:
                out.append(score(self.est, job))
                self._tick()
            return out
        # longest first: the pool's tail is one short job, not one long one
        order = sorted(range(len(jobs)), key=lambda i: -math.prod(int(x) for x in jobs[i][1:3]))
        results: list[float] = [0.0] * len(jobs)
        cache = getattr(self.est, "_cache", None)
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(self.processes, mp_context=ctx, initializer=_init, initargs=(self.est,)) as pool:
            futures = {pool.submit(_score_in_worker, jobs[i]): i for i in order}
            for fut in as_completed(futures):
                g, entries = fut.result()
                results[futures[fut]] = g
                if cache is not None:
                    cache.update(entries)
                self._tick()
        return results

    def _tick(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total)


def kv_stream_fits(prefill: PhasePlan, kv_bytes_per_request: float, link_bw_per_gpu: float, share: float) -> bool:
    """Whether one prefill instance's KV output at its goodput fits `share` of its GPUs' NICs (the
    seed's test: 25 req/s x 168 MB = 4.2 GB/s is easy on 400 Gb/s, impossible on 25 Gb/s)."""
    return prefill.goodput_rps * kv_bytes_per_request <= share * link_bw_per_gpu * prefill.gpus


def search(
    est: GoodputEstimator,
    config: PlaceConfig,
    rate: float,
    kv_bytes_per_request: float = 0.0,
    link_bw_per_gpu: float = math.inf,
    progress: Progress | None = None,
) -> Placement:
    """Run Algorithm 1 or 2 (or choose: Algorithm 1 unless its prefill KV stream overloads the NICs)."""
    t0 = time.perf_counter()
    evaluate = Evaluator(est, config.jobs or os.cpu_count() or 1, progress)
    n, m = config.nodes, config.gpus_per_node
    placement: Placement | None = None
    reason = f"--algorithm {config.algorithm}"
    if config.algorithm in ("1", "auto"):
        placement = from_algorithm1(algorithm1(est, n, m, rate, evaluate), rate)
        if config.algorithm == "auto":
            stream = placement.prefill.goodput_rps * kv_bytes_per_request
            link = config.kv_link_share * link_bw_per_gpu * placement.prefill.gpus
            fits = kv_stream_fits(placement.prefill, kv_bytes_per_request, link_bw_per_gpu, config.kv_link_share)
            reason = (
                f"a prefill instance streams {stream / 1e9:.2f} GB/s of KV; "
                f"{config.kv_link_share:.0%} of its NICs carry {link / 1e9:.2f} GB/s: "
                + ("Algorithm 1 (high node-affinity)" if fits else "Algorithm 2 (keep KV on NVLink)")
            )
            if not fits:
                placement = None
    if placement is None:
        res = algorithm2(
            est,
            n,
            m,
            rate,
            config.ratios(),
            evaluate,
            batch=4 if evaluate.processes == 1 else max(PARALLEL_MIN_JOBS, 4 * evaluate.processes),
            prune=config.prune,
        )
        placement = from_algorithm2(res, est, rate)
        placement.pruned = res.pruned
    placement.cluster_gpus = n * m
    placement.reason = reason
    placement.search_wall_s = time.perf_counter() - t0
    return placement
