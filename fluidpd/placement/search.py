"""A placement search: pick the algorithm and score every candidate (in parallel where it pays);
what it chose is a `Placement` (`fluidpd.placement.result`)."""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

from fluidpd.placement.algorithms import algorithm1, algorithm2, score
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.estimator import GoodputEstimator
from fluidpd.placement.result import PhasePlan, Placement, from_algorithm1, from_algorithm2

Progress = Callable[[int, int], None]  # (jobs done, jobs in all)
PARALLEL_MIN_JOBS = 8  # below this, starting processes costs more than it saves


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
