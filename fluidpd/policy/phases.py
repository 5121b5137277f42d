"""One phase alone, as DistServe measures it (its Figure 1) and as its placement search scores it.

`prefill-only`: every worker a prefill instance serving one-token requests, so a request ends at
its first token and attainment is TTFT attainment. `decode-only`: every worker a decoding instance,
requests arrive with their prompt's KV already in place and their first token out, so
attainment is TPOT attainment.
"""

from __future__ import annotations

from fluidpd.policy import routing, stepplan
from fluidpd.policy.base import Policy
from fluidpd.policy.view import Role


class PrefillOnly(Policy):
    """Prefill instances only: shortest-queue dispatch, L_m batching; requests of one token."""

    name = "prefill-only"
    default_router = "shortest-queue"

    def roles(self, n_workers):
        return [Role.PREFILL] * n_workers

    def route(self, req, view):
        if req.output_len != 1:
            raise ValueError(f"{self.name} serves one-token requests (the prefill phase), got {req.output_len}")
        return self.pick(req, view, Role.PREFILL)

    def plan_step(self, worker, view):
        c = self.config
        return stepplan.prefill_only(worker, c.prefill_batch_tokens, c.max_num_seqs, c.max_prefill_chunk)


class DecodeOnly(Policy):
    """Decoding instances only: requests arrive prefilled and go to the least-loaded instance."""

    name = "decode-only"
    prefilled_arrivals = True

    def roles(self, n_workers):
        return [Role.DECODE] * n_workers

    def route(self, req, view):
        return routing.least_loaded_decode(view.workers)

    def plan_step(self, worker, view):
        c = self.config  # a request preempted by recompute prefills again here, between decodes
        return stepplan.decodes_then_chunks(worker, c.max_num_batched_tokens, c.max_num_seqs)

    def handoff(self, req, worker, view):
        return routing.least_loaded_decode(view.workers)
