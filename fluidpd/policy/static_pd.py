"""`static-pd`: DistServe's runtime on a fixed split of prefill and decode instances.

FCFS; a new request goes to the prefill instance with the shortest queue, which batches
prompts up to L_m tokens (longer prompts alone) and emits the first token; the request is
then dispatched to the least-loaded decode instance, which pulls its KV only when it has
room (until then the KV waits in the prefill instance's memory).
"""

from __future__ import annotations

from fluidpd.policy import routing, stepplan
from fluidpd.policy.base import Policy
from fluidpd.policy.view import Role


def split(n_workers: int, prefill_workers: int) -> list[Role]:
    """`prefill_workers` prefill instances first, the rest decode (0 = a quarter, at least one)."""
    if n_workers < 2:
        raise ValueError("a disaggregated policy needs at least 2 workers")
    k = prefill_workers or max(1, n_workers // 4)
    if not 1 <= k < n_workers:
        raise ValueError(f"prefill workers must be in [1, {n_workers - 1}], got {k}")
    return [Role.PREFILL] * k + [Role.DECODE] * (n_workers - k)


class StaticPD(Policy):
    """Fixed prefill/decode split: shortest-queue prefill, L_m batching, pull-based KV hand-off."""

    name = "static-pd"
    default_router = "shortest-queue"

    def roles(self, n_workers):
        return split(n_workers, self.config.prefill_workers)

    def route(self, req, view):
        return self.pick(req, view, Role.PREFILL)

    def prefill_batching(self, role):
        if role is Role.PREFILL:
            return self.config.prefill_batch_tokens, False
        return self.config.chunk_budget, True  # FluidToken's chunks on a decode worker

    def plan_step(self, worker, view):
        if worker.role is Role.PREFILL:
            c = self.config
            return stepplan.prefill_only(worker, c.prefill_batch_tokens, c.max_num_seqs, c.max_prefill_chunk)
        return stepplan.decode_only(worker)

    def handoff(self, req, worker, view):
        return routing.least_loaded_decode(view.workers)
