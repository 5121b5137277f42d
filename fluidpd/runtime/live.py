"""A request as the runtime keeps it: ids, tokens, the stream its tokens go to."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.core.request import Request


@dataclass(slots=True, eq=False)
class Live:
    """What the runtime keeps of a request besides the shared Request: ids, tokens, its stream."""

    request: Request
    prompt_ids: list[int]
    params: object
    stream: object
    out_ids: list[int] = field(default_factory=list)
    engine_id: str = ""
    engine_worker: int = -1  # the engine that holds it now (-1: none)
    admissions: int = 0
    aborted: bool = False
    finish_reason: str | None = None
    error: str | None = None  # why its engine refused it
