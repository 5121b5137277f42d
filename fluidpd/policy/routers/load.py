"""Load-only routers: they never look at the prefix cache."""

from __future__ import annotations

from fluidpd.policy.routers.base import Router
from fluidpd.policy.routing import least_of, lowest_id


class LeastLoaded(Router):
    """The worker with the fewest outstanding requests (vLLM / DistServe replica dispatch)."""

    name = "least-loaded"
    imitates = "least outstanding requests"

    def pick(self, req, pool, view):
        loads = [len(w.queue) + w.num_decoding + w.num_held for w in pool]  # (`outstanding`, inlined)
        return lowest_id(least_of(pool, loads))


class ShortestQueue(Router):
    """The worker with the least queued prefill work in tokens (DistServe's prefill dispatch)."""

    name = "shortest-queue"
    imitates = "DistServe shortest prefill queue"

    def pick(self, req, pool, view):
        return min(pool, key=lambda w: (w.queued_tokens, len(w.queue), w.id))


class RoundRobin(Router):
    """Each request to the next worker in turn."""

    name = "round-robin"
    imitates = "round-robin"

    def __init__(self) -> None:
        self.turn = 0

    def pick(self, req, pool, view):
        w = pool[self.turn % len(pool)]
        self.turn += 1
        return w
