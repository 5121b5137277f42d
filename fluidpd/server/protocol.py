"""OpenAI request bodies (pydantic) and their mapping onto the engine's SamplingParams."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticUndefined

from fluidpd.engine.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_N,
    MAX_PENALTY,
    MAX_TEMPERATURE,
    SEED_RANGE,
    SamplingParamError,
    SamplingParams,
)
from fluidpd.server.errors import APIError, bad_request
from fluidpd.server.sampling import tokenized_controls
from fluidpd.server.structured import structured_spec

# ---------------------------------------------------------------------- request bodies

MAX_BATCH = 64  # prompts in one completions request


def accepts(default: Any = PydanticUndefined, **schema) -> Any:
    """A field (or, in Annotated, a type) whose OpenAPI schema also says which values the server
    accepts; pydantic does not check these: the server's own checks answer a 400 naming the field."""
    return Field(default, json_schema_extra=schema)


TokenId = Annotated[int, accepts(minimum=0)]  # and below the vocabulary size
TokenIds = Annotated[list[TokenId], accepts(minItems=1)]
Prompt = (  # a text, its token ids, or a batch of either (each prompt its own request)
    Annotated[str, accepts(minLength=1)]
    | TokenIds
    | Annotated[list[str], accepts(minItems=1, maxItems=MAX_BATCH)]
    | Annotated[list[TokenIds], accepts(minItems=1, maxItems=MAX_BATCH)]
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class _Sampling(BaseModel):
    # other fields are kept to be named in a 400 (check_unsupported): the schema says none is accepted
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})

    model: str | None = None
    max_tokens: int | None = accepts(None, minimum=1)
    temperature: float | None = accepts(None, minimum=0, maximum=MAX_TEMPERATURE)
    top_p: float | None = accepts(None, exclusiveMinimum=0, maximum=1)
    top_k: int | None = accepts(None, minimum=-1)  # vLLM extension
    n: int | None = accepts(1, minimum=1, maximum=MAX_N)
    best_of: int | None = accepts(None, minimum=1, maximum=1)
    seed: int | None = accepts(None, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1] - 1)
    stop: str | list[str] | None = accepts(None, minLength=1)
    stop_token_ids: list[int] | None = None  # vLLM extension
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False  # vLLM extension
    include_stop_str_in_output: bool | None = False  # vLLM extension
    return_token_ids: bool | None = False  # vLLM extension: token ids in every choice
    presence_penalty: float | None = accepts(0.0, minimum=-MAX_PENALTY, maximum=MAX_PENALTY)
    frequency_penalty: float | None = accepts(0.0, minimum=-MAX_PENALTY, maximum=MAX_PENALTY)
    logit_bias: dict[str, float] | None = accepts(  # token id (a string) -> added to its logit
        None,
        propertyNames={"pattern": "^[0-9]+$"},
        additionalProperties={"type": "number", "minimum": -MAX_LOGIT_BIAS, "maximum": MAX_LOGIT_BIAS},
    )
    repetition_penalty: float | None = accepts(None, exclusiveMinimum=0)  # vLLM extension
    min_p: float | None = accepts(None, minimum=0, maximum=1)  # vLLM extension
    response_format: dict[str, Any] | None = None  # OpenAI: {"type": "text" | "json_object" | "json_schema", ...}
    structured_outputs: dict[str, Any] | None = None  # vLLM: {"json" | "regex" | "choice" | "grammar" | "json_object"}
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names for structured_outputs
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_json_object: bool | None = None
    min_tokens: int | None = accepts(None, minimum=0)  # vLLM extension: EOS and stops held off until then
    bad_words: list[str] | None = None  # vLLM extension: words never completed
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: Prompt
    max_tokens: int | None = accepts(None, minimum=0)  # 0 with echo: score the prompt only
    logprobs: int | None = accepts(None, minimum=0, maximum=MAX_LOGPROBS)
    echo: bool | None = False  # the prompt leads each choice's text (and its logprobs, with logprobs)
    prompt_logprobs: int | None = accepts(None, minimum=0, maximum=MAX_LOGPROBS)  # vLLM extension
    suffix: str | None = accepts(None, maxLength=0)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls: {"id", "type", "function": {...}}
    tool_call_id: str | None = None  # a "tool" message: the call it answers


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = accepts(minItems=1)
    max_completion_tokens: int | None = accepts(None, minimum=1)
    logprobs: bool | None = False
    top_logprobs: int | None = accepts(None, minimum=0, maximum=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None  # {"type": "function", "function": {"name", "parameters"...}}
    tool_choice: str | dict[str, Any] | None = None  # "none", "auto" (with tools), "required" or a named function
    parallel_tool_calls: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM extension: more variables for the template


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


IGNORED: frozenset[str] = frozenset()  # fields accepted without effect (none: the others answer a 400)


def check_unsupported(req: _Sampling) -> None:
    """A 400 naming the first field the server does not honour (OpenAI's words for an unknown one)."""
    if req.best_of not in (None, 1):
        raise bad_request(f"best_of={req.best_of} is not supported: only 1", "best_of")
    unknown = sorted(set(req.model_extra or ()) - IGNORED)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    if isinstance(req, ChatCompletionRequest):
        for name in ("max_tokens", "max_completion_tokens"):
            if getattr(req, name) == 0:
                raise bad_request(f"{name} must be at least 1", name)
    if isinstance(req, CompletionRequest):
        if req.max_tokens == 0 and not req.echo:
            raise bad_request("max_tokens=0 only scores the prompt: it needs echo=true", "max_tokens")
        if req.max_tokens == 0 and (req.n or 1) > 1:
            raise bad_request("max_tokens=0 scores the prompt once: n must be 1", "n")
        if req.suffix:
            raise bad_request("suffix is not supported", "suffix")


def sampling_params(
    req: _Sampling, prompt_len: int, max_model_len: int, prompt_param: str, tokenizer=None
) -> SamplingParams:
    """SamplingParams for `req` (SamplingParams checks the ranges), or a 400 naming the field the client sent;
    `tokenizer` turns bad_words into token ids and bounds the logit_bias keys."""
    if prompt_len > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {prompt_len} tokens. Please reduce the length of the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    max_tokens, logprobs, sent = _length_and_logprobs(req, prompt_len, max_model_len)
    controls = tokenized_controls(req, tokenizer)
    try:
        params = _params(req, max_tokens, logprobs, controls)
    except SamplingParamError as exc:
        name = sent.get(exc.param, exc.param)
        raise bad_request(f"{name} must be {exc.expected}, got {exc.value!r}", name) from None
    if params.min_tokens > params.max_tokens:
        raise bad_request(f"min_tokens ({params.min_tokens}) must be at most max_tokens ({max_tokens})", "min_tokens")
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


def _params(req: _Sampling, max_tokens: int, logprobs: int | None, controls: dict) -> SamplingParams:
    """`req`'s SamplingParams, its omitted fields at their defaults (a SamplingParamError for a value out of range)."""
    return SamplingParams(
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
        n=1 if req.n is None else req.n,
        prompt_logprobs=_prompt_logprobs(req, logprobs),
        presence_penalty=0.0 if req.presence_penalty is None else req.presence_penalty,
        frequency_penalty=0.0 if req.frequency_penalty is None else req.frequency_penalty,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        min_p=0.0 if req.min_p is None else req.min_p,
        min_tokens=req.min_tokens or 0,
        structured=structured_spec(req),
        **controls,
    )


def _prompt_logprobs(req: _Sampling, logprobs: int | None) -> int | None:
    """Completions: vLLM's prompt_logprobs, or the echoed prompt's (as many top tokens as `logprobs`)."""
    if not isinstance(req, CompletionRequest):
        return None
    if req.prompt_logprobs is not None:
        return max(req.prompt_logprobs, logprobs or 0) if req.echo else req.prompt_logprobs
    return logprobs if req.echo and logprobs is not None else None


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
