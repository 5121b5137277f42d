"""Prompt logprobs (vLLM's `prompt_logprobs`, OpenAI's `echo` with `logprobs`): each prompt token's
log-probability given the tokens before it, from the logits of the prefill chunks that compute them.

Position p's logits score token p + 1, so a chunk over positions [s, s + n) scores the prompt tokens
s + 1 .. min(s + n, prompt_len - 1); the prompt's first token has none (None, as vLLM). A request that
asks for them takes no prefix-cache hit: a cached token's logits are never computed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fluidpd.engine.sampling_params import TokenLogprob

if TYPE_CHECKING:
    from fluidpd.engine.sequence import Sequence


def scored_positions(seq: Sequence, n: int) -> range:
    """Positions of a chunk of `n` tokens of `seq` whose logits score a prompt token (empty when not asked)."""
    if seq.params.prompt_logprobs is None:
        return range(0)
    start = seq.num_computed
    return range(start, min(start + n, seq.prompt_len - 1))


def score(seq: Sequence, positions: range, logits: torch.Tensor) -> list[TokenLogprob | None]:
    """The entries of `seq`'s prompt logprobs that `logits` (one row per position of `positions`) give;
    led by None for the prompt's first token when `positions` starts the prompt."""
    k = seq.params.prompt_logprobs or 0
    out: list[TokenLogprob | None] = [None] if positions.start == 0 else []
    if not len(positions):
        return out
    logp = torch.log_softmax(logits.float(), dim=-1).cpu()
    targets = torch.tensor(seq.token_ids[positions.start + 1 : positions.stop + 1])
    chosen = logp.gather(1, targets[:, None])
    ranks = (logp > chosen).sum(dim=1).add_(1).tolist()
    tops = torch.topk(logp, k) if k else None
    for i, (t, lp) in enumerate(zip(targets.tolist(), chosen[:, 0].tolist())):
        top = dict(zip(tops.indices[i].tolist(), tops.values[i].tolist())) if tops is not None else {}
        out.append(TokenLogprob(t, lp, top, ranks[i]))
    return out
