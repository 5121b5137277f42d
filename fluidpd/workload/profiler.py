"""The workload profiler of DistServe's replanning (Section VI): rolling input length, output
length and arrival rate, and a shift flagged once it has persisted.

Arrivals (time, prompt length) are seen when they come; output lengths when requests finish. The
window's statistics are compared with those of the last plan: a relative change beyond `threshold`
in any of the three, held at every check for `persist_s`, is a shift.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from fluidpd.core.knobs import knob
from fluidpd.workload.trace import Trace


@dataclass(slots=True)
class ProfilerConfig:
    """Window, threshold and persistence of the profiler."""

    window_s: float = knob(600.0, "replanning: seconds of history the profiler keeps", flag="--profile-window")
    threshold: float = knob(0.3, "replanning: relative change of rate, input or output length that is a shift")
    persist_s: float = knob(300.0, "replanning: seconds a shift must hold before a replan")

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.threshold > 0 and self.persist_s >= 0):
            raise ValueError("window_s and threshold must be > 0, persist_s >= 0")


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """Mean arrival rate, input length and output length of one window."""

    rate: float
    prompt_mean: float
    output_mean: float

    def change(self, ref: WorkloadStats) -> float:
        """Largest relative change against `ref` over the three statistics."""
        pairs = ((self.rate, ref.rate), (self.prompt_mean, ref.prompt_mean), (self.output_mean, ref.output_mean))
        return max(abs(a - b) / b if b > 0 else (0.0 if a == b else float("inf")) for a, b in pairs)


class WorkloadProfiler:
    """Rolling statistics of the live workload and the shift test against the last plan."""

    def __init__(self, config: ProfilerConfig | None = None):
        self.config = config or ProfilerConfig()
        self._arrivals: deque[tuple[float, int]] = deque()
        self._outputs: deque[tuple[float, int]] = deque()  # (arrival, output length) of finished requests
        self.reference: WorkloadStats | None = None
        self._since: float | None = None
        self._start: float | None = None

    def observe_arrival(self, at_s: float, prompt_len: int) -> None:
        if self._start is None:
            self._start = at_s
        self._arrivals.append((at_s, prompt_len))

    def observe_finished(self, arrival_s: float, output_len: int) -> None:
        self._outputs.append((arrival_s, output_len))

    def _trim(self, now: float) -> None:
        lo = now - self.config.window_s
        for q in (self._arrivals, self._outputs):
            while q and q[0][0] < lo:
                q.popleft()

    def stats(self, now: float) -> WorkloadStats | None:
        """The window's statistics (None until it holds arrivals and finished requests)."""
        self._trim(now)
        if not self._arrivals or not self._outputs:
            return None
        span = min(self.config.window_s, max(now - self._arrivals[0][0], 1e-9))
        return WorkloadStats(
            len(self._arrivals) / span,
            float(np.mean([p for _, p in self._arrivals])),
            float(np.mean([o for _, o in self._outputs])),
        )

    def shifted(self, now: float) -> bool:
        """Whether the workload has moved beyond the threshold from the reference for persist_s."""
        s = self.stats(now)
        if s is None or self._start is None or now - self._start < self.config.window_s:
            return False  # not one full window yet: no statistics to compare
        if self.reference is None:
            self.reference = s
            return False
        if s.change(self.reference) <= self.config.threshold:
            self._since = None
            return False
        self._since = now if self._since is None else self._since
        return now - self._since >= self.config.persist_s

    def rebase(self, now: float) -> WorkloadStats | None:
        """A plan was made on the current window: it becomes the reference."""
        self.reference, self._since = self.stats(now), None
        return self.reference

    def history(self, now: float, seed: int = 0) -> Trace:
        """The window as a trace to plan on: its arrivals, with output lengths drawn from the
        finished requests (those still running have no length yet)."""
        self._trim(now)
        if not self._arrivals or not self._outputs:
            raise ValueError("the profiler has no history yet")
        lo = now - self.config.window_s
        t = np.array([a for a, _ in self._arrivals]) - lo
        prompts = np.array([p for _, p in self._arrivals])
        outputs = np.random.default_rng(seed).choice(np.array([o for _, o in self._outputs]), len(t))
        return Trace("history", t, prompts, outputs, span_s=self.config.window_s)
