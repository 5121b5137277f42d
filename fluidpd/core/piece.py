"""A slice of a request's prompt prefilled on its own worker (FluidToken's parallel spread)."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.request import Request


@dataclass(slots=True, eq=False)
class PrefillPiece:
    """Prompt tokens [offset, offset + length) of `parent`; attends to the `offset` tokens before it."""

    parent: Request
    offset: int
    length: int
    prefilled: int = 0
    worker: int = -1
    queued_hit: int = 0  # a piece has no cached prefix

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1 or self.offset + self.length > self.parent.prompt_len:
            raise ValueError(f"piece [{self.offset}, +{self.length}) outside request {self.parent.id}'s prompt")

    @property
    def id(self) -> int:
        return self.parent.id

    @property
    def arrival_s(self) -> float:
        return self.parent.arrival_s

    @property
    def prefill_target(self) -> int:
        return self.length

    @property
    def prefill_remaining(self) -> int:
        return self.length - self.prefilled

    @property
    def kv_prior(self) -> int:
        """Prompt tokens before the next chunk: the earlier pieces plus this one's progress."""
        return self.offset + self.prefilled


def split_prompt(req: Request, parts: int) -> list[PrefillPiece]:
    """`parts` near-equal consecutive pieces covering the whole prompt."""
    if not 1 <= parts <= req.prompt_len:
        raise ValueError(f"cannot split a {req.prompt_len}-token prompt into {parts} pieces")
    base, extra = divmod(req.prompt_len, parts)
    pieces, offset = [], 0
    for i in range(parts):
        length = base + (1 if i < extra else 0)
        pieces.append(PrefillPiece(req, offset, length))
        offset += length
    return pieces
