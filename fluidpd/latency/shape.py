"""Aggregated content of one engine iteration, cheap enough to build millions of times."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepShape:
    """What one engine iteration runs: prefill chunks (with earlier context) and decode tokens, aggregated."""

    prefill_tokens: int = 0  # sum of chunk lengths c
    prefill_seqs: int = 0  # number of chunks
    prefill_attn_pairs: float = 0.0  # sum over chunks of c*prior + c*(c+1)/2 (causal query-key pairs)
    prefill_kv_read: int = 0  # sum over chunks of prior context tokens whose KV is re-read
    decode_tokens: int = 0  # number of decoding sequences (one token each)
    decode_ctx: int = 0  # sum of their context lengths (KV tokens read)
    masked_rows: int = 0  # sampled rows whose logits a grammar masks first (structured outputs)

    def add_chunk(self, c: int, prior: int) -> None:
        """Add a prefill chunk of `c` tokens that follows `prior` already-cached tokens."""
        if c <= 0:
            return
        self.prefill_tokens += c
        self.prefill_seqs += 1
        self.prefill_attn_pairs += c * prior + c * (c + 1) * 0.5
        self.prefill_kv_read += prior

    def add_decodes(self, n: int, ctx_sum: int) -> None:
        """Add `n` decoding sequences whose context lengths sum to `ctx_sum`."""
        self.decode_tokens += n
        self.decode_ctx += ctx_sum

    @property
    def tokens(self) -> int:
        """Tokens pushed through the dense layers this step."""
        return self.prefill_tokens + self.decode_tokens

    def clear(self) -> None:
        """Reset to an empty step (lets a simulator reuse one object)."""
        self.prefill_tokens = self.prefill_seqs = self.prefill_kv_read = 0
        self.decode_tokens = self.decode_ctx = self.masked_rows = 0
        self.prefill_attn_pairs = 0.0
