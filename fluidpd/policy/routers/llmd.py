"""llm-d's inference scheduler (guides/precise-prefix-cache-aware): filter, then the highest weighted
score of prefix-cache (matched share of the request's blocks, weight 2), KV-cache utilisation (free
share, weight 1) and queue (waiting requests, min-max normalised over the candidates, weight 1).
A block in the host tier scores 0.8 of a device one (its tiered prefix-cache scorer: gpu 1.0, cpu 0.8)."""

from __future__ import annotations

from fluidpd.policy.routers.base import Router, tier_weighted_tokens


class LlmD(Router):
    """Weighted scorers: prefix 2, KV utilisation 1, queue 1."""

    name = "llm-d"
    imitates = "llm-d precise prefix-cache scorer 2 : kv-cache 1 : queue 1"
    weights = (2.0, 1.0, 1.0)
    host_weight = 0.8

    def pick(self, req, pool, view):
        queues = [len(w.queue) for w in pool]
        q_lo, q_hi = min(queues), max(queues)
        total = max(1, req.prefill_target // pool[0].block_size)
        wp, wk, wq = self.weights

        def score(w) -> tuple[float, int]:
            prefix = tier_weighted_tokens(w, req, self.host_weight) / w.block_size / total
            kv = 1.0 - (w.kv_blocks_used + w.pull_blocks_pending) / w.kv_blocks_total
            queue = 1.0 if q_hi == q_lo else (q_hi - len(w.queue)) / (q_hi - q_lo)
            return wp * prefix + wk * kv + wq * queue, -w.id

        return max(pool, key=score)
