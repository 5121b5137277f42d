"""The OpenAI API: /v1/completions (batches of prompts, echo), /v1/chat/completions (streaming or not; n choices)
and /v1/models."""

from __future__ import annotations

import time
from dataclasses import replace

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from fluidpd.server.body import json_body
from fluidpd.server.generation import generate
from fluidpd.server.prompts import chat_prompt, completion_prompts
from fluidpd.server.protocol import ChatCompletionRequest, CompletionRequest, check_unsupported, sampling_params
from fluidpd.server.response import PromptIn
from fluidpd.server.state import ServerState, server_state
from fluidpd.server.structured import checked
from fluidpd.server.tools import tool_request

router = APIRouter()
STREAMS = {200: {"content": {"text/event-stream": {}}, "description": "The completion, or its SSE chunks"}}


@router.get("/v1/models")
async def models(state: ServerState = Depends(server_state)):
    return {"object": "list", "data": [state.model_card()]}


@router.post("/v1/completions", responses=STREAMS)
async def completions(
    raw: Request, body: CompletionRequest = json_body(CompletionRequest), state: ServerState = Depends(server_state)
):
    t0 = time.perf_counter()
    state.check_model(body.model)
    check_unsupported(body)
    texts = [body.prompt] if isinstance(body.prompt, str) else [p for p in body.prompt if isinstance(p, str)]
    for text in texts:  # each prompt of a batch is a request of its own
        state.check_prompt_fits([text], "prompt")
    batch = await run_in_threadpool(completion_prompts, state.tokenizer, body.prompt)  # off the event loop
    params = sampling_params(body, max(map(len, batch)), state.runtime.max_model_len, "prompt", state.tokenizer)
    prompts = [PromptIn(ids, _echo_text(state, body, ids, i)) for i, ids in enumerate(batch)]
    return await generate(state, False, body, raw, prompts, params, t0)


def _echo_text(state: ServerState, body: CompletionRequest, ids: list[int], i: int) -> str | None:
    """The text an echoed prompt shows: the prompt as sent, or its ids decoded."""
    if not body.echo:
        return None
    sent = body.prompt if isinstance(body.prompt, str) else body.prompt[i] if isinstance(body.prompt[0], str) else None
    return sent if isinstance(sent, str) else state.tokenizer.decode(ids, skip_special_tokens=False)


@router.post("/v1/chat/completions", responses=STREAMS)
async def chat_completions(
    raw: Request,
    body: ChatCompletionRequest = json_body(ChatCompletionRequest),
    state: ServerState = Depends(server_state),
):
    t0 = time.perf_counter()
    state.check_model(body.model)
    check_unsupported(body)
    state.check_prompt_fits([m.content for m in body.messages if isinstance(m.content, str)], "messages")
    tools = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls, state.config.tool_call_parser)
    ids = await run_in_threadpool(chat_prompt, state.tokenizer, body.messages, tools.tools, body.chat_template_kwargs)
    params = sampling_params(body, len(ids), state.runtime.max_model_len, "messages", state.tokenizer)
    grammar = tools.grammar()
    if grammar is not None:  # (vLLM: the tool call's grammar takes the place of any response_format)
        params = replace(params, structured=await run_in_threadpool(checked, grammar, "tool_choice"))
    return await generate(state, True, body, raw, [PromptIn(ids)], params, t0, tools if tools.tools else None)
