"""Placement from a history window: the search on a model, GPU and SLOs, the split of a fixed
cluster that `fluidpd simulate` and `fluidpd experiment` start their P/D policies from, and the
token budget they run chunked with."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fluidpd.core.metrics import Slo
from fluidpd.latency.config import LatencyConfig
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.result import Placement
from fluidpd.placement.search import Progress, search
from fluidpd.placement.simulated import SimulatedGoodput
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import HardwareSpec
from fluidpd.specs.models import ModelSpec
from fluidpd.workload.fitted import WorkloadModel
from fluidpd.workload.trace import Trace

MIN_HISTORY = 20  # requests: fewer fit no distribution worth searching on
CHUNK_BUDGETS = (128, 192, 256, 384, 512, 768, 1024)  # chunked's tokens per mixed step, as searched on history


def check_history(history: Trace, what: str, minimum: int = MIN_HISTORY) -> None:
    """A ValueError unless `history` holds at least `minimum` requests to pick `what` from."""
    if len(history) < minimum:
        raise ValueError(f"the history window holds {len(history)} requests; {what} needs at least {minimum}")


def fit_history(history: Trace, replay: bool = False) -> WorkloadModel:
    check_history(history, "a placement")
    return WorkloadModel.fit(history, replay=replay)


def estimator(
    model: ModelSpec,
    hw: HardwareSpec,
    slo: Slo,
    workload: WorkloadModel,
    config: PlaceConfig,
    latency: LatencyConfig | None = None,
    seed: int = 0,
    sim: SimConfig | None = None,
) -> SimulatedGoodput:
    return SimulatedGoodput(
        model,
        hw,
        slo,
        workload,
        attainment=config.attainment,
        requests=config.requests,
        seed=seed,
        latency=latency,
        gpus_per_node=config.gpus_per_node,
        iters=config.iters,
        sim=sim or SimConfig(),
    )


def place(est: SimulatedGoodput, config: PlaceConfig, progress: Progress | None = None) -> Placement:
    """DistServe's search for the estimator's workload at `config.rate` (default: the workload's
    own rate); with `--algorithm auto`, the NIC bandwidth decides between Algorithms 1 and 2."""
    if config.rate:
        est.workload = est.workload.at_rate(config.rate)
    kv = float(est.workload.prompt_len.mean()) * est.model.kv_bytes_per_token
    return search(est, config, est.workload.rate, kv, est.hw.internode_bw, progress)


def split_of(placement: Placement, n_workers: int) -> int:
    """Prefill workers of a fixed `n_workers` cluster in the placement's proportion (>= 1 each side)."""
    if n_workers < 2:
        raise ValueError("a P/D split needs at least 2 workers")
    return min(n_workers - 1, max(1, round(n_workers * placement.prefill_share())))


def middle_of_best(scores: dict) -> Any:
    """The key with the highest score; among ties (in key order), the middle one: headroom on
    both sides of a knob whose neighbours score the same."""
    best = max(scores.values())
    tied = [k for k in scores if scores[k] == best]
    return tied[len(tied) // 2]


def fixed_split(
    history: Trace, setup: Setup, splits: Sequence[int] | None = None, *, min_history: int = MIN_HISTORY
) -> tuple[int, dict[int, float]]:
    """The split of a fixed cluster (`setup.sim.n_workers` alike workers) a search picks from
    history: every k prefill workers (or those of `splits`, 1..n-1) simulated under static-pd on the
    history window, the highest joint attainment kept (ties: the middle one of the best). Per-instance
    goodputs would miss how the dispatcher pools a fixed cluster's queues; the whole cluster is cheap
    to simulate. `min_history`: the fewest requests the history may hold."""
    n = setup.sim.n_workers
    if n < 2:
        raise ValueError("a P/D split needs at least 2 workers")
    ks = range(1, n) if splits is None else sorted(set(splits))
    if not ks or not all(1 <= k < n for k in ks):
        raise ValueError(f"splits must be a non-empty subset of 1..{n - 1}")
    check_history(history, "a split", min_history)
    scores = {}
    for k in ks:
        s = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, prefill_workers=k))
        scores[k] = simulate(history, "static-pd", s).summary["attainment"]
    return middle_of_best(scores), scores


def best_chunk_budget(
    history: Trace,
    setup: Setup,
    budgets: Sequence[int] = CHUNK_BUDGETS,
    *,
    min_history: int = MIN_HISTORY,
    policy: str = "chunked",
) -> tuple[int, dict[int, float]]:
    """The token budget a chunked policy (`policy`: chunked or chunked-late-last) runs with, picked
    from history: every budget of `budgets` simulated under `policy` on the history window, the
    highest joint attainment kept (ties: the middle one of the best, in increasing budget).
    `min_history`: the fewest requests the history may hold."""
    if not budgets:
        raise ValueError("a chunk budget search needs at least one candidate budget")
    check_history(history, "a chunk budget", min_history)
    scores = {}
    for b in sorted(set(budgets)):
        s = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, chunk_budget=b))
        scores[b] = simulate(history, policy, s).summary["attainment"]
    return middle_of_best(scores), scores
