"""A sequence's decoding state beyond its RNG: what its logits processors (penalties, bias, minimum
length, bad words) and its grammar matcher need, kept as tokens are accepted and rebuilt from the
tokens alone when a sequence arrives by hand-off or migration (nothing engine-specific crosses the wire)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fluidpd.engine.sampling_params import SamplingParams


class DecodingState:
    """Per-sequence state the sampler consults before it picks a token (`process`) and updates after (`accept`)."""

    def __init__(self, params: SamplingParams, token_ids: list[int], prompt_len: int, eos_token_ids=()) -> None:
        self.params = params
        self.prompt_len = prompt_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.token_ids = token_ids  # the sequence's own list (prompt + output): read, never written here
        self.matcher = None  # a grammar matcher (fluidpd.engine.structured) when params.structured is set

    @classmethod
    def needed(cls, params: SamplingParams) -> bool:
        return params.penalized or params.structured is not None

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def process(self, row: torch.Tensor) -> torch.Tensor:
        """`row` ([vocab] float32 logits of the next token) with every processor applied (may be in place)."""
        if self.matcher is not None:
            row = self.matcher.mask(row)
        return row

    def accept(self, token: int) -> None:
        """`token` was sampled and appended to the sequence's tokens."""
        if self.matcher is not None:
            self.matcher.accept(token)
