"""OpenAI request bodies (pydantic), the mapping to SamplingParams, and incremental detokenization."""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

MAX_LOGPROBS = 20
CONTEXT_TOKENS = 5        # prompt tokens decoded ahead of the output (for the right leading space)
MIN_LOGPROB = -9999.0     # JSON has no -inf


class APIError(Exception):
    """An error answered with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code if code is not None else status

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


# ---------------------------------------------------------------------- request bodies

class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                      # vLLM extension
    n: int | None = 1
    best_of: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None       # vLLM extension
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False               # vLLM extension
    include_stop_str_in_output: bool | None = False   # vLLM extension
    return_token_ids: bool | None = False         # vLLM extension: token ids in every choice
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


class RoleRequest(BaseModel):
    role: str


# ---------------------------------------------------------------------- validation

def check_unsupported(req: _Sampling) -> None:
    if req.n not in (None, 1):
        raise bad_request(f"n={req.n} is not supported: only n=1", "n")
    if req.best_of not in (None, 1):
        raise bad_request(f"best_of={req.best_of} is not supported: only 1", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise bad_request(f"{name} is not supported (must be 0)", name)
    if req.logit_bias:
        raise bad_request("logit_bias is not supported", "logit_bias")
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise bad_request("echo is not supported", "echo")
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")
    if isinstance(req, ChatCompletionRequest) and req.tools:
        raise bad_request("tools are not supported", "tools")


def sampling_params(req: _Sampling, prompt_len: int, max_model_len: int, prompt_param: str):
    """SamplingParams for `req`, or a 400 naming the offending parameter."""
    from fluidpd.engine.sampling import SamplingParams

    if prompt_len > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                            f"prompt has {prompt_len} tokens. Please reduce the length of the prompt.",
                       param=prompt_param, code="context_length_exceeded")
    chat = isinstance(req, ChatCompletionRequest)
    max_tokens, mt_param = req.max_tokens, "max_tokens"
    if chat and req.max_completion_tokens is not None:
        max_tokens, mt_param = req.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = max(max_model_len - prompt_len, 1) if chat else 16
    if max_tokens < 1:
        raise bad_request(f"{mt_param} must be at least 1, got {max_tokens}", mt_param)
    if prompt_len + max_tokens > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                            f"completion.", param=mt_param, code="context_length_exceeded")
    temperature = 1.0 if req.temperature is None else req.temperature
    if not (0.0 <= temperature <= 2.0) or math.isnan(temperature):
        raise bad_request(f"temperature must be in [0, 2], got {temperature}", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not (0.0 < top_p <= 1.0):
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = 0 if req.top_k is None else req.top_k
    if top_k < -1:
        raise bad_request(f"top_k must be -1, 0 (off) or positive, got {top_k}", "top_k")
    if req.seed is not None and not -(1 << 63) <= req.seed < (1 << 64):
        raise bad_request(f"seed must fit in 64 bits, got {req.seed}", "seed")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop strings must be non-empty", "stop")
    if chat:
        logprobs = None
        if req.logprobs:
            k = req.top_logprobs or 0
            if not 0 <= k <= MAX_LOGPROBS:
                raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}", "top_logprobs")
            logprobs = k
        elif req.top_logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    else:
        logprobs = req.logprobs
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}], got {logprobs}", "logprobs")
    seed = req.seed
    if seed is not None and seed < 0:
        seed &= (1 << 64) - 1
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_k=top_k,
                              top_p=float(top_p), seed=seed, stop=tuple(stop),
                              stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=bool(req.ignore_eos),
                              include_stop_str_in_output=bool(req.include_stop_str_in_output),
                              logprobs=logprobs)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc)) from None


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template wants them: role + text content."""
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}]: only text content parts are supported", "messages")
                parts.append(part["text"])
            text = "\n".join(parts)
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": text})
    return out


# ---------------------------------------------------------------------- detokenization

class IncrementalDetokenizer:
    """Output text of one request as tokens arrive: decode a small window, emit the new suffix.

    The window (vLLM's prefix/read offsets) starts inside the prompt so the first token keeps its
    leading space. Text is held back while it ends in an incomplete UTF-8 sequence (U+FFFD) and
    while it ends in a prefix of a stop string; at a stop the text is cut at the stop string."""

    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (),
                 include_stop: bool = False) -> None:
        self.tok = tokenizer
        ctx = list(prompt_ids[-CONTEXT_TOKENS:])
        self.ids = ctx
        self.prefix, self.read = 0, len(ctx)
        self.text = ""
        self.sent = 0
        self.stop, self.include_stop = tuple(stop), include_stop

    def _advance(self, force: bool = False) -> None:
        if self.read == len(self.ids):
            return
        full = self.tok.decode(self.ids[self.prefix:])
        if full.endswith("\ufffd") and not force:
            return
        head = self.tok.decode(self.ids[self.prefix:self.read])
        if len(full) > len(head):
            self.text += full[len(head):]
        self.prefix, self.read = self.read, len(self.ids)

    def _safe_len(self) -> int:
        t, cut = self.text, len(self.text)
        for s in self.stop:
            i = t.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                cut = min(cut, i)
            for k in range(min(len(s) - 1, len(t)), 0, -1):
                if t.endswith(s[:k]):
                    cut = min(cut, len(t) - k)
                    break
        return max(cut, self.sent)

    def add(self, token_ids: list[int]) -> str:
        """New text that is safe to show after `token_ids`."""
        if token_ids:
            self.ids.extend(token_ids)
            self._advance()
        safe = self._safe_len()
        delta, self.sent = self.text[self.sent:safe], safe
        return delta

    def finish(self, reason: str | None) -> str:
        """The rest of the text at the end of the request (cut at the stop string on a stop)."""
        self._advance(force=True)
        final = self.text
        if reason == "stop" and self.stop:
            hits = [(final.find(s), s) for s in self.stop if s in final]
            if hits:
                i, s = min(hits)
                final = final[:i + (len(s) if self.include_stop else 0)]
        self.text = final
        delta = final[self.sent:]
        self.sent = max(self.sent, len(final))
        return delta

    @property
    def output_text(self) -> str:
        return self.text[:self.sent]


def finite(x: float) -> float:
    return x if math.isfinite(x) else MIN_LOGPROB
