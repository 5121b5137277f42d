"""A request's state packed into a KVPayload for another engine, and unpacked into a new Sequence there."""

from __future__ import annotations

import torch

from fluidpd.engine.kv_transfer import GroupKV, KVLayout, KVPayload
from fluidpd.engine.sampling import SamplingParams
from fluidpd.engine.sequence import Sequence


def payload_of(
    seq: Sequence, blocks: torch.Tensor, layout: KVLayout, skip_blocks: int = 0, group: GroupKV | None = None
) -> KVPayload:
    """`seq`'s tokens, progress and sampling state around `blocks`, its computed KV past its first `skip_blocks`
    (`group`: the other sequences of its n > 1 request, whose extra blocks follow); its blocks outside a
    sliding window are left out."""
    return KVPayload(
        request_id=seq.request_id,
        token_ids=list(seq.token_ids),
        prompt_len=seq.prompt_len,
        num_computed=seq.num_computed,
        blocks=blocks,
        layout=layout,
        params=seq.params,
        generator_state=seq.generator.get_state() if seq.generator is not None else None,
        logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
        num_preemptions=seq.num_preemptions,
        skip_blocks=skip_blocks,
        num_cached_tokens=seq.num_cached_tokens,
        group=group,
        dead_blocks=seq.num_dead_blocks,
    )


def sequence_of(payload: KVPayload, request_id: str, params: SamplingParams) -> Sequence:
    """A sequence continuing `payload` (nothing computed yet; the caller places its KV).

    The sampling RNG resumes the payload's stream when the seed is unchanged."""
    seq = Sequence(
        request_id,
        list(payload.token_ids),
        payload.prompt_len,
        params,
        generator=params.make_generator(),
        logprobs=list(payload.logprobs) if payload.logprobs is not None else None,
        num_preemptions=payload.num_preemptions,
        num_cached_tokens=payload.num_cached_tokens,
    )
    if seq.generator is not None and payload.generator_state is not None and params.seed == payload.params.seed:
        seq.generator.set_state(payload.generator_state)
    return seq
