"""vLLM's /tokenize and /detokenize."""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Response
from starlette.concurrency import run_in_threadpool

from fluidpd.server.body import json_body
from fluidpd.server.errors import bad_request
from fluidpd.server.prompts import chat_prompt, check_token_ids
from fluidpd.server.protocol import DetokenizeRequest, TokenizeRequest
from fluidpd.server.state import ServerState, server_state

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest = json_body(TokenizeRequest), state: ServerState = Depends(server_state)):
    state.check_model(body.model)
    if body.messages is not None:
        ids = await run_in_threadpool(chat_prompt, state.tokenizer, body.messages)
    elif body.prompt is not None:
        ids = await run_in_threadpool(state.tokenizer.encode, body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise bad_request("give a prompt or messages", "prompt")
    reply = {"tokens": ids, "count": len(ids), "max_model_len": state.runtime.max_model_len}
    return Response(await run_in_threadpool(json.dumps, reply), media_type="application/json")  # 1M ids: seconds


@router.post("/detokenize")
async def detokenize(
    body: DetokenizeRequest = json_body(DetokenizeRequest), state: ServerState = Depends(server_state)
):
    state.check_model(body.model)
    return {"prompt": state.tokenizer.decode(check_token_ids(state.tokenizer, body.tokens, "tokens"))}
