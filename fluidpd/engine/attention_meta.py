"""What one forward pass's attention needs to know about its batch: which rows are prefill chunks (and
their context), which are decodes (grouped, or for the paged kernel), and where each new token's K/V goes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fluidpd.engine.paged_attention import PagedDecodes


@dataclass
class PrefillSegment:
    """Rows [start, end) of the batch: one sequence's chunk at positions ctx_start.. ."""

    start: int
    end: int
    ctx_start: int
    block_ids: torch.Tensor | None = None  # blocks covering ctx_start + chunk (None: no earlier ctx)
    mask: torch.Tensor | None = None  # [chunk, T] additive mask (None: plain causal)
    window_mask: torch.Tensor | None = None  # the same within the sliding window (None: as `mask`)


@dataclass
class DecodeGroup:
    """Rows [start, end): one token per sequence, padded to the group's longest context."""

    start: int
    end: int
    block_ids: torch.Tensor  # [B * nb] flattened, padded block tables
    mask: torch.Tensor | None  # [B, 1, 1, nb * block_size] additive (None: one sequence)
    ctx_len: int = 0  # one sequence: its context length
    window_mask: torch.Tensor | None = None  # `mask` within the sliding window (several sequences)
    buffers: tuple | None = None  # gather destinations + SDPA views, made at the first layer


@dataclass
class AttentionMetadata:
    slot_blocks: torch.Tensor  # [N] block id where each new token's K/V goes
    slot_offsets: torch.Tensor  # [N] offset inside that block
    prefills: list[PrefillSegment] = field(default_factory=list)
    decodes: list[DecodeGroup] = field(default_factory=list)
    paged: PagedDecodes | None = None  # every decode row, when the model has the paged kernel
