"""`colocated`: vLLM-style continuous batching on every worker, prefill prioritised."""

from __future__ import annotations

from fluidpd.policy import stepplan
from fluidpd.policy.base import Policy


class Colocated(Policy):
    """Every worker prefills and decodes; new prompts preempt decode steps; least-loaded routing."""

    name = "colocated"

    def plan_step(self, worker, view):
        c = self.config
        return stepplan.prefill_first(worker, c.max_num_batched_tokens, c.max_num_seqs, c.max_prefill_chunk)
