"""Replanning (DistServe Section VI) on a simulated cluster: a profiler watches the workload; when
a shift persists, the split is searched again on recent history and applied, by restarting the
changed workers (`distserve`) or in place through FluidRole (`fluidpd`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.core.knobs import knob
from fluidpd.placement.plan import fixed_split
from fluidpd.policy import fluidrole
from fluidpd.policy.distserve import DistServe
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.view import Role
from fluidpd.sim.cluster import SimCluster
from fluidpd.sim.run import Setup
from fluidpd.workload.profiler import ProfilerConfig, WorkloadProfiler
from fluidpd.workload.trace import Trace
from fluidpd.world.events import EventKind


@dataclass(slots=True)
class ReplanConfig:
    """How often the replanner looks, and the profiler it looks through."""

    check_s: float = knob(60.0, "replanning: seconds between profiler checks")
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self) -> None:
        if not self.check_s > 0:
            raise ValueError("check_s must be > 0")


@dataclass(slots=True)
class Replan:
    """One replan: when, the split before and after, and the statistics it was made on."""

    at_s: float
    before: int
    after: int
    rate: float
    prompt_mean: float
    output_mean: float
    applied: int = 0  # workers switched or restarted


class Replanner:
    """Drives a cluster's split from the profiler: restarts under distserve, FluidRole under fluidpd."""

    def __init__(
        self,
        setup: Setup,
        config: ReplanConfig | None = None,
        restart_s: float = 0.0,
        history: Trace | None = None,
    ):
        """`history`: what the profiler saw before the run (the window the first plan was made on)."""
        self.setup, self.config, self.restart_s = setup, config or ReplanConfig(), restart_s
        self.profiler = WorkloadProfiler(self.config.profiler)
        self.replans: list[Replan] = []
        self._seen = 0
        self._next_arrival = 0
        if history is not None and len(history):
            span = history.duration_s
            for a, p, o in zip(history.arrival_s.tolist(), history.prompt_len.tolist(), history.output_len.tolist()):
                self.profiler.observe_arrival(a - span, p)
                self.profiler.observe_finished(a - span, o)
            self.profiler.rebase(0.0)

    def attach(self, cluster: SimCluster) -> None:
        """`simulate(..., before_run=replanner.attach)`: checks every check_s until the last arrival."""
        if not isinstance(cluster.policy, (DistServe, FluidPD)):
            raise ValueError(f"{cluster.policy.name} cannot change its split; replan distserve or fluidpd")
        if cluster.metrics.finished is None:
            raise ValueError("replanning reads finished requests: simulate with keep_requests=True")
        if isinstance(cluster.policy, DistServe):
            cluster.policy.restart_s = self.restart_s
        self.cluster = cluster
        end = float(cluster.trace.arrival_s[-1]) if len(cluster.trace) else 0.0
        t = self.config.check_s
        while t <= end:
            cluster.loop.at(t, EventKind.CONTROL, self._check, None)
            t += self.config.check_s

    def _observe(self, now: float) -> None:
        c, p = self.cluster, self.profiler
        arrivals, prompts = c.trace.arrival_s, c.trace.prompt_len
        while self._next_arrival < len(arrivals) and arrivals[self._next_arrival] <= now:
            p.observe_arrival(float(arrivals[self._next_arrival]), int(prompts[self._next_arrival]))
            self._next_arrival += 1
        finished = c.metrics.finished or []
        for req in finished[self._seen :]:
            p.observe_finished(req.arrival_s, req.output_len)
        self._seen = len(finished)

    def _check(self, _) -> None:
        now = self.cluster.loop.now
        self._observe(now)
        k = self.plan(now)
        if k is None:
            return
        before = self._target()
        s = self.profiler.rebase(now)
        assert s is not None
        plan = Replan(now, before, k, s.rate, s.prompt_mean, s.output_mean)
        plan.applied = self._apply(k - before)
        self.replans.append(plan)

    def plan(self, now: float) -> int | None:
        """The new split, or None to keep this one: DistServe searches again once a shift persists."""
        if not self.profiler.shifted(now):
            return None
        return fixed_split(self.profiler.history(now), self.setup)[0]

    def _target(self) -> int:
        """Prefill workers once every switch already under way has landed."""
        assert isinstance(self.cluster.policy, (DistServe, FluidPD))
        roles = {w.id: w.role for w in self.cluster.workers}
        roles.update(dict(self.cluster.policy.switching()))
        return sum(1 for r in roles.values() if r is Role.PREFILL)

    def _apply(self, delta: int) -> int:
        """Move |delta| workers toward the new split; returns how many could be moved."""
        c, pol = self.cluster, self.cluster.policy
        assert isinstance(pol, (DistServe, FluidPD))
        role = Role.PREFILL if delta > 0 else Role.DECODE
        choose = fluidrole.choose_decode_to_prefill if delta > 0 else fluidrole.choose_prefill_to_decode
        taken: set[int] = set()
        for _ in range(abs(delta)):
            wid = choose(c, lambda w: w.id not in taken)
            if wid is None:
                break
            try:
                pol.force_role(wid, role, c)  # distserve: a restart; fluidpd: FluidRole in place
            except ValueError:
                break
            taken.add(wid)
        return len(taken)
