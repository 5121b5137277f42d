"""vLLM's logits processors on one row of next-token logits ([vocab] float32, any device), each in place.

`DecodingState.process` applies them in vLLM's order: bad words, min_tokens, logit_bias, then the
penalties (repetition, frequency, presence); `min_p` comes later, in the sampler, after temperature.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

NEG_INF = float("-inf")


def ban_bad_words(
    row: torch.Tensor, words: Iterable[tuple[int, ...]], token_ids: Sequence[int], start: int = 0
) -> torch.Tensor:
    """Ban each word's last token where the output (`token_ids[start:]`) ends with its other tokens (if any)."""
    banned = [w[-1] for w in words if len(w) == 1 or _ends_with(token_ids, start, w[:-1])]
    banned = [t for t in banned if 0 <= t < row.numel()]
    if banned:
        row[banned] = NEG_INF
    return row


def _ends_with(ids: Sequence[int], start: int, prefix: tuple[int, ...]) -> bool:
    n = len(ids)
    return n - start >= len(prefix) and tuple(ids[n - len(prefix) :]) == prefix


def ban_stop_tokens(row: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
    """min_tokens: EOS and the stop token ids (`stop_ids`, on the row's device) cannot be sampled."""
    return row.index_fill_(0, stop_ids, NEG_INF)


def add_logit_bias(row: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """logit_bias: `bias[i]` added to the logit of token `ids[i]` (ids distinct, on the row's device)."""
    return row.index_add_(0, ids, bias)


def repetition_penalty(row: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers/vLLM: each token of the prompt or output (`ids`, distinct) gets logit / p if > 0, else x p."""
    logits = row.index_select(0, ids)
    return row.index_copy_(0, ids, torch.where(logits > 0, logits / penalty, logits * penalty))


def frequency_presence_penalty(row: torch.Tensor, penalties: torch.Tensor) -> torch.Tensor:
    """OpenAI's frequency and presence penalties: each token's `decoding_state.output_penalty` ([vocab]) subtracted."""
    return row.sub_(penalties)


def min_p_filter(row: torch.Tensor, min_p: float) -> torch.Tensor:
    """vLLM's min_p: tokens with probability below min_p x the top token's probability set to -inf."""
    probs = torch.softmax(row, dim=-1)
    return row.masked_fill_(probs < probs.max() * min_p, NEG_INF)
