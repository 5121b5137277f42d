"""The control plane's CPU inside a simulation: the policy's tick, route and hand-off calls timed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ControlClock:
    """Thread CPU seconds of every tick, route and hand-off decision a simulated cluster asks its policy for."""

    tick: list[float] = field(default_factory=list)
    route: list[float] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)

    def attach(self, cluster) -> None:
        """Wrap the policy's decision methods (an instance attribute shadows the class's)."""
        policy = cluster.policy
        for name in ("tick", "route", "handoff"):
            setattr(policy, name, self._timed(getattr(policy, name), getattr(self, name)))

    @staticmethod
    def _timed(fn, into: list[float]):
        clock = time.thread_time

        def timed(*args):
            t = clock()
            out = fn(*args)
            into.append(clock() - t)
            return out

        return timed

    def summary(self, span_s: float, tick_s: float) -> dict:
        """Per control cycle (`tick_s` of the `span_s` simulated; a policy without periodic control is
        never ticked): the tick's median and p99, and everything decided (ticks, routes, hand-offs)
        on average, in ms; a route's median."""
        ticks = np.asarray(self.tick or [0.0])
        total = ticks.sum() + sum(self.route) + sum(self.handoff)
        return {
            "ticks": len(self.tick),
            "tick_p50_ms": float(np.percentile(ticks, 50) * 1e3),
            "tick_p99_ms": float(np.percentile(ticks, 99) * 1e3),
            "route_p50_ms": float(np.median(self.route) * 1e3) if self.route else 0.0,
            "control_cpu_per_cycle_ms": float(total / max(1.0, span_s / tick_s) * 1e3),
        }
