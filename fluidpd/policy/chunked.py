"""`chunked`: chunked prefill mixed with decodes under a per-step token budget (Sarathi-Serve)."""

from __future__ import annotations

from fluidpd.policy import stepplan
from fluidpd.policy.base import Policy


class Chunked(Policy):
    """Decodes first, then prefill chunks up to `chunk_budget` tokens per step; least-loaded routing."""

    name = "chunked"

    def prefill_batching(self, role):
        return self.config.chunk_budget, True

    def plan_step(self, worker, view):
        c = self.config
        return stepplan.decodes_then_chunks(worker, c.chunk_budget, c.max_num_seqs)
