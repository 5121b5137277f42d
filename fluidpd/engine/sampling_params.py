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
MAX_N = 16  # sequences one request may sample (OpenAI's and vLLM's `n`)
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_LOGIT_BIAS = 100.0  # |logit_bias| values (OpenAI's range)
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

    max_tokens: int = 16  # 0: the prompt is prefilled (and scored, with prompt_logprobs), nothing is sampled
    temperature: float = 0.0  # 0 (or under GREEDY_BELOW) = greedy (the default)
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    seed: int | None = None  # None: a random seed per request
    stop: tuple[str, ...] | list[str] | str = ()
    stop_token_ids: tuple[int, ...] | list[int] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's logprob + top-k
    n: int = 1  # sequences sampled from one prefill of the prompt (they share its KV blocks)
    presence_penalty: float = 0.0  # OpenAI: subtracted once from the logit of every token already in the output
    frequency_penalty: float = 0.0  # OpenAI: subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # transformers/vLLM: tokens in prompt or output, logit / p if > 0 else * p
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens are out
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never completed
    prompt_logprobs: int | None = None  # None: off; k >= 0: each prompt token's logprob + top-k
    structured: object = None  # fluidpd.engine.structured.GrammarSpec: the output follows this grammar

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise SamplingParamError("max_tokens", "a non-negative integer", self.max_tokens)
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise SamplingParamError("n", f"an integer in [1, {MAX_N}]", self.n)
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
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise SamplingParamError("prompt_logprobs", f"an integer in [0, {MAX_LOGPROBS}]", self.prompt_logprobs)
        self._check_penalties()
        self.max_tokens, self.top_k, self.n = int(self.max_tokens), int(self.top_k), int(self.n)
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        self.stop = tuple(stop)
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.logprobs = None if self.logprobs is None else int(self.logprobs)

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -MAX_PENALTY <= v <= MAX_PENALTY:
                raise SamplingParamError(name, f"a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]", v)
            setattr(self, name, float(v))
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise SamplingParamError("repetition_penalty", "a number > 0", self.repetition_penalty)
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamError("min_p", "a number in [0, 1]", self.min_p)
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise SamplingParamError("min_tokens", "a non-negative integer", self.min_tokens)
        if not isinstance(self.logit_bias, dict) or not all(
            _is_int(k) and _is_real(v) and -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS for k, v in self.logit_bias.items()
        ):
            raise SamplingParamError(
                "logit_bias",
                f"a map of token ids to numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                self.logit_bias,
            )
        words = self.bad_words_token_ids
        if not isinstance(words, (list, tuple)) or not all(
            isinstance(w, (list, tuple)) and w and all(map(_is_int, w)) for w in words
        ):
            raise SamplingParamError("bad_words", "a list of non-empty token sequences", words)
        self.repetition_penalty, self.min_p = float(self.repetition_penalty), float(self.min_p)
        self.min_tokens = int(self.min_tokens)
        self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self.bad_words_token_ids = tuple(tuple(int(t) for t in w) for w in words)

    @property
    def penalized(self) -> bool:
        """Whether any logits processor applies (the sampler skips them all otherwise)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.bad_words_token_ids
        )

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
    rank: int | None = None  # 1 + how many tokens were more likely (prompt logprobs: vLLM reports it)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
