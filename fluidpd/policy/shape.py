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


@dataclass(slots=True)
class PrefillDemand:
    """Prefill work (seconds of f_P) routed over the last `horizon_s`, as a rate."""

    horizon_s: float
    _routed: deque = field(default_factory=deque)  # (time, work)
    _sum: float = 0.0

    def add(self, now: float, work_s: float) -> None:
        self._routed.append((now, work_s))
        self._sum += work_s
        self._trim(now)

    def rate(self, now: float) -> float:
        """Work routed per second over the last horizon (its full length, however young the run)."""
        self._trim(now)
        return max(0.0, self._sum) / self.horizon_s

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

    @property
    def capacity(self) -> float:
        return self.prefill_workers + sum(self.borrowing.values())

    @property
    def ppi(self) -> float:
        """PPI_H of this shape."""
        return predicted_ppi(self.work_s, self.rate, self.capacity, self.slo_ttft_s, self.horizon_s)

    def gain_s(self, wid: int) -> float:
        """Prefill work-seconds decode worker `wid` adds over the horizon as a prefill worker."""
        return (1.0 - self.borrowing.get(wid, 0.0)) * self.horizon_s
