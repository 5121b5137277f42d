"""The serving runtime's coordinator over fake workers (issue 54, ask 5): no engines, no processes.

`Coordinator` and its `RuntimeCluster` run as `fluidpd serve` runs them, on the asyncio loop and the
wall clock: the policy's control cycle every 10 ms (`_control`: tick, then its actions applied), the
heartbeat watch, the samplers, and new requests through `submit` (admission, route, enqueue). The
workers are `FakeBackend`s: a heartbeat or a remap answers at once, nothing else ever does. Their
states are the synthetic ones of `fluidpd.bench.scale_cluster` (`populate`), moved on every period by
`fluidpd.bench.control_scale.churn` as finished steps would move them (decode steps, finished requests,
prefills handed off); the engines' own step traffic (plans sent, results read) is not modelled, so what
is measured is the coordinator's control and admission work on top of which that traffic would run.
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from fluidpd.bench.control_scale import Timings, churn
from fluidpd.bench.scale_cluster import BLOCK, ScaleCluster, populate, setup
from fluidpd.latency.fit import fit_chunk_time, fit_prefill_time
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest, Overloaded
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.coordinator import Coordinator
from fluidpd.runtime.profile import EngineProfile
from fluidpd.sim.run import prefill_saturation_tokens
from fluidpd.world.events import EventKind

PERIOD_S = 0.010


class FakeBackend:
    """A worker with no engine: heartbeats and KV remaps are answered at once; a step, a KV move or a
    request added never completes (`churn` moves the worker's state instead)."""

    def __init__(self, worker_id: int):
        self.worker_id = worker_id
        self.pid = None
        self.alive = True

    def start(self):
        return None

    def submit(self, method: str, *args, **kwargs) -> Future:
        fut: Future = Future()
        if method == "heartbeat":
            fut.set_result({"worker_id": self.worker_id, "pid": None, "time": time.time()})
        elif method == "resize_kv":
            fut.set_result(None)
        return fut

    def close(self) -> None:
        pass


@dataclass
class Params:
    """The sampling parameters `Coordinator.submit` reads (the engine's SamplingParams without torch)."""

    max_tokens: int
    n: int = 1
    structured: object = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = True


@dataclass
class CycleStats:
    """What one run of the fake coordinator measured."""

    timings: Timings = field(default_factory=Timings)
    starts: list[float] = field(default_factory=list)  # wall time each control cycle began
    churn_s: list[float] = field(default_factory=list)  # loop CPU time of each period's `churn`
    submitted: int = 0
    refused: int = 0
    loop_cpu_s: float = 0.0  # the loop thread's CPU time over the run
    wall_s: float = 0.0

    @property
    def periods(self) -> list[float]:
        """Seconds between consecutive control cycles (the loop schedules the next 10 ms after one ends)."""
        return [b - a for a, b in zip(self.starts, self.starts[1:])]


def coordinator(n_workers: int, policy: str = "fluidpd") -> Coordinator:
    """A coordinator over `n_workers` fake workers serving Llama-3.1-8B on H100s (the profile the
    control plane prices with is fitted on the latency model, as the simulator's)."""
    s = setup()
    roofline = s.roofline()
    lm = prefill_saturation_tokens(roofline)
    profile = EngineProfile(
        (), (), roofline.decode_time(1, 1024), fit_prefill_time(roofline), fit_chunk_time(roofline), lm
    )
    config = RuntimeConfig(
        workers=n_workers,
        policy=policy,
        backend="inprocess",
        ttft_slo_s=s.slo.ttft_s,
        tbt_slo_s=s.slo.tbt_s,
        max_waiting=10**9,  # the subject is the cycle's cost, not shedding
        request_traces=0,
        scheduling=PolicyConfig(),
    )
    backends = [FakeBackend(i) for i in range(n_workers)]
    kv_blocks = s.kv_blocks(roofline)
    return Coordinator(
        backends,
        None,
        "fake",
        32768,
        32000,
        kv_blocks,
        BLOCK,
        s.model.kv_bytes_per_token,
        profile,
        config,
        prefix_caching=True,
    )


async def drive(
    n_workers: int,
    seconds: float,
    per_worker: int = 10,
    scenario: str = "steady",
    sample: int = 4,
    policy: str = "fluidpd",
    seed: int = 0,
) -> tuple[Coordinator, CycleStats]:
    """Start a coordinator over `n_workers` fake workers holding `per_worker` requests each, run it
    for `seconds` of wall time with `churn` every 10 ms (its first `sample` arrivals a period through
    `Coordinator.submit`), and return it (stopped) with what was measured."""
    coord = coordinator(n_workers, policy)
    await coord.start()
    cl = coord.cluster
    assert cl is not None
    cl.kick = lambda w: None  # type: ignore[method-assign]  # no engine steps: churn moves the workers
    run = _Churn(coord, _synthetic(coord, per_worker * n_workers, scenario, seed), sample)
    run.time_ticks()
    cl.loop.at(cl.now + PERIOD_S, EventKind.SAMPLE, run.period, cl.now + PERIOD_S)
    c0, w0 = time.thread_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    run.stats.loop_cpu_s, run.stats.wall_s = time.thread_time() - c0, time.perf_counter() - w0
    await coord.stop()
    return coord, run.stats


def _synthetic(coord: Coordinator, in_flight: int, scenario: str, seed: int) -> ScaleCluster:
    """The coordinator's workers, as a `ScaleCluster` on its policy, holding `in_flight` requests (`populate`)."""
    cl = coord.cluster
    assert cl is not None
    s = setup()
    roofline = s.roofline()
    synth = ScaleCluster(cl.policy, cl.workers, s.slo, now=cl.now, rng=random.Random(seed), next_id=10**9)
    synth.step_time, synth.prefill_time = roofline.step_time, coord.profile.prefill_time
    populate(synth, in_flight, scenario)
    return synth


class _Churn:
    """What `drive` runs on the coordinator's loop: `churn` of `synth` every period, its first `sample`
    arrivals through `Coordinator.submit`; what it measured in `stats`."""

    def __init__(self, coord: Coordinator, synth: ScaleCluster, sample: int) -> None:
        assert coord.cluster is not None
        self.coord, self.cl, self.synth, self.sample = coord, coord.cluster, synth, sample
        self.stats = CycleStats()
        self.ids = iter(range(10**9))

    def time_ticks(self) -> None:
        """The policy's control cycle timed as "tick", and when each began noted."""
        tick, stats = self.cl.policy.tick, self.stats

        def timed_tick(view):
            stats.starts.append(time.perf_counter())
            return stats.timings.time("tick", tick, view)

        self.cl.policy.tick = timed_tick  # type: ignore[method-assign]

    def arrive(self, sc: ScaleCluster, timings: Timings) -> None:
        prompt, out, _ = sc.prompt()
        request = GenerationRequest(f"fake-{next(self.ids)}", prompt, Params(max_tokens=out))
        try:
            timings.time("submit", self.coord.submit, request)
            self.stats.submitted += 1
        except Overloaded:
            self.stats.refused += 1

    def finished(self, req) -> None:
        if self.cl.live.pop(req.id, None) is not None:
            self.cl.outstanding -= 1

    def period(self, due: float) -> None:
        """Every 10 ms on the clock, whatever it costs (late: at once)."""
        cl, stats = self.cl, self.stats
        if not cl.running:
            return
        self.synth.now = cl.now
        c0 = time.thread_time()
        churn(self.synth, 0.0, stats.timings, self.sample, self.arrive, self.finished)
        stats.churn_s.append(time.thread_time() - c0)
        cl.loop.at(max(due + PERIOD_S, cl.now), EventKind.SAMPLE, self.period, due + PERIOD_S)
