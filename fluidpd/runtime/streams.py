"""Per-request token streams between the runtime (loop thread) and the front end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fluidpd.runtime.api import TokenEvent


@dataclass(slots=True, eq=False)
class Stream:
    """Async iterator of one request's TokenEvents; ends after the event with a finish_reason."""

    request_id: str
    _abort: object = None  # callable(stream) installed by the runtime
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    done: bool = False

    def put(self, event: TokenEvent) -> None:
        if not self.done:
            self.queue.put_nowait(event)
            self.done = event.finish_reason is not None

    def __aiter__(self):
        return self._events()

    async def _events(self):
        while True:
            event = await self.queue.get()
            yield event
            if event.finish_reason is not None:
                return

    async def abort(self) -> None:
        if not self.done and self._abort is not None:
            self._abort(self)
