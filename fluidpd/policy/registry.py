"""Policies by name, each built from its config (`Policy.build`)."""

from __future__ import annotations

from fluidpd.core.registry import Registry
from fluidpd.policy.base import Policy, PolicyConfig
from fluidpd.policy.chunked import Chunked, ChunkedLateLast
from fluidpd.policy.colocated import Colocated
from fluidpd.policy.costs import CostModel
from fluidpd.policy.distserve import DistServe
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.fluidpd import FluidPD, FluidTokenOnly
from fluidpd.policy.phases import DecodeOnly, PrefillOnly
from fluidpd.policy.pools import FluidPDPools
from fluidpd.policy.static_pd import StaticPD

POLICIES: Registry[type[Policy]] = Registry("policy")
for _cls in (
    Colocated,
    Chunked,
    ChunkedLateLast,
    StaticPD,
    DistServe,
    FluidTokenOnly,
    FluidPD,
    FluidPDPools,
    PrefillOnly,
    DecodeOnly,
):
    POLICIES.add(_cls.name, _cls)


def make_policy(
    name: str, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
) -> Policy:
    return POLICIES.get(name).build(config, fluid, costs)
