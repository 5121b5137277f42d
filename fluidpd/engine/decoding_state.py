"""A sequence's decoding state beyond its RNG: what its logits processors (penalties, bias, minimum
length, bad words) and its grammar matcher need, kept as tokens are accepted and rebuilt from the
tokens alone when a sequence arrives by hand-off or migration (nothing engine-specific crosses the wire)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fluidpd.engine.sampling_params import SamplingParams


def output_penalty(count: int, frequency: float, presence: float) -> float:
    """OpenAI: what comes off the logit of a token seen `count` times in the output (frequency x count + presence)."""
    return frequency * count + presence if count else 0.0


class DecodingState:
    """Per-sequence state the sampler consults before it picks a token (`process`) and updates after (`accept`)."""

    def __init__(self, params: SamplingParams, token_ids: list[int], prompt_len: int, eos_token_ids=()) -> None:
        self.params = params
        self.prompt_len = prompt_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.token_ids = token_ids  # the sequence's own list (prompt + output): read, never written here
        self.matcher = None  # a grammar matcher (fluidpd.engine.structured) when params.structured is set
        self.counts = Counter(token_ids[prompt_len:])  # output token -> occurrences
        self.seen = set(token_ids) if params.repetition_penalty != 1.0 else None  # prompt and output tokens
        self._dense: dict = {}  # on the logits' device, built at the first `process`

    @classmethod
    def needed(cls, params: SamplingParams) -> bool:
        return params.penalized or params.structured is not None

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def process(self, row: torch.Tensor) -> torch.Tensor:
        """`row` ([vocab] float32 logits of the next token) with every processor applied (may be in place)."""
        p = self.params
        if p.penalized:
            from fluidpd.engine import logits_processors as lp  # torch: this module is imported without it

            dense = self._tensors(row)
            if p.bad_words_token_ids:
                row = lp.ban_bad_words(row, p.bad_words_token_ids, self.token_ids, self.prompt_len)
            if p.min_tokens and self.num_output < p.min_tokens:
                row = lp.ban_stop_tokens(row, dense["stop"])
            if p.logit_bias:
                row = lp.add_logit_bias(row, dense["bias_ids"], dense["bias"])
            if p.repetition_penalty != 1.0:
                row = lp.repetition_penalty(row, dense["seen"][: dense["num_seen"]], p.repetition_penalty)
            if p.frequency_penalty or p.presence_penalty:
                row = lp.frequency_presence_penalty(row, dense["penalties"])
        if self.matcher is not None:
            row = self.matcher.mask(row)
        return row

    def accept(self, token: int) -> None:
        """`token` was sampled and appended to the sequence's tokens."""
        self.counts[token] += 1
        dense, p = self._dense, self.params
        if dense and 0 <= token < dense["size"]:
            if "penalties" in dense:
                dense["penalties"][token] = output_penalty(self.counts[token], p.frequency_penalty, p.presence_penalty)
            if "seen" in dense and token not in self.seen:
                if dense["num_seen"] < dense["seen"].numel():
                    dense["seen"][dense["num_seen"]] = token
                    dense["num_seen"] += 1
                else:
                    self._dense = {}  # rebuilt at the next `process`
        if self.seen is not None:
            self.seen.add(token)
        if self.matcher is not None:
            self.matcher.accept(token)

    def _tensors(self, row: torch.Tensor) -> dict:
        """The dense per-token tensors the active processors read, built once per device and vocabulary size."""
        dense = self._dense
        if dense and dense["size"] == row.numel() and dense["device"] == row.device:
            return dense
        import torch

        p, size, dev = self.params, row.numel(), row.device
        dense = {"size": size, "device": dev}
        if p.min_tokens:
            stop = {t for t in (*p.stop_token_ids, *self.eos_token_ids) if 0 <= t < size}
            dense["stop"] = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
        if p.logit_bias:
            bias = {t: b for t, b in p.logit_bias.items() if 0 <= t < size}
            dense["bias_ids"] = torch.tensor(list(bias), dtype=torch.long, device=dev)
            dense["bias"] = torch.tensor(list(bias.values()), dtype=row.dtype, device=dev)
        if p.frequency_penalty or p.presence_penalty:
            ids = [t for t in self.counts if 0 <= t < size]
            pen = [output_penalty(self.counts[t], p.frequency_penalty, p.presence_penalty) for t in ids]
            penalties = torch.zeros(size, dtype=row.dtype)
            penalties[ids] = torch.tensor(pen, dtype=row.dtype)
            dense["penalties"] = penalties.to(dev)
        if p.repetition_penalty != 1.0:
            seen = sorted(t for t in self.seen if 0 <= t < size)
            room = len(seen) + max(p.max_tokens - self.num_output, len(seen), 16)  # for the output's new tokens
            dense["seen"] = torch.tensor(seen + [0] * (room - len(seen)), dtype=torch.long, device=dev)
            dense["num_seen"] = len(seen)
        self._dense = dense
        return dense
