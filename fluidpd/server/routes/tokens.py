"""vLLM's /tokenize, /detokenize and /tokenizer_info."""

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


@router.get("/tokenizer_info")
async def tokenizer_info(state: ServerState = Depends(server_state)):
    """vLLM's tokenizer description (what lm-evaluation-harness's remote tokenizer reads): its special tokens,
    chat template and vocabulary size."""
    tok = state.tokenizer

    def piece(tid: int | None) -> str | None:
        return None if tid is None else tok.token_str(tid)

    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    return {
        "tokenizer_class": type(tok).__name__,
        "bos_token": piece(tok.bos_token_id),
        "eos_token": piece(eos),
        "pad_token": piece(eos),
        "chat_template": tok.chat_template,
        "vocab_size": tok.vocab_size,
        "model_max_length": state.runtime.max_model_len,
    }
