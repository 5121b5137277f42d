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

The pool's decode steps are its other limit: a step of B decodes takes about T_1 + the per-request
part (reading each request's KV), and moving decodes between workers moves that part with them. Its
sum over the decode workers (`step_work`: each one's T_iter less the one-request step T_1), over the
horizon as the KV is, against what n workers can take within SLO_TBT (n x `step_budget`, SLO_TBT less
T_1 and FluidToken's guard), is the share of the decodes the pool serves within the TBT SLO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fluidpd.policy.view import ClusterView, Role, WorkerView


@dataclass(slots=True)
class DecodeDemand:
    """Samples of the decode pool's KV demand over the last `horizon_s` (one every `every_s`)."""

    horizon_s: float
    every_s: float = 0.1
    _samples: deque = field(default_factory=deque)  # (time, demand blocks, step work s)
    _sum: float = 0.0
    _work_sum: float = 0.0
    _last: DecodeForecast | None = None

    def observe(
        self, view: ClusterView, step_work: Callable[[WorkerView], float] | None = None, step_budget: float = 0.0
    ) -> DecodeForecast:
        """The forecast, sampling the demand now if `every_s` has passed since the last sample;
        `step_work(w)` the per-request part of decode worker w's step (seconds), `step_budget` what
        one worker's step may hold of it within SLO_TBT (none given: the KV alone)."""
        now, s = view.now, self._samples
        if self._last is not None and now - s[-1][0] < self.every_s:
            return self._last
        demand, work, pool, workers = 0, 0.0, 0, 0
        for w in view.workers:
            if w.role is Role.DECODE:
                demand += w.kv_blocks_used + w.pull_blocks_pending
                if step_work is not None and w.num_decoding:
                    work += step_work(w)
                if w.routable:
                    pool += w.kv_blocks_total
                    workers += 1
        s.append((now, demand, work))
        self._sum += demand
        self._work_sum += work
        while s[0][0] <= now - self.horizon_s:
            _, d, wk = s.popleft()
            self._sum -= d
            self._work_sum -= wk
        self._last = DecodeForecast(
            demand,
            max(demand, self._sum / len(s)),
            pool,
            pool / workers if workers else 0.0,
            max(work, self._work_sum / len(s)),
            workers,
            step_budget if step_work is not None else 0.0,
        )
        return self._last


@dataclass(frozen=True, slots=True)
class DecodeForecast:
    """The decode side of the shape as it is, over the next horizon."""

    demand_blocks: float  # decode KV demand now
    demand_h: float  # D_H: what it is predicted to be over the horizon
    pool_blocks: float  # the routable decode pool's KV
    worker_blocks: float  # one decode worker's KV (what a prefill worker that switches brings)
    step_work_h: float = 0.0  # the per-request part of the pool's decode steps over the horizon (s)
    workers: int = 0  # routable decode workers
    step_budget: float = 0.0  # what one worker's step holds of it within SLO_TBT (0: not priced)

    def served(self, extra_workers: int = 0) -> float:
        """The share of the decode demand over the horizon that the pool with `extra_workers` more
        (fewer, if negative) decode workers has KV for and decodes within SLO_TBT."""
        need = self.demand_h
        blocks = self.pool_blocks + extra_workers * self.worker_blocks
        share = 1.0 if need <= 0 else max(0.0, min(1.0, blocks / need))
        if self.step_budget > 0 and self.step_work_h > 0:
            share = min(share, max(0.0, (self.workers + extra_workers) * self.step_budget / self.step_work_h))
        return share

    @property
    def step_bound(self) -> bool:
        """The pool's decode steps take more than it can hold within SLO_TBT."""
        return self.step_budget > 0 and self.step_work_h > self.workers * self.step_budget

    def room(self, headroom: float, extra_workers: int = 0) -> float:
        """How much of the KV FluidToken borrows into (`headroom` of the pool) the pool with
        `extra_workers` more decode workers has free beyond the demand, as a share in [0, 1]."""
        blocks = self.pool_blocks + extra_workers * self.worker_blocks
        if blocks <= 0 or headroom <= 0:
            return 0.0
        return max(0.0, min(1.0, (blocks - self.demand_h) / (headroom * blocks)))
