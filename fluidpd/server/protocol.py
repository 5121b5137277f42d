"""OpenAI request bodies (pydantic) and their mapping onto the engine's SamplingParams."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticUndefined

from fluidpd.engine.sampling_params import MAX_LOGPROBS, MAX_TEMPERATURE, SEED_RANGE, SamplingParamError, SamplingParams
from fluidpd.server.errors import APIError, bad_request

# ---------------------------------------------------------------------- request bodies


def accepts(default: Any = PydanticUndefined, **schema) -> Any:
    """A field (or, in Annotated, a type) whose OpenAPI schema also says which values the server
    accepts; pydantic does not check these: the server's own checks answer a 400 naming the field."""
    return Field(default, json_schema_extra=schema)


TokenId = Annotated[int, accepts(minimum=0)]  # and below the vocabulary size
TokenIds = Annotated[list[TokenId], accepts(minItems=1)]
Prompt = (  # one prompt per request: a text, its token ids, or a list holding one of those
    Annotated[str, accepts(minLength=1)]
    | TokenIds
    | Annotated[list[str], accepts(minItems=1, maxItems=1)]
    | Annotated[list[TokenIds], accepts(minItems=1, maxItems=1)]
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = accepts(None, minimum=1)
    temperature: float | None = accepts(None, minimum=0, maximum=MAX_TEMPERATURE)
    top_p: float | None = accepts(None, exclusiveMinimum=0, maximum=1)
    top_k: int | None = accepts(None, minimum=-1)  # vLLM extension
    n: int | None = accepts(1, minimum=1, maximum=1)
    best_of: int | None = accepts(None, minimum=1, maximum=1)
    seed: int | None = accepts(None, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1] - 1)
    stop: str | list[str] | None = accepts(None, minLength=1)
    stop_token_ids: list[int] | None = None  # vLLM extension
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False  # vLLM extension
    include_stop_str_in_output: bool | None = False  # vLLM extension
    return_token_ids: bool | None = False  # vLLM extension: token ids in every choice
    presence_penalty: float | None = accepts(0.0, minimum=0, maximum=0)  # not supported: 0 only
    frequency_penalty: float | None = accepts(0.0, minimum=0, maximum=0)
    logit_bias: dict[str, float] | None = accepts(None, maxProperties=0)
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: Prompt
    logprobs: int | None = accepts(None, minimum=0, maximum=MAX_LOGPROBS)
    echo: bool | None = accepts(False, enum=[False, None])
    suffix: str | None = accepts(None, maxLength=0)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = accepts(minItems=1)
    max_completion_tokens: int | None = accepts(None, minimum=1)
    logprobs: bool | None = False
    top_logprobs: int | None = accepts(None, minimum=0, maximum=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = accepts(None, maxItems=0)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[TokenId]


class RoleRequest(BaseModel):
    role: str = accepts(enum=["prefill", "decode"])


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    """OpenAI's error body, which every route answers a failure with (errors.APIError)."""

    error: ErrorInfo


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


def sampling_params(req: _Sampling, prompt_len: int, max_model_len: int, prompt_param: str) -> SamplingParams:
    """SamplingParams for `req` (SamplingParams checks the ranges), or a 400 naming the field the client sent."""
    if prompt_len > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {prompt_len} tokens. Please reduce the length of the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    max_tokens, logprobs, sent = _length_and_logprobs(req, prompt_len, max_model_len)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=0 if req.top_k is None else req.top_k,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=() if req.stop is None else req.stop,
            stop_token_ids=req.stop_token_ids or (),
            ignore_eos=bool(req.ignore_eos),
            include_stop_str_in_output=bool(req.include_stop_str_in_output),
            logprobs=logprobs,
        )
    except SamplingParamError as exc:
        name = sent.get(exc.param, exc.param)
        raise bad_request(f"{name} must be {exc.expected}, got {exc.value!r}", name) from None
    if prompt_len + params.max_tokens > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
            f"{params.max_tokens} in the completion). Please reduce the length of the prompt "
            f"or completion.",
            param=sent.get("max_tokens", "max_tokens"),
            code="context_length_exceeded",
        )
    return params


def _length_and_logprobs(req: _Sampling, prompt_len: int, max_model_len: int) -> tuple[int, int | None, dict]:
    """max_tokens and logprobs as SamplingParams takes them, and which OpenAI field each came from if renamed."""
    chat = isinstance(req, ChatCompletionRequest)
    sent = {}  # SamplingParams field -> the OpenAI field it came from
    max_tokens = req.max_tokens
    if chat and req.max_completion_tokens is not None:
        max_tokens, sent["max_tokens"] = req.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = max(max_model_len - prompt_len, 1) if chat else 16
    if chat:
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        sent["logprobs"] = "top_logprobs"
    else:
        logprobs = req.logprobs
    return max_tokens, logprobs, sent
