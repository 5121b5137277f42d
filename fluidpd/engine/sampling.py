"""Sampling parameters (validated) and the sampler.

Random sampling runs on the CPU with one `torch.Generator` per request, so a request's draws
depend only on its seed and its own history: the same on any batch, engine or device, and a
KV hand-off carries the generator state to continue the stream exactly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0            # 0 = greedy (the default)
    top_k: int = 0                      # 0 or -1 = off
    top_p: float = 1.0
    seed: int | None = None             # None: a random seed per request
    stop: tuple[str, ...] | list[str] | str = ()
    stop_token_ids: tuple[int, ...] | list[int] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None         # None: off; k >= 0: the chosen token's logprob + top-k

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> tuple[list[int], list[TokenLogprob | None]]:
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
        drop = (torch.cumsum(probs, dim=-1) - probs) > p.top_p   # keep until p is covered
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
