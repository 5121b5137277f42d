"""Dynamo's KV router (ai-dynamo `docs/architecture/kv_cache_routing.md`): the lowest
cost = overlap_weight x prefill blocks + decode blocks, where prefill blocks are the blocks of prompt
the worker would still compute (its queue's and this request's uncached tokens) and decode blocks
the KV it holds live plus this request's; overlap weight 1 (its default), temperature 0 (argmin).
A host-tier block counts 0.75 of a device one (KVBM's tier weights: device 1.0, host 0.75, disk 0.25)."""

from __future__ import annotations

from fluidpd.policy.routers.base import Router, tier_weighted_tokens
from fluidpd.policy.view import blocks_for


class DynamoKV(Router):
    """Argmin of overlap-weighted prefill blocks plus active decode blocks."""

    name = "dynamo-kv"
    imitates = "Dynamo KV router (overlap weight 1)"
    overlap_weight = 1.0
    host_weight = 0.75

    def pick(self, req, pool, view):
        def cost(w) -> tuple[float, int]:
            bs = w.block_size
            new = req.prefill_target - tier_weighted_tokens(w, req, self.host_weight)
            prefill = blocks_for(w.queued_uncached + int(new), bs)
            decode = w.kv_blocks_used + w.pull_blocks_pending + blocks_for(req.prefill_target, bs)
            return self.overlap_weight * prefill + decode, w.id

        return min(pool, key=cost)
