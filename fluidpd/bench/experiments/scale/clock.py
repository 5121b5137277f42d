"""The control plane's CPU inside a simulation: the policy's tick, route and hand-off calls timed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fluidpd.bench.control_scale import Timings

DECISIONS = ("tick", "route", "handoff")


@dataclass
class ControlClock:
    """Thread CPU seconds of every tick, route and hand-off decision a simulated cluster asks its policy for
    (`Timings`, as the control-plane benchmarks time them)."""

    timings: Timings = field(default_factory=Timings)

    def attach(self, cluster) -> None:
        """Wrap the policy's decision methods (an instance attribute shadows the class's)."""
        policy = cluster.policy
        for name in DECISIONS:
            fn = getattr(policy, name)
            setattr(policy, name, lambda *args, kind=name, fn=fn: self.timings.time(kind, fn, *args))

    def summary(self, span_s: float, tick_s: float) -> dict:
        """Per control cycle (`tick_s` of the `span_s` simulated; a policy without periodic control is
        never ticked): the tick's median and p99, and everything decided (ticks, routes, hand-offs)
        on average, in ms; a route's median."""
        cpu = {kind: self.timings.cpu.get(kind, []) for kind in DECISIONS}
        ticks = np.asarray(cpu["tick"] or [0.0])
        total = sum(sum(xs) for xs in cpu.values())
        return {
            "ticks": len(cpu["tick"]),
            "tick_p50_ms": float(np.percentile(ticks, 50) * 1e3),
            "tick_p99_ms": float(np.percentile(ticks, 99) * 1e3),
            "route_p50_ms": float(np.median(cpu["route"]) * 1e3) if cpu["route"] else 0.0,
            "control_cpu_per_cycle_ms": float(total / max(1.0, span_s / tick_s) * 1e3),
        }
