"""Graceful drain: the first SIGTERM or Ctrl-C stops admitting; the server exits once the admitted requests end.

While it drains the server keeps listening: a new request gets 503 with Retry-After and /health 503
`{"status": "draining", "outstanding": n}`, so a load balancer takes the replica out. It exits when no
admitted request is left (their streams then finish sending before the runtime stops), or, cutting
the rest, when the timeout passes or a second signal comes: each cut stream ends with an error event
its client sees. With nothing in flight the first signal exits at once.
"""

from __future__ import annotations

import asyncio
import sys
from types import FrameType

import uvicorn

POLL_S = 0.05


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the runtime before it exits."""

    def __init__(self, config: uvicorn.Config, runtime, timeout_s: float) -> None:
        super().__init__(config)
        self.runtime, self.timeout_s = runtime, timeout_s
        self.signals = 0
        self.cut = 0  # admitted requests ended by the timeout or a second signal
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not uvicorn's: it raises a captured signal again once the server has stopped, and SIGTERM's
        # default action would then kill the process instead of letting it exit 0
        self.signals += 1

    async def on_tick(self, counter: int) -> bool:
        if self.signals and self._drain is None:
            self._drain = asyncio.create_task(self._drain_then_exit())
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        runtime, loop = self.runtime, asyncio.get_running_loop()
        runtime.drain()
        t0 = loop.time()
        if left := self._outstanding():
            _say(f"draining {left} admitted requests (new ones get 503; {self.timeout_s:g} s at most, or signal again)")
        while self._outstanding() and self.signals < 2 and loop.time() - t0 < self.timeout_s:
            await asyncio.sleep(POLL_S)
        self.cut = runtime.cut()
        if self.cut:
            why = "a second signal" if self.signals >= 2 else f"the {self.timeout_s:g} s timeout"
            _say(f"cut {self.cut} admitted requests at {why} (their streams end with an error)")
        elif left:
            _say(f"drained in {loop.time() - t0:.1f} s")
        self.should_exit = True

    def _outstanding(self) -> int:
        return self.runtime.status().get("outstanding", 0)


def _say(msg: str) -> None:
    print(f"fluidpd serve: {msg}", file=sys.stderr, flush=True)
