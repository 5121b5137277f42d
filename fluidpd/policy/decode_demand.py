"""What the decode side of a cluster shape will need over the next horizon: the prediction behind a
prefill -> decode switch, as `fluidpd.policy.shape` is for a decode -> prefill one.

The decode pool's KV demand D is what it holds and is promised: blocks in use, and blocks promised to
hand-offs queued on it (prefilled KV that waits on a prefill worker for decode room). Over the
next horizon it is predicted as the larger of what it is now and its mean over the last horizon
(sampled every `every_s`; since the start in a younger run): a demand that rises stays until the
requests holding it finish, and one that has fallen for a moment comes back. A rise that lasts
less than tau_persist moves no worker (the decision holds it that long). The decode side of a shape
serves a share min(1, K / D_H) of it, K the routable decode pool's KV blocks: hand-offs beyond K
wait for room whatever the prefill side does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fluidpd.policy.view import ClusterView, Role


@dataclass(slots=True)
class DecodeDemand:
    """Samples of the decode pool's KV demand over the last `horizon_s` (one every `every_s`)."""

    horizon_s: float
    every_s: float = 0.1
    _samples: deque = field(default_factory=deque)  # (time, demand blocks)
    _sum: float = 0.0
    _last: DecodeForecast | None = None

    def observe(self, view: ClusterView) -> DecodeForecast:
        """The forecast, sampling the demand now if `every_s` has passed since the last sample."""
        now, s = view.now, self._samples
        if self._last is not None and now - s[-1][0] < self.every_s:
            return self._last
        demand, pool, workers = 0, 0, 0
        for w in view.workers:
            if w.role is Role.DECODE:
                demand += w.kv_blocks_used + w.pull_blocks_pending
                if w.routable:
                    pool += w.kv_blocks_total
                    workers += 1
        s.append((now, demand))
        self._sum += demand
        while s[0][0] <= now - self.horizon_s:
            self._sum -= s.popleft()[1]
        self._last = DecodeForecast(demand, max(demand, self._sum / len(s)), pool, pool / workers if workers else 0.0)
        return self._last


@dataclass(frozen=True, slots=True)
class DecodeForecast:
    """The decode side of the shape as it is, over the next horizon."""

    demand_blocks: float  # decode KV demand now
    demand_h: float  # D_H: what it is predicted to be over the horizon
    pool_blocks: float  # the routable decode pool's KV
    worker_blocks: float  # one decode worker's KV (what a prefill worker that switches brings)

    def served(self, extra_workers: int = 0) -> float:
        """The share of the decode demand over the horizon that the pool with `extra_workers` more
        (fewer, if negative) decode workers has KV for."""
        need = self.demand_h
        blocks = self.pool_blocks + extra_workers * self.worker_blocks
        return 1.0 if need <= 0 else max(0.0, min(1.0, blocks / need))

    def room(self, headroom: float, extra_workers: int = 0) -> float:
        """How much of the KV FluidToken borrows into (`headroom` of the pool) the pool with
        `extra_workers` more decode workers has free beyond the demand, as a share in [0, 1]."""
        blocks = self.pool_blocks + extra_workers * self.worker_blocks
        if blocks <= 0 or headroom <= 0:
            return 0.0
        return max(0.0, min(1.0, (blocks - self.demand_h) / (headroom * blocks)))
