"""A pool's view of the cluster: the same `ClusterView`, showing only the pool's workers.

FluidPD, FluidToken, FluidRole and the routers index workers by id, never by position:
`view.workers[wid]` is worker `wid` (the worlds keep worker i at position i) and every per-worker
record (FluidToken's trackers, the shape forecast's lendable rates, a transition's worker) is keyed
by `w.id`. A pool's sub-view therefore keeps ids as they are: iterating it yields the pool's workers
(in id order, so one pool holding every worker reads exactly as the cluster does), `workers[wid]`
is worker `wid` of the parent view (ids a policy indexes are ids it found by iterating its pool, or
the worker a world hands it), and `len` is the pool's size. Worker states are read from the parent
on every access: a world that replaces a lost worker's state is seen at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from fluidpd.policy.view import ClusterView, WorkerView


class PoolWorkers(Sequence[WorkerView]):
    """The pool's workers: iterated in id order, indexed by worker id."""

    __slots__ = ("_ids", "_parent")

    def __init__(self, parent: ClusterView, ids: list[int]):
        self._parent = parent
        self._ids = ids  # the pool's own list: membership changes show at once

    def __iter__(self) -> Iterator[WorkerView]:
        return map(self._parent.workers.__getitem__, self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, w: object) -> bool:
        return getattr(w, "id", None) in self._ids

    @overload
    def __getitem__(self, wid: int) -> WorkerView: ...
    @overload
    def __getitem__(self, wid: slice) -> Sequence[WorkerView]: ...
    def __getitem__(self, wid):
        if isinstance(wid, slice):
            raise TypeError("a pool's workers are indexed by worker id, not sliced")
        return self._parent.workers[wid]


class PoolView:
    """`ClusterView` of one pool: the parent's clock, the pool's workers (`PoolWorkers`)."""

    __slots__ = ("parent", "workers")

    def __init__(self, parent: ClusterView, ids: list[int]):
        self.parent = parent
        self.workers = PoolWorkers(parent, ids)

    @property
    def now(self) -> float:
        return self.parent.now
