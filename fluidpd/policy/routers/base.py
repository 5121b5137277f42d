"""The router interface: one pick among a pool of routable workers."""

from __future__ import annotations

from collections.abc import Sequence

from fluidpd.core.request import Request
from fluidpd.policy.view import ClusterView, WorkerView


class Router:
    """Picks the worker of `pool` (routable, one role, never empty) whose queue takes `req`."""

    name = "router"
    imitates = ""  # the system whose routing this reproduces

    def pick(self, req: Request, pool: Sequence[WorkerView], view: ClusterView) -> WorkerView:
        raise NotImplementedError


def tier_weighted_tokens(w: WorkerView, req: Request, host_weight: float) -> float:
    """`req`'s tokens cached on `w`, a host-tier block counted `host_weight` of a device one (as
    Dynamo's router weights G2 hits 0.75 and llm-d's scorer CPU hits 0.8)."""
    device, host = w.cached_blocks(req)
    return (device + host_weight * host) * w.block_size


def outstanding(w: WorkerView) -> int:
    """Requests on `w` (queued, decoding, and prefilled ones waiting for a pull)."""
    return len(w.queue) + w.num_decoding + w.num_held
