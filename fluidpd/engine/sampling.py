"""Sampling parameters (validated) and the sampler.

Random sampling runs on the CPU with one `torch.Generator` per request, so a request's draws
depend only on its seed and its own history: the same on any batch, engine or device, and a
KV hand-off carries the generator state to continue the stream exactly.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field

import torch

MAX_LOGPROBS = 20
MAX_TEMPERATURE = 2.0
GREEDY_BELOW = 1e-5  # a temperature under this is greedy, as in vLLM: logits / 1e-38 overflow float32
SEED_RANGE = (-(1 << 63), 1 << 64)  # a negative seed is folded into 64 bits


class SamplingParamError(ValueError):
    """A sampling parameter outside what the sampler accepts; `param` names the field."""

    def __init__(self, param: str, expected: str, value: object) -> None:
        super().__init__(f"{param} must be {expected}, got {value!r}")
        self.param, self.expected, self.value = param, expected, value


@dataclass
class SamplingParams:
    """What one request asks of the sampler; every field is checked on construction."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 (or under GREEDY_BELOW) = greedy (the default)
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    seed: int | None = None  # None: a random seed per request
    stop: tuple[str, ...] | list[str] | str = ()
    stop_token_ids: tuple[int, ...] | list[int] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's logprob + top-k

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens <= 0:
            raise SamplingParamError("max_tokens", "a positive integer", self.max_tokens)
        if not _is_real(self.temperature) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise SamplingParamError("temperature", f"a number in [0, {MAX_TEMPERATURE:g}]", self.temperature)
        if not _is_int(self.top_k) or self.top_k < -1:
            raise SamplingParamError("top_k", "-1 or 0 (off), or a positive integer", self.top_k)
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise SamplingParamError("top_p", "a number in (0, 1]", self.top_p)
        if self.seed is not None:
            if not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]:
                raise SamplingParamError("seed", "an integer that fits in 64 bits", self.seed)
            self.seed = int(self.seed) & ((1 << 64) - 1)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise SamplingParamError("stop", "a non-empty string or a list of them", self.stop)
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(map(_is_int, self.stop_token_ids)):
            raise SamplingParamError("stop_token_ids", "a list of integers", self.stop_token_ids)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamError(name, "true or false", getattr(self, name))
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise SamplingParamError("logprobs", f"an integer in [0, {MAX_LOGPROBS}]", self.logprobs)
        self.max_tokens, self.top_k = int(self.max_tokens), int(self.top_k)
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        self.stop = tuple(stop)
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.logprobs = None if self.logprobs is None else int(self.logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1

    def make_generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        return torch.Generator(device="cpu").manual_seed(seed)


@dataclass
class TokenLogprob:
    """The chosen token's log-probability under the model, and the `k` most likely tokens."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """One token per row of `logits` [M, vocab] (float32, any device)."""
    logits = logits.float()
    out = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        ids = logits[greedy].argmax(dim=-1).tolist()
        for i, t in zip(greedy, ids):
            out[i] = t
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        cpu = logits[rows].cpu()
        for j, i in enumerate(rows):
            out[i] = _sample_row(cpu[j], params[i], generators[i])
    lps: list[TokenLogprob | None] = [None] * len(params)
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if want:
        logp = torch.log_softmax(logits[want], dim=-1).cpu()
        for j, i in enumerate(want):
            lps[i] = _logprob(logp[j], out[i], params[i].logprobs)
    return out, lps


def _sample_row(row: torch.Tensor, p: SamplingParams, g: torch.Generator | None) -> int:
    row = row / p.temperature
    if p.top_k > 0 and p.top_k < row.numel():
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_row, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_row, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) > p.top_p  # keep until p is covered
        sorted_row = sorted_row.masked_fill(drop, float("-inf"))
        row = torch.full_like(row, float("-inf")).scatter_(0, order, sorted_row)
    probs = torch.softmax(row, dim=-1)
    return int(torch.multinomial(probs, 1, generator=g).item())


def _logprob(logp: torch.Tensor, token: int, k: int) -> TokenLogprob:
    top = {}
    if k > 0:
        vals, ids = torch.topk(logp, k)
        top = dict(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(token, float(logp[token]), top)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
