"""A request's state inside an engine: tokens, progress, KV block table, sampling state, output."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from fluidpd.engine.decoding_state import DecodingState
from fluidpd.engine.sampling_params import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    import torch


class SequenceStatus(str, Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    WAITING = "waiting"  # no KV (new, or preempted by recompute)
    RUNNING = "running"  # holds KV blocks; prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Tokens are prompt + output; the first `num_computed` of them have KV in `block_table`.

    A step computes the next n uncomputed tokens; when that reaches the end of the sequence,
    a token is sampled and appended, so a decoding sequence always has exactly 1 uncomputed."""

    request_id: str
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    generator: torch.Generator | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    num_dead_blocks: int = 0  # leading table entries outside every layer's sliding window: freed (NULL_BLOCK)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "capacity"
    stop_text: str | None = None  # output text cut at a stop string
    logprobs: list[TokenLogprob] | None = None
    arrival_s: float = field(default_factory=time.perf_counter)
    num_preemptions: int = 0
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of its indexed full blocks
    num_cached_tokens: int = 0  # prompt tokens whose prefill its first admission skipped (prefix cache hits)
    num_loaded_tokens: int = 0  # of those, loaded from the KV store (the rest were in the arena)
    admitted: bool = False  # it has started in this engine (first admission, or it arrived with KV)
    state: DecodingState | None = None  # penalties, bias, grammar: built from the tokens (`init_state`)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # filled as its prompt's chunks are computed
    index: int = 0  # its choice in an n > 1 request (-1: that request's prompt, before the fork)
    group: Any = None  # the SeqGroup it belongs to (n > 1), else None

    def __post_init__(self) -> None:
        if self.logprobs is None and self.params.logprobs is not None:
            self.logprobs = []
        if self.prompt_logprobs is None and self.params.prompt_logprobs is not None:
            self.prompt_logprobs = []

    def init_state(self, eos_token_ids=()) -> None:
        """Build the decoding state from the tokens so far (a new request, or one arriving with output)."""
        if DecodingState.needed(self.params):
            self.state = DecodingState(self.params, self.token_ids, self.prompt_len, eos_token_ids)

    @property
    def key(self) -> str:
        """Its id in the engine's tables and plans: the request id, or `id#index` for a forked child."""
        return self.request_id if self.group is None or self.index < 0 else f"{self.request_id}#{self.index}"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def is_decoding(self) -> bool:
        return self.num_output_tokens > 0 and self.num_uncomputed == 1

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: KV dropped, every token (prompt + output) is prefilled again."""
        self.num_computed = 0
        self.block_table = []
        self.num_dead_blocks = 0
        self.block_hashes = []
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
