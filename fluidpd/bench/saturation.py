"""The saturation load: the highest load at which the best baseline keeps >= 90% joint attainment
on the history window, found by a geometric search over the load knob. The KV-reuse experiment
searches it in simulation; the real-engine benchmarks search it on this host's calibrated profile
(`fluidpd.bench.capacity`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

FULL_PROBES, QUICK_PROBES = 7, 3
TARGET = 0.9  # the joint attainment the best baseline keeps up to the saturation load


@dataclass(frozen=True, slots=True)
class Probe:
    """One load tried: the best baseline's joint attainment there on the history window, and which it was."""

    load: float
    attainment: float
    best: str

    @property
    def passed(self) -> bool:
        return self.attainment >= TARGET


def search(start: float, probes: int, best_at: Callable[[float], Probe]) -> dict:
    """Doubling (or halving) from `start` until the target is crossed, then bisection in log space
    between the highest passing and the lowest failing load, `probes` evaluations in all. The
    saturation is the highest passing load; if none passed, the lowest load tried (`reached` False)."""
    if probes < 1 or not start > 0:
        raise ValueError("the search needs a start load > 0 and at least one probe")
    tried: list[Probe] = []
    lo: float | None = None  # highest passing
    hi: float | None = None  # lowest failing
    load = start
    while len(tried) < probes:
        p = best_at(load)
        tried.append(p)
        if p.passed:
            lo = load if lo is None else max(lo, load)
        else:
            hi = load if hi is None else min(hi, load)
        if lo is None:
            load = load / 2
        elif hi is None:
            load = load * 2
        else:
            load = math.sqrt(lo * hi)
    reached = lo is not None
    return {
        "saturation_load": lo if lo is not None else min(p.load for p in tried),
        "reached": reached,
        "lowest_failing_load": hi,
        "target_attainment": TARGET,
        "probes": [asdict(p) | {"passed": p.passed} for p in tried],
    }
