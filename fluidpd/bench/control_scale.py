"""The control plane's calls timed on a cluster at scale (issue 54; the cluster: `fluidpd.bench.scale_cluster`).

`churn` moves the state on by one control period the way a busy cluster does: the decode workers whose
step ends in it take one (tokens, KV growth, finished requests, the step time observed by the policy),
each finished request is replaced by a new arrival that the policy routes (`route`) and admission
prices (`estimate_ttft`), and as many queued prompts finish their prefill and are handed off
(`handoff`) to decode. The number in flight and the number queued stay where they were built; the
calls a world makes per request are timed as they happen. The policy's actions are not applied (a
borrow or a switch would change the shape the measurement is about): a tick sees the state the churn
makes, and a switch the policy starts stays in its drain, whose cycles a tick then pays too.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fluidpd.bench.scale_cluster import ScaleCluster, decode_on, observe_decode
from fluidpd.core.request import Request
from fluidpd.policy.base import Policy
from fluidpd.policy.routing import NoRoutableWorker
from fluidpd.policy.telemetry import prompt_pool
from fluidpd.policy.view import Role


@dataclass
class Timings:
    """Seconds each timed call took, by kind: the control cycle (`tick`) and the calls a world makes
    per request (`route`, `handoff`, `admission`); wall time, and (`cpu`, by kind) the calling
    thread's CPU time, which other processes on a shared host do not inflate."""

    tick: list[float] = field(default_factory=list)
    route: list[float] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)
    admission: list[float] = field(default_factory=list)
    submit: list[float] = field(default_factory=list)  # the runtime's whole arrival path (`Coordinator.submit`)
    # fluidpd-pools: each pool's tick (one per pool per period), the router tier's cycle and its pick of a pool
    pool_tick: list[float] = field(default_factory=list)
    tier_tick: list[float] = field(default_factory=list)
    tier_route: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    arrivals: int = 0  # requests that arrived over the periods churned
    steps: int = 0  # decode steps the workers took over them
    periods: int = 0

    def time(self, kind: str, fn, *args):
        """`fn(*args)`, timed as `kind`."""
        w0, c0 = time.perf_counter(), time.thread_time()
        out = fn(*args)
        c1, w1 = time.thread_time(), time.perf_counter()
        getattr(self, kind).append(w1 - w0)
        self.cpu.setdefault(kind, []).append(c1 - c0)
        return out


def churn(
    cl: ScaleCluster,
    period_s: float,
    timings: Timings,
    sample: int = 4,
    arrive: Callable[[ScaleCluster, Timings], None] | None = None,
    on_finish: Callable[[Request], None] | None = None,
) -> None:
    """One control period of a busy cluster (see the module's docstring; `cl.now` moves on by
    `period_s` unless it is 0: a world whose clock runs by itself). The first `sample` arrivals and
    hand-offs of the period go through the policy, timed into `timings` (arrivals by `arrive`: by
    default admission's estimate and the policy's route); the rest are placed round-robin (a decision
    per request costs what it costs whatever the others do, and timing every one would make a large
    cluster's run take hours). `on_finish`: called with each request that finishes."""
    cl.now += period_s
    rng, finished = cl.rng, 0
    for w in cl.workers:
        if not w.decoding or rng.random() > max(period_s, 0.01) / max(w.step_time_ewma_s, 0.01):
            continue
        timings.steps += 1
        growth = w.growth_blocks()
        if growth <= w.free_blocks:
            w.allocate(growth)
        for done in w.decode_tick(cl.now, cl.slo.tbt_s, _no_gap):
            w.leave(done)
            w.release(done)
            finished += 1
            if on_finish is not None:
                on_finish(done)
        observe_decode(cl, w)
    timings.arrivals += finished
    timings.periods += 1
    pool = [w for w in prompt_pool(cl) if w.routable]
    for i in range(finished):
        if i < sample:
            (arrive or route)(cl, timings)
        else:
            pool[(cl.next_id * 7) % len(pool)].enqueue(cl.request())
    _prefill(cl, timings, sample)


def route(cl: ScaleCluster, timings: Timings) -> None:
    """A new request as a world takes it: admission's estimate (the runtime's), then the policy's
    route; both timed."""
    from fluidpd.runtime.admission import estimate_ttft

    req = cl.request()
    scale = getattr(cl.policy, "prefill_scale", 1.0)
    pools = getattr(cl.policy, "pools", None)
    if pools is None:
        timings.time("admission", estimate_ttft, cl, req, cl.prefill_time, scale)
    else:  # the router tier picks a pool; that pool's coordinator admits over its own workers
        i = timings.time("tier_route", cl.policy.choose_pool, req, cl)
        sub = PoolCluster(pools[i].view(cl).workers, cl.policy, cl.parked)
        timings.time("admission", estimate_ttft, sub, req, cl.prefill_time, scale)
    try:
        wid = timings.time("route", cl.policy.route, req, cl)
    except NoRoutableWorker:
        return
    cl.workers[wid].enqueue(req)


@dataclass
class PoolCluster:
    """What admission reads of one pool (`estimate_ttft`): its workers, the policy, the parked requests."""

    workers: object
    policy: Policy
    parked: deque


def tick(cl: ScaleCluster, timings: Timings) -> list:
    """One control cycle of the policy, timed; `fluidpd-pools`: each pool's tick timed on its own (what
    the pool's core pays), then the router tier's, their sum as the cycle's."""
    pools = getattr(cl.policy, "pools", None)
    if pools is None:
        return timings.time("tick", cl.policy.tick, cl)
    actions: list = []
    n0 = len(timings.pool_tick)
    for i in range(len(pools)):
        actions += timings.time("pool_tick", cl.policy.tick_pool, i, cl)
    actions += timings.time("tier_tick", cl.policy.tick_tier, cl)
    timings.tick.append(sum(timings.pool_tick[n0:]) + timings.tier_tick[-1])
    cpu = timings.cpu
    cpu.setdefault("tick", []).append(sum(cpu["pool_tick"][n0:]) + cpu["tier_tick"][-1])
    return actions


def _prefill(cl: ScaleCluster, timings: Timings, sample: int) -> None:
    """The oldest queued prompts beyond the target finish their prefill and go to decode (the first
    `sample` hand-offs chosen by the policy, timed; the rest round-robin over the decode workers)."""
    heads = [(w.queue[0].arrival_s, w.id, w) for w in cl.workers if w.queue]
    extra = sum(len(w.queue) for _, _, w in heads) - cl.queued_target
    heapq.heapify(heads)
    decode = [w for w in cl.workers if w.role is Role.DECODE and w.routable]
    timed = 0
    while extra > 0 and heads:
        w = heapq.heappop(heads)[2]
        req = w.queue[0]
        w.dequeue(req)
        extra -= 1
        if w.queue:
            heapq.heappush(heads, (w.queue[0].arrival_s, w.id, w))
        if not isinstance(req, Request):
            continue
        dst = w
        if w.role is Role.PREFILL and decode:
            if timed < sample:
                wid = timings.time("handoff", cl.policy.handoff, req, w, cl)
                timed += 1
            else:
                wid = decode[req.id % len(decode)].id
            dst = cl.workers[wid] if wid is not None else w
        decode_on(cl, req, dst, 1)


def _no_gap(*_) -> None:
    pass


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """(median, p99, max) of `xs` (nan when empty)."""
    if not xs:
        return math.nan, math.nan, math.nan
    s = sorted(xs)
    return s[len(s) // 2], s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)], s[-1]
