"""What FluidPD and `fluidpd-pools` share: a 10 ms control loop over a CostModel, KV affinity as the
default router, and the FluidPD knobs."""

from __future__ import annotations

from fluidpd.policy.base import Policy, PolicyConfig
from fluidpd.policy.costs import CostModel
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.routers.kv_affinity import KV_AFFINITY


class FluidBase(Policy):
    """A policy run by FluidPD's control plane: it ticks, needs the world's CostModel (SLOs and the
    fitted step times) and routes with KV affinity unless told otherwise."""

    uses_tick = True
    needs_costs = True
    default_router = KV_AFFINITY
    own_routers = (KV_AFFINITY,)

    def __init__(
        self, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
    ):
        super().__init__(config)
        if costs is None:
            raise ValueError(f"{self.name} needs a CostModel (SLOs and the fitted step times)")
        self.fluid = fluid or FluidConfig()
        self.costs = costs
        self.follows_kv = self.router_name == KV_AFFINITY

    @classmethod
    def build(cls, config=None, fluid=None, costs=None):
        return cls(config, fluid, costs)
