"""When a request stops: a stop token or EOS, a stop string, or its length limit."""

from __future__ import annotations

from fluidpd.engine.sequence import Sequence
from fluidpd.engine.tokenizer import Tokenizer


def stop_reason(
    seq: Sequence, tok: int, eos_token_ids: set[int], tokenizer: Tokenizer | None, max_model_len: int
) -> str | None:
    """Why `seq` stops after sampling `tok` ("stop", "length") or None; sets `seq.stop_text` if a stop cuts it."""
    p = seq.params
    if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos_token_ids):
        if tokenizer is not None:
            seq.stop_text = tokenizer.decode(seq.output_token_ids[:-1])
        return "stop"
    if p.stop and tokenizer is not None and seq.num_output_tokens >= p.min_tokens:
        text = tokenizer.decode(seq.output_token_ids)
        # vLLM: no stop string ends within the first min_tokens - 1 tokens (it checks only each step's new text)
        floor = len(tokenizer.decode(seq.output_token_ids[: p.min_tokens - 1])) if p.min_tokens > 1 else 0
        hits = [(i, s) for s in p.stop if (i := text.find(s, max(0, floor - len(s) + 1))) >= 0]
        if hits:
            i, s = min(hits)
            seq.stop_text = text[: i + (len(s) if p.include_stop_str_in_output else 0)]
            return "stop"
    if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None
