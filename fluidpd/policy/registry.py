"""Policies by command-line name."""
from __future__ import annotations

from fluidpd.policy.base import Policy, PolicyConfig
from fluidpd.policy.chunked import Chunked
from fluidpd.policy.colocated import Colocated
from fluidpd.policy.fluidpd import FluidConfig, FluidPD, FluidTokenOnly
from fluidpd.policy.static_pd import StaticPD

POLICIES: dict[str, type[Policy]] = {
    Colocated.name: Colocated,
    Chunked.name: Chunked,
    StaticPD.name: StaticPD,
    FluidTokenOnly.name: FluidTokenOnly,
    FluidPD.name: FluidPD,
}
ELASTIC = (FluidTokenOnly.name, FluidPD.name)


def make_policy(name: str, config: PolicyConfig | None = None, fluid: FluidConfig | None = None) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(config, fluid) if name in ELASTIC else cls(config)
