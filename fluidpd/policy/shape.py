"""What a cluster shape will do over the next horizon: the prediction behind a FluidRole switch.

PPI reads the backlog now, lateness included: the right signal for FluidToken (milliseconds), the
wrong one for a role switch, which pays off over seconds and costs a worker's drain, its cache and,
if the deficit was a burst, a switch back. A decode -> prefill switch is taken on the predicted
prefill index of the shape as it is, at the end of `horizon_s`:

  PPI_H = max(0, W + (lambda - C) * H) / (SLO_TTFT * C)

W the queued prefill work now (seconds of f_P, no lateness), lambda the prefill work routed per second
over the last H seconds (H seconds however young the run: no history, no switch), C the shape's
prefill capacity in prefill workers: the prefill workers plus what FluidToken prefills on the decode
workers (each one's borrowing rate within its slack over a prefill worker's rate at L_m). A backlog
the shape clears within the horizon, or a burst it absorbs, is no reason to give up a decode worker.
Nor is one that a switch would not help clear: decode worker j adds 1 - beta_j prefill workers' worth
of capacity (beta_j what it already prefills by borrowing), so over the horizon it gains
(1 - beta_j) * H work-seconds, and it is taken only when that exceeds the switch's cost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MIN_SPAN_S = 1.0  # a rate over what was seen is over at least this long


@dataclass(slots=True)
class PrefillDemand:
    """Prefill work (seconds of f_P) routed over the last `horizon_s`, as a rate."""

    horizon_s: float
    _routed: deque = field(default_factory=deque)  # (time, work)
    _sum: float = 0.0
    _first: float | None = None  # when the first request was routed

    def add(self, now: float, work_s: float) -> None:
        if self._first is None:
            self._first = now
        self._routed.append((now, work_s))
        self._sum += work_s
        self._trim(now)

    def rate(self, now: float, seen: bool = False) -> float:
        """Work routed per second over the last horizon (its full length, however young the run; with
        `seen`, over the part of it since the first request was routed)."""
        self._trim(now)
        span = self.horizon_s
        if seen and self._first is not None:
            span = min(span, max(now - self._first, MIN_SPAN_S))
        return max(0.0, self._sum) / span

    def _trim(self, now: float) -> None:
        while self._routed and self._routed[0][0] <= now - self.horizon_s:
            self._sum -= self._routed.popleft()[1]


def predicted_ppi(work_s: float, rate: float, capacity: float, slo_ttft_s: float, horizon_s: float) -> float:
    """PPI_H: the backlog left after `horizon_s` at this arrival `rate` and `capacity` (prefill
    workers' worth), over what that capacity clears within SLO_TTFT."""
    if capacity <= 0:
        return float("inf") if work_s > 0 or rate > 0 else 0.0
    return max(0.0, work_s + (rate - capacity) * horizon_s) / (slo_ttft_s * capacity)


@dataclass(frozen=True, slots=True)
class PrefillForecast:
    """The prefill side of the shape as it is, over the next horizon."""

    work_s: float  # queued prefill work now (seconds of f_P)
    rate: float  # prefill work routed per second over the last horizon
    prefill_workers: int
    borrowing: dict[int, float]  # decode worker -> what it prefills by borrowing, in prefill workers
    slo_ttft_s: float
    horizon_s: float
    lendable: dict[int, float] = field(default_factory=dict)  # ... by slack alone, with KV room or not
    rate_seen: float | None = None  # `rate` over the part of the horizon seen so far (a young run)

    @property
    def capacity(self) -> float:
        return self.prefill_workers + sum(self.borrowing.values())

    @property
    def ppi(self) -> float:
        """PPI_H of this shape."""
        return predicted_ppi(self.work_s, self.rate, self.capacity, self.slo_ttft_s, self.horizon_s)

    def served(self, extra_workers: int = 0, borrowing: float | None = None) -> float:
        """The share of the prefill demand over the horizon (the queue now and what arrives) that the
        shape with `extra_workers` more (fewer, if negative) prefill workers clears, its decode
        workers borrowing `borrowing` prefill workers' worth (default: as now)."""
        rate = self.rate if self.rate_seen is None else self.rate_seen
        need = self.work_s + rate * self.horizon_s
        lent = sum(self.borrowing.values()) if borrowing is None else borrowing
        capacity = max(0.0, self.prefill_workers + extra_workers + lent)
        return 1.0 if need <= 0 else min(1.0, capacity * self.horizon_s / need)

    def gain_s(self, wid: int) -> float:
        """Prefill work-seconds decode worker `wid` adds over the horizon as a prefill worker."""
        return (1.0 - self.borrowing.get(wid, 0.0)) * self.horizon_s
