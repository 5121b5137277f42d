"""Dynamo's KV router (ai-dynamo `docs/architecture/kv_cache_routing.md`): the lowest
cost = overlap_weight x prefill blocks + decode blocks, where prefill blocks are the blocks of prompt
the worker would still compute (its queue's and this request's uncached tokens) and decode blocks
the KV it holds live plus this request's; overlap weight 1 (its default), temperature 0 (argmin)."""

from __future__ import annotations

from fluidpd.policy.routers.base import Router
from fluidpd.policy.view import blocks_for


class DynamoKV(Router):
    """Argmin of overlap-weighted prefill blocks plus active decode blocks."""

    name = "dynamo-kv"
    imitates = "Dynamo KV router (overlap weight 1)"
    overlap_weight = 1.0

    def pick(self, req, pool, view):
        def cost(w) -> tuple[float, int]:
            bs = w.block_size
            new = req.prefill_target - w.cached_tokens(req)
            prefill = blocks_for(w.queued_uncached + new, bs)
            decode = w.kv_blocks_used + w.pull_blocks_pending + blocks_for(req.prefill_target, bs)
            return self.overlap_weight * prefill + decode, w.id

        return min(pool, key=cost)
