"""Routers by name: which worker of a pool takes a new request (`PolicyConfig.router`)."""

from __future__ import annotations

from fluidpd.core.registry import Registry
from fluidpd.policy.routers.affinity import CacheAffinity
from fluidpd.policy.routers.base import Router
from fluidpd.policy.routers.dynamo import DynamoKV
from fluidpd.policy.routers.llmd import LlmD
from fluidpd.policy.routers.load import LeastLoaded, RoundRobin, ShortestQueue
from fluidpd.policy.routers.sglang import SGLangCacheAware

ROUTERS: Registry[type[Router]] = Registry("router")
for _cls in (LeastLoaded, ShortestQueue, RoundRobin, SGLangCacheAware, DynamoKV, LlmD, CacheAffinity):
    ROUTERS.add(_cls.name, _cls)


def make_router(name: str) -> Router:
    return ROUTERS.build(name)


def check_router(name: str, own: tuple[str, ...] = ()) -> None:
    """ValueError unless `name` is a registered router or one of the policy's `own`."""
    if name not in ROUTERS and name not in own:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join((*ROUTERS.names(), *own))}")
