"""KVPayload: everything another engine needs to continue a request exactly where it stopped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fluidpd.engine.sampling_params import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KVLayout:
    """What two engines must agree on for their KV blocks to be interchangeable."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_numel(self) -> int:
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim


@dataclass
class ChildKV:
    """One more sequence of an n > 1 request in a KVPayload: its output, progress and block table
    (indices into the payload's blocks, the primary sequence's first: `GroupKV`)."""

    index: int
    output_ids: list[int]
    num_computed: int = 0  # 0: it holds no KV (not forked yet, or preempted)
    table: list[int] = field(default_factory=list)
    generator_state: torch.Tensor | None = None
    logprobs: list[TokenLogprob] | None = None
    num_preemptions: int = 0
    resuming: bool = False  # re-added with its tokens, not sampled since


@dataclass
class GroupKV:
    """What a KVPayload of an n > 1 request adds: the payload's own fields describe its primary
    sequence (`primary`: a choice's index, or -1 for the prompt before the fork); `blocks` holds the
    primary's blocks, then `extra_blocks` more blocks the other children hold, each once; a child's
    table index i < the primary's block count is the primary's block i."""

    n: int
    primary: int
    children: list[ChildKV] = field(default_factory=list)
    done: list[int] = field(default_factory=list)  # choices already finished
    extra_blocks: int = 0
    primary_resuming: bool = False


@dataclass
class KVPayload:
    """A request's computed KV and its state.

    `blocks` is one stacked tensor [num_blocks, num_layers, 2 (k, v), block_size, kv_heads,
    head_dim] holding positions `skip_blocks * block_size` .. `num_computed` (the last block may be
    partly filled); the first `skip_blocks` full blocks are left out: the destination holds them
    in its prefix cache. A sliding-window model's first `dead_blocks` blocks (outside every layer's
    window) are left out too, and the destination holds none of them (their ids there are NULL_BLOCK).
    `generator_state` is the request's sampling RNG state, so a seeded request keeps drawing
    the same stream after the hand-off."""

    request_id: str
    token_ids: list[int]  # prompt + output so far
    prompt_len: int
    num_computed: int  # positions whose KV is in `blocks`
    blocks: torch.Tensor
    layout: KVLayout
    params: SamplingParams
    generator_state: torch.Tensor | None = None
    logprobs: list[TokenLogprob] | None = None
    num_preemptions: int = 0
    meta: dict = field(default_factory=dict)
    skip_blocks: int = 0
    num_cached_tokens: int = 0  # the request's prefix cache hits where it was first admitted
    group: GroupKV | None = None  # n > 1: the request's other sequences
    dead_blocks: int = 0

    def __post_init__(self) -> None:
        bs = self.layout.block_size
        for name in ("skip_blocks", "dead_blocks"):
            if not 0 <= getattr(self, name) <= self.num_computed // bs:
                raise ValueError(
                    f"{name} {getattr(self, name)} out of range: {self.num_computed} computed positions "
                    f"hold {self.num_computed // bs} full blocks"
                )
        if self.skip_blocks and self.dead_blocks:
            raise ValueError("a payload skips cached blocks or leaves out dead ones, not both")
        left_out = self.skip_blocks + self.dead_blocks
        need = -(-self.num_computed // bs) - left_out + (self.group.extra_blocks if self.group else 0)
        if tuple(self.blocks.shape) != (need, *self.layout.block_shape):
            raise ValueError(
                f"KV payload blocks of shape {tuple(self.blocks.shape)} do not hold "
                f"{self.num_computed} positions of layout {self.layout.block_shape}"
            )
        if not 0 <= self.num_computed <= len(self.token_ids):
            raise ValueError(f"num_computed {self.num_computed} out of range for {len(self.token_ids)} tokens")

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() * self.blocks.element_size()

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    def to(self, device: torch.device | str) -> KVPayload:
        self.blocks = self.blocks.to(device)
        return self

    def check_layout(self, layout: KVLayout) -> None:
        if layout != self.layout:
            raise ValueError(f"KV payload layout {self.layout} does not match this engine's {layout}")
