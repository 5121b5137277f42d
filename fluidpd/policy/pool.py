"""One pool of `fluidpd-pools` (`fluidpd.policy.pools`): its workers, its FluidPD, the aggregates its router
tier (`PoolRouter`) and FluidRole across pools (`PoolBalance`) read."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.pool_view import PoolView
from fluidpd.policy.view import ClusterView, Role


@dataclass(slots=True, eq=False)
class Pool:
    """One pool: its workers (ids, sorted), its FluidPD, and the aggregates the router tier reads."""

    index: int
    ids: list[int]
    policy: FluidPD
    queued_tokens: float = 0.0  # uncached prefill tokens queued on the workers that prefill its prompts
    prefill_workers: int = 0  # routable ones
    decode_free: int = 0  # free KV blocks of its routable decode workers, less pulls promised
    s_per_token: float = 0.0  # prefill seconds per token at L_m (the pool's f_P)
    _parent: object = None
    _view: PoolView | None = field(default=None)

    def view(self, parent: ClusterView) -> PoolView:
        if self._parent is not parent or self._view is None:
            self._parent, self._view = parent, PoolView(parent, self.ids)
        return self._view

    def wait_s(self) -> float:
        """Predicted wait of a prompt routed here now: queued prefill work per prefill worker."""
        return self.queued_tokens * self.s_per_token / max(1, self.prefill_workers)

    def refresh(self, view: PoolView) -> None:
        """The aggregates, from one pass over the pool's workers (once a cycle, on its own loop)."""
        queued = prefill = free = 0
        decode_queued = decode = 0
        for w in view.workers:
            if w.role is Role.PREFILL:
                queued += w.queued_uncached
                prefill += w.routable
            elif w.role is Role.DECODE and w.routable:
                decode_queued += w.queued_uncached
                decode += 1
                free += w.free_blocks - w.pull_blocks_pending
        if not prefill:  # all-decode: prompts wait on the decode workers, which prefill them slowly
            queued, prefill = decode_queued, 0
        self.queued_tokens, self.prefill_workers, self.decode_free = queued, prefill, free
        pol = self.policy
        batch = pol.config.prefill_batch_tokens or pol.token.config.max_chunk
        self.s_per_token = pol.prefill_work(batch) / batch
