"""The OpenAI API: /v1/completions, /v1/chat/completions (streaming or not; n=1) and /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from fluidpd.server.body import json_body
from fluidpd.server.generation import generate
from fluidpd.server.prompts import chat_prompt, completion_prompt
from fluidpd.server.protocol import ChatCompletionRequest, CompletionRequest, check_unsupported, sampling_params
from fluidpd.server.state import ServerState, server_state

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
    state.check_prompt_fits(texts, "prompt")
    ids = await run_in_threadpool(completion_prompt, state.tokenizer, body.prompt)  # off the event loop
    params = sampling_params(body, len(ids), state.runtime.max_model_len, "prompt")
    return await generate(state, False, body, raw, ids, params, t0)


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
    ids = await run_in_threadpool(chat_prompt, state.tokenizer, body.messages)
    params = sampling_params(body, len(ids), state.runtime.max_model_len, "messages")
    return await generate(state, True, body, raw, ids, params, t0)
