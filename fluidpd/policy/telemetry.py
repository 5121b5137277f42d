"""The FluidPD seed's pressure indices, evaluated every scheduling cycle.

PPI(t) = (sum_i max(0, t - a_i + f_P(s_i) - SLO_TTFT) + sum_i f_P(s_i)) / sum_k C_P(k), i in Q_P.
We define C_P(k), which the seed leaves open, as the prefill work-seconds worker k can absorb
within one SLO_TTFT horizon: SLO_TTFT for a routable prefill worker. With no routable prefill
worker (FluidPD's all-decode state) the prompts wait on the decode workers, and Q_P and C_P are
theirs (SLO_TTFT per routable decode worker: a decode worker prefills slower than that, so PPI
then reads low, and the way back to a prefill worker needs a real backlog). The numerator is in
seconds too (queued work plus lateness), so PPI is dimensionless and PPI > 1 means the queue
cannot be cleared within the TTFT SLO. s_i is the prompt work still to do (a partly prefilled
request counts its remaining tokens, an unstarted one those its worker's cache will not skip). To
bound the cost of one evaluation, the scan stops once PPI exceeds `ppi_cap`: past that, every
decision is the same.

DPI(t) = mean_j (alpha * T_iter(j) / SLO_TBT + (1 - alpha) * K_j / K_max(j)) over decode workers,
with T_iter the EWMA of measured decode step times. K_j, the worker's KV demand, is the blocks in
use plus the blocks promised to hand-offs queued on it: KV that waits on a prefill worker for decode
room is decode pressure (and can push DPI above 1), not prefill pressure.

A colocated worker does both, so it counts in both pools (the indices then describe a colocated
deployment too; the disaggregated policies have no colocated workers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fluidpd.policy.view import ClusterView, Role, WorkerView

PREFILL_POOL = (Role.PREFILL, Role.COLOCATED)
DECODE_POOL = (Role.DECODE, Role.COLOCATED)


@dataclass(frozen=True, slots=True)
class Pressure:
    """One evaluation of the indices."""

    t: float
    ppi: float
    dpi: float


def prompt_pool(view: ClusterView) -> list[WorkerView]:
    """The workers whose queues hold the prompts to prefill: the prefill pool, or, with none of it
    routable (FluidPD's all-decode state), the decode workers."""
    pool = [w for w in view.workers if w.role in PREFILL_POOL]
    return pool if any(w.routable for w in pool) else [w for w in view.workers if w.role is Role.DECODE]


def prefill_pressure_index(
    view: ClusterView, prefill_time: Callable[[float], float], slo_ttft_s: float, ppi_cap: float = 10.0
) -> float:
    """PPI over the prefill workers' queues (0 when there is no prefill worker and no queue)."""
    prefill = prompt_pool(view)
    capacity = slo_ttft_s * sum(1 for w in prefill if w.routable)
    if capacity <= 0:
        return ppi_cap if any(w.queue for w in prefill) else 0.0
    limit = ppi_cap * capacity
    now, total = view.now, 0.0
    for w in prefill:
        for req in w.queue:
            work = prefill_time(req.prefill_remaining - req.queued_hit)
            late = now - req.arrival_s + work - slo_ttft_s
            total += work + (late if late > 0 else 0.0)
            if total > limit:
                return ppi_cap
    return total / capacity


def decode_pressure_index(view: ClusterView, slo_tbt_s: float, alpha: float = 0.5, t_iter=None) -> float:
    """DPI over the routable decode workers (0 when there is none); `t_iter(w)` defaults to the
    worker's measured decode-step EWMA."""
    beta = 1 - alpha  # (each term as `worker_pressure` computes it, inlined: this runs every cycle)
    terms = [
        alpha * (t_iter(w) if t_iter else w.step_time_ewma_s) / slo_tbt_s
        + beta * (w.kv_blocks_used + w.pull_blocks_pending) / w.kv_blocks_total
        for w in view.workers
        if w.role in DECODE_POOL and w.routable
    ]
    return sum(terms) / len(terms) if terms else 0.0


def worker_pressure(w: WorkerView, slo_tbt_s: float, alpha: float = 0.5, t_iter=None) -> float:
    """One decode worker's term of the DPI."""
    t = t_iter(w) if t_iter else w.step_time_ewma_s
    return alpha * t / slo_tbt_s + (1 - alpha) * (w.kv_blocks_used + w.pull_blocks_pending) / w.kv_blocks_total
