"""Per-request token streams between the runtime (loop thread) and the front end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fluidpd.runtime.api import TokenEvent

ALL_END = ("error", "abort")  # finish reasons that end every choice of a request at once


@dataclass(slots=True, eq=False)
class Stream:
    """Async iterator of one request's TokenEvents; ends after `ends` events with a finish_reason (one per
    choice of an n > 1 request), or at once after an "error" or "abort" one (every choice ends)."""

    request_id: str
    _abort: object = None  # callable(stream) installed by the runtime
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: bool = False
    ends: int = 1  # finish events that end it: the request's n
    ended: int = 0

    def put(self, event: TokenEvent) -> None:
        if not self.done:
            self.queue.put_nowait(event)
            if event.finish_reason is not None:
                self.ended += 1
                self.done = self.ended >= self.ends or event.finish_reason in ALL_END

    def __aiter__(self):
        return self._events()

    async def _events(self):
        seen = 0
        while True:
            event = await self.queue.get()
            yield event
            if event.finish_reason is not None:
                seen += 1
                if seen >= self.ends or event.finish_reason in ALL_END:
                    return

    async def abort(self) -> None:
        if not self.done and self._abort is not None:
            self._abort(self)
