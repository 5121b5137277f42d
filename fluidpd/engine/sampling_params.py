"""What a request asks of the sampler (`SamplingParams`, validated) and a token's logprobs: no torch.

The server builds and checks these without loading torch; the sampler itself is
`fluidpd.engine.sampling`.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        """The request's sampling RNG (None when greedy); the engine calls it, so torch is loaded by then."""
        if self.greedy:
            return None
        import torch

        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        return torch.Generator(device="cpu").manual_seed(seed)


@dataclass
class TokenLogprob:
    """The chosen token's log-probability under the model, and the `k` most likely tokens."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
