"""LLMEngine's side of the node-shared KV store (fluidpd.engine.store_tier): room taken back from the
store's writer when short, a planned hit's blocks loaded from the store, the tiers' activity per step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fluidpd.engine.block_manager import NoFreeBlocksError
from fluidpd.engine.outputs import KVTierActivity

if TYPE_CHECKING:
    from fluidpd.engine.block_manager import Reservation
    from fluidpd.engine.sequence import Sequence
    from fluidpd.engine.store_tier import StoreTier


class TierHooks:
    """Mixin of LLMEngine: what its steps do about the KV store (none: `tier` is None)."""

    if TYPE_CHECKING:  # what LLMEngine provides
        blocks: Any
        tier: StoreTier | None

    def _reserve_room(self, wants: list[Reservation]) -> None:
        """`blocks.reserve(wants)`; short of blocks while the store's writer holds some: wait for it, then again."""
        try:
            self.blocks.reserve(wants)
        except NoFreeBlocksError:
            if self.tier is None or not self.tier.pending:
                raise
            self.tier.flush()
            self.blocks.reserve(wants)

    def _load_stored(self, seq: Sequence, upto_blocks: int) -> int:
        """Fill `seq`'s allocated blocks after its arena hits, up to `upto_blocks`, from the KV store; tokens loaded."""
        got = self.tier.load(seq, upto_blocks)  # type: ignore[union-attr]
        seq.num_loaded_tokens += got
        return got

    def _tier_activity(self) -> KVTierActivity | None:
        """The KV tiers' traffic and residency samples since the last step (None: nothing happened)."""
        pool = self.blocks.pool
        act = KVTierActivity()
        if pool.reuse_gaps_s or pool.idle_before_evict_s:
            act.reuse_gaps_s["device"], act.idle_before_evict_s["device"] = pool.reuse_gaps_s, pool.idle_before_evict_s
            pool.reuse_gaps_s, pool.idle_before_evict_s = [], []
        if self.tier is not None:
            self.tier.report(act)
        return act if act != KVTierActivity() else None
