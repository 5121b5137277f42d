"""SGLang's cache-aware router (sgl-router `policies/cache_aware.rs`), with its defaults.

If the load is imbalanced (max - min outstanding > `balance_abs` and max > `balance_rel` x min) it
takes the least-loaded worker. Otherwise the worker with the longest cached match of the request,
if that match covers more than `cache_threshold` of it; else the worker with the smallest cache
(SGLang's smallest tree). SGLang matches text in an approximate radix tree of what it routed; here
the match is the worker's own block cache (exact: a cache it could only approximate).
"""

from __future__ import annotations

from fluidpd.policy.routers.base import Router, outstanding


class SGLangCacheAware(Router):
    """Imbalance gate, then best prefix match above a threshold, else the smallest cache."""

    name = "sglang-cache-aware"
    imitates = "SGLang router cache_aware (balance 32 / 1.0001, cache threshold 0.5)"
    balance_abs, balance_rel, cache_threshold = 32, 1.0001, 0.5

    def pick(self, req, pool, view):
        loads = {w.id: outstanding(w) for w in pool}
        hi, lo = max(loads.values()), min(loads.values())
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            return min(pool, key=lambda w: (loads[w.id], w.id))
        # equal matches (a prefix every worker holds, or a node's pooled host tier) go to the least loaded
        hit, best = max(((w.cached_tokens(req), w) for w in pool), key=lambda x: (x[0], -loads[x[1].id], -x[1].id))
        if hit > self.cache_threshold * req.prefill_target:
            return best
        return min(pool, key=lambda w: (w.num_cached_blocks, w.id))
