"""A heap-based discrete-event loop on a virtual clock with an explicit tie-break order."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    """Events at the same instant run in this order: work finishing frees resources before
    new work arrives, the control plane sees the state after both, and workers plan their
    next step last, with everything that happened at that instant in view."""

    STEP_END = 0
    TRANSFER_END = 1
    ARRIVAL = 2
    CONTROL = 3
    SCHEDULE = 4
    SAMPLE = 5


class EventLoop:
    """Runs callbacks in (time, kind, insertion order); deterministic for the same inputs."""

    __slots__ = ("_heap", "_seq", "events_run", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self.events_run = 0

    def at(self, time: float, kind: EventKind, fn: Callable[[Any], None], arg: Any = None) -> None:
        if time < self.now:
            raise ValueError(f"event at {time} is in the past (now {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, kind, self._seq, fn, arg))

    def quiet(self) -> bool:
        """True when nothing else is due at this instant."""
        return not self._heap or self._heap[0][0] > self.now

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: float = float("inf")) -> None:
        """Run events up to and including `until`; later events stay queued."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            time, _, _, fn, arg = pop(heap)
            self.now = time
            self.events_run += 1
            fn(arg)
