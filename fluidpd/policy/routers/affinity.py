"""Pure cache affinity: the longest cached match wins whatever the load (the hit-rate bound a router
can reach, and the load imbalance it costs)."""

from __future__ import annotations

from fluidpd.policy.routers.base import Router, outstanding


class CacheAffinity(Router):
    """The worker holding the longest prefix of the request; the least-loaded among equals."""

    name = "cache-affinity"
    imitates = "pure prefix affinity (no load term)"

    def pick(self, req, pool, view):
        return max(pool, key=lambda w: (w.cached_tokens(req), -outstanding(w), -w.id))
