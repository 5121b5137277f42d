"""`chunked`: chunked prefill mixed with decodes under a per-step token budget (Sarathi-Serve);
`chunked-late-last`: the same with FluidPD's late-last queue order."""

from __future__ import annotations

from fluidpd.policy import stepplan
from fluidpd.policy.base import Policy, PolicyConfig


class Chunked(Policy):
    """Decodes first, then prefill chunks up to `chunk_budget` tokens per step; least-loaded routing."""

    name = "chunked"

    def prefill_batching(self, role):
        return self.config.chunk_budget, True

    def plan_step(self, worker, view):
        c = self.config
        return stepplan.decodes_then_chunks(worker, c.chunk_budget, c.max_num_seqs)


class ChunkedLateLast(Chunked):
    """Chunked prefill with FluidPD's late-last order: unstarted requests past SLO_TTFT wait behind the rest."""

    name = "chunked-late-last"
    needs_costs = True  # for SLO_TTFT

    def __init__(self, config: PolicyConfig | None, slo_ttft_s: float):
        super().__init__(config)
        if not slo_ttft_s > 0:
            raise ValueError(f"{self.name} needs SLO_TTFT > 0")
        self.slo_ttft_s = slo_ttft_s

    @classmethod
    def build(cls, config=None, fluid=None, costs=None):
        if costs is None:
            raise ValueError(f"{cls.name} needs a CostModel (its SLO_TTFT)")
        return cls(config, costs.slo.ttft_s)

    def plan_step(self, worker, view):
        c = self.config
        late = stepplan.past_ttft(view.now, self.slo_ttft_s)
        return stepplan.decodes_then_chunks(worker, c.chunk_budget, c.max_num_seqs, late)
