"""Closed-loop sessions in the simulator: which requests arrive on the trace's clock, which wait for
their session's previous request to complete (finished, failed or rejected) plus their think time."""

from __future__ import annotations

import numpy as np

from fluidpd.workload.trace import Trace


class Turns:
    """Per trace request: its session's next request (-1: none); the requests that arrive open loop."""

    __slots__ = ("next", "open", "think_s")

    def __init__(self, trace: Trace):
        n = len(trace)
        self.next = [-1] * n
        self.think_s: list[float] = [0.0] * n
        follower = np.zeros(n, dtype=bool)
        if trace.session is not None and trace.think_time_s is not None:
            members = np.flatnonzero(trace.session >= 0)
            order = members[np.argsort(trace.session[members], kind="stable")]  # by session, then trace order
            same = trace.session[order[1:]] == trace.session[order[:-1]]
            prev, nxt = order[:-1][same], order[1:][same]
            follower[nxt] = True
            nexts = np.full(n, -1, dtype=np.int64)
            nexts[prev] = nxt
            self.next = nexts.tolist()
            self.think_s = trace.think_time_s.tolist()
        self.open: list[int] = np.flatnonzero(~follower).tolist()  # in trace (arrival) order
