"""The World's event-loop interface on the wall clock, inside a running asyncio loop."""

from __future__ import annotations

import asyncio


class RealtimeLoop:
    """`at(time, kind, fn, arg)` runs `fn(arg)` at `time` seconds after start (kinds only order
    same-instant events in simulation; on the wall clock nothing happens at the same instant)."""

    def __init__(self, aloop: asyncio.AbstractEventLoop):
        self.aloop = aloop
        self.t0 = aloop.time()

    @property
    def now(self) -> float:
        return self.aloop.time() - self.t0

    def at(self, time: float, kind, fn, arg=None) -> None:
        self.aloop.call_at(self.t0 + time, fn, arg)

    def soon(self, fn, *args) -> None:
        """Run `fn(*args)` on the loop thread (safe from any thread)."""
        self.aloop.call_soon_threadsafe(fn, *args)

    def quiet(self) -> bool:
        return True
