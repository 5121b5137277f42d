"""The simulated world: steps cost what the latency model says, KV moves over modelled links."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.actions import RunPhase
from fluidpd.policy.base import Policy
from fluidpd.policy.view import StepPlan
from fluidpd.sim.config import SimConfig
from fluidpd.sim.network import Network
from fluidpd.sim.turns import Turns
from fluidpd.workload.blockmap import named_tokens, world_block_ids
from fluidpd.workload.trace import Trace
from fluidpd.world.events import EventKind, EventLoop
from fluidpd.world.host_tier import attach_host_tiers
from fluidpd.world.lifecycle import World
from fluidpd.world.worker import WorkerState

STEP_END = EventKind.STEP_END  # (an enum member read through its class costs a dictionary miss per step)


@dataclass(slots=True, eq=False)
class _Run:
    """A step in flight on a contended host: the work it has left (uncontended seconds), its rate."""

    w: WorkerState
    plan: StepPlan
    decode_only: bool
    work_s: float
    started_s: float
    updated_s: float
    rate: float = 1.0
    token: int = 0


class SimCluster(World):
    """A World on a virtual clock, fed by a trace; deterministic for a seed.

    A trace with block ids gives its requests `block_hashes` on the simulated block size (with prefix
    caching on); a trace with sessions runs closed loop (`Turns`)."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        step_time,
        kv_bytes_per_token: float,
        kv_blocks: int | Sequence[int],
        network: Network,
        metrics: MetricsCollector,
        config: SimConfig,
        nodes: Sequence[int] | None = None,
        kv_bytes: Callable[[int], float] | None = None,
    ):
        """`step_time` (and `kv_blocks`) may be one for all workers or one per worker (a deployment
        of different instances); `nodes` overrides the node of each worker; `kv_bytes(tokens)`: the
        bytes of a sequence's last `tokens` tokens of KV, what a move sends (default: tokens x
        kv_bytes_per_token; a sliding-window model's windowed layers send at most their window)."""
        node_of = config.node_of if nodes is None else nodes.__getitem__
        super().__init__(
            policy,
            kv_bytes_per_token,
            kv_blocks,
            metrics,
            config.n_workers,
            config.block_size,
            node_of,
            EventLoop(),
        )
        self.trace, self.config, self.network = trace, config, network
        self._kv_bytes = kv_bytes or super().kv_bytes
        self._kv_bytes_moved = 0.0
        self.kv_bytes_cross_node = 0.0  # of those, the bytes sent between nodes (over the NIC)
        self.step_times = list(step_time) if isinstance(step_time, Sequence) else [step_time] * config.n_workers
        self.prefill_kv_fraction = config.prefill_kv_fraction
        self.hold_first_token = config.hold_first_token
        self.rng = np.random.default_rng(config.seed)
        self._jitter_sigma = math.sqrt(math.log1p(config.step_jitter_cv**2))
        self._contended = config.contended
        self._runs: list[_Run] = []  # steps in flight, when contended
        self._copying_from = [0.0] * config.n_workers  # a worker's booked KV copies (CPU transports) ...
        self._copying_until = [0.0] * config.n_workers  # ... run from .. until
        self._host_link_until = [0.0] * config.n_workers  # loads from the host tier booked until
        self._progress = None
        self._init_trace(trace, config)
        self._attach_host_tiers()

    def _init_trace(self, trace: Trace, config: SimConfig) -> None:
        """What the world keeps of its trace: the block ids it hashes, its sessions' turns, what was sent."""
        hashed = config.enable_prefix_caching and trace.hash_block_size
        self._hash_ids = trace.hash_ids if hashed else None  # with caching off, requests carry no hashes
        self._trace_block = trace.hash_block_size or 0
        self._turns = Turns(trace)
        self._thinking = 0  # sessions' next requests scheduled to arrive
        self.sent: list[int] = []  # trace indices in the order the requests arrived (closed loops reorder)
        self.queried = bytearray(len(trace))  # by trace index: its first admission looked the cache up

    def _attach_host_tiers(self) -> None:
        """With `kv_offloading_size`: a host tier per worker, or one per node holding its workers'
        share together (`kv_offloading_pooled`)."""
        c = self.config
        if not c.kv_offloading_size:
            return
        if not c.kv_offloading_bw:
            raise ValueError("a host tier needs kv_offloading_bw (a latency model's sim_config fills it)")
        blocks = int(c.kv_offloading_size * 2**30 // (self.kv_bytes_per_token * c.block_size))
        attach_host_tiers(self.workers, blocks, c.kv_offloading_pooled, c.kv_offloading_reused_only)

    def host_loaded(self, w: WorkerState, blocks: int) -> float:
        """A load from the host tier runs on the worker's host link beside its steps (after the loads
        already booked there): the request's chunks wait for it, its neighbours' steps do not."""
        start = max(self.loop.now, self._host_link_until[w.id])
        self._host_link_until[w.id] = start + (
            blocks * self.config.block_size * self.kv_bytes_per_token / self.config.kv_offloading_bw
        )
        return self._host_link_until[w.id]

    def active(self) -> bool:
        return bool(self.outstanding) or bool(self._thinking) or self.loop.now < self.trace.arrival_s[-1]

    def run(self, progress=None) -> None:
        """Run to completion (or the drain horizon); `progress(now, completed)` is called each sample."""
        self._progress = progress
        t = self.trace
        self._arrivals = (t.arrival_s.tolist(), t.prompt_len.tolist(), t.output_len.tolist())
        if len(t):
            self.loop.at(self._arrivals[0][self._turns.open[0]], EventKind.ARRIVAL, self._arrive, 0)
            self.loop.at(0.0, EventKind.SAMPLE, self._sample, self.config.sample_s)
            if self.policy.uses_tick:
                self.loop.at(0.0, EventKind.CONTROL, self._control)
        horizon = (float(t.arrival_s[-1]) if len(t) else 0.0) + self.config.drain_s
        self.loop.run(until=horizon)

    def _arrive(self, k: int) -> None:
        """The `k`-th open-loop arrival (every request, without sessions)."""
        arrival, opened = self._arrivals[0], self._turns.open
        if k + 1 < len(opened):  # queued first, so a same-instant arrival is seen before planning
            self.loop.at(arrival[opened[k + 1]], EventKind.ARRIVAL, self._arrive, k + 1)
        self._send(opened[k], arrival[opened[k]])

    def _send(self, i: int, at_s: float) -> None:
        _, prompt, output = self._arrivals
        req, t = Request(i, at_s, prompt[i], output[i]), self.trace
        if t.n is not None:
            req.n = req.live = int(t.n[i])
        if t.constrained is not None:
            req.constrained = bool(t.constrained[i])
        if self._hash_ids is not None:
            ids = world_block_ids(self._hash_ids[i], self._trace_block, self.config.block_size, named_tokens(t, i))
            req.block_hashes = ids.tolist()
        if t.session is not None:
            req.session, req.think_time_s = int(t.session[i]), self._turns.think_s[i]
        self.outstanding += 1
        self.sent.append(i)
        self.submit(req)

    def _admit(self, w: WorkerState, req, need: int) -> int:
        if isinstance(req, Request):  # a request's id is its trace index
            self.queried[req.id] = 1
        return super()._admit(w, req, need)

    def _next_turn(self, req: Request) -> None:
        """`req` completed (or failed): its session's next request arrives its think time later."""
        j = self._turns.next[req.id]
        if j >= 0:
            self._thinking += 1
            self.loop.at(self.loop.now + self._turns.think_s[j], EventKind.ARRIVAL, self._turn, j)

    def _turn(self, j: int) -> None:
        self._thinking -= 1
        self._send(j, self.loop.now)

    def finish(self, req: Request) -> None:
        super().finish(req)
        self._next_turn(req)

    def fail(self, req: Request, reason: str) -> None:
        super().fail(req, reason)
        self._next_turn(req)

    def reject(self, req: Request) -> None:
        super().reject(req)
        self._next_turn(req)

    def on_sample(self) -> None:
        if self._progress:
            self._progress(self.loop.now, self.metrics.completed)

    def execute(self, w: WorkerState, plan: StepPlan, shape: StepShape) -> None:
        c, decode_only, now = self.config, shape.prefill_tokens == 0, self.loop.now
        duration = self.step_times[w.id](shape) * (c.step_scale_decode if decode_only else c.step_scale_prefill)
        if c.step_noise_s:
            duration = max(duration + c.step_noise_s[int(self.rng.integers(len(c.step_noise_s)))], 0.5 * duration)
        elif self._jitter_sigma:
            duration *= float(self.rng.lognormal(-0.5 * self._jitter_sigma**2, self._jitter_sigma))
        duration += c.dispatch_decode_s if decode_only else c.dispatch_prefill_s
        if self._copying_until[w.id] > now:  # KV copies queued on the worker before this step
            duration += self._copy_wait(w)
        if self._contended:
            self._runs.append(_Run(w, plan, decode_only, duration, now, now))
            self._rerate()
            return
        self.loop.at(now + duration, STEP_END, self._step_done, (w, plan, duration))

    def _step_done(self, arg) -> None:
        self.step_end(*arg)

    def _rerate(self) -> None:
        """Processor sharing: every step in flight progresses at 1 / the contention of the steps
        running now; its end moves whenever a step starts or ends (older end events go stale)."""
        now, k = self.loop.now, len(self._runs)
        decodes = sum(r.decode_only for r in self._runs)
        for run in self._runs:
            cross = k - decodes if run.decode_only else decodes
            run.work_s -= (now - run.updated_s) * run.rate
            run.updated_s, run.rate = now, 1.0 / self.config.contention(run.decode_only, k, cross)
            run.token += 1
            end = now + max(run.work_s, 0.0) / run.rate
            self.loop.at(end, EventKind.STEP_END, self._run_done, (run, run.token))

    def _run_done(self, arg) -> None:
        run, token = arg
        if token != run.token:
            return
        self._runs.remove(run)
        self._rerate()
        self.step_end(run.w, run.plan, self.loop.now - run.started_s)

    def transfer(
        self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg, skip_blocks: int = 0
    ) -> None:
        now, nbytes, c = self.loop.now, self.kv_bytes(tokens), self.config
        end = self.network.schedule(now, nbytes, src.node, dst.node, dst.id, cls)
        if c.kv_export_share or c.kv_import_share:  # the export, then the import (the destination's)
            copy_s = self.network.link_s(nbytes, src.node, dst.node)
            exported = self._copy(src, now, c.kv_export_share * copy_s)
            self._copy(dst, now + c.kv_export_share * copy_s if exported else now, c.kv_import_share * copy_s)
        self.loop.at(end, EventKind.TRANSFER_END, done, arg)

    def kv_bytes(self, tokens: int) -> float:
        return self._kv_bytes(tokens)

    def move_kv(self, req: Request, src: WorkerState, dst: WorkerState, need: int, cls: str, done) -> None:
        moved = self.kv_tokens_moved
        super().move_kv(req, src, dst, need, cls, done)
        nbytes = self.kv_bytes(self.kv_tokens_moved - moved)
        self._kv_bytes_moved += nbytes
        if src.node != dst.node:
            self.kv_bytes_cross_node += nbytes

    @property
    def kv_bytes_moved(self) -> float:
        """KV bytes hand-offs and migrations sent between workers (`kv_bytes` of each move)."""
        return self._kv_bytes_moved

    def _copy(self, w: WorkerState, start_s: float, seconds: float) -> bool:
        """Book `seconds` of KV copying on `w` from `start_s` (after its copies already booked)."""
        if seconds <= 0:
            return False
        if self._copying_until[w.id] <= start_s:  # nothing booked still runs: a fresh window
            self._copying_from[w.id] = start_s
        self._copying_until[w.id] = max(start_s, self._copying_until[w.id]) + seconds
        return True

    def _copy_wait(self, w: WorkerState) -> float:
        """What of `w`'s booked copies a step starting now waits out (none that start after it)."""
        now = self.loop.now
        return max(0.0, self._copying_until[w.id] - now) if now >= self._copying_from[w.id] else 0.0

    def run_phase(self, a: RunPhase, kv_blocks: int) -> None:
        took = self.config.phase_s(a.phase) if a.duration_s is None else a.duration_s
        self.loop.at(self.loop.now + took, EventKind.TRANSFER_END, self.phase_end, a)
