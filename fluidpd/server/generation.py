"""One generation request from submit to the HTTP response: SSE chunks or a whole JSON body.

Every accepted request is finished exactly once in the metrics; a client that goes away (or a
cancelled handler) aborts the request in the runtime.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from fluidpd.runtime.api import Draining, GenerationRequest, LimitExceeded, Overloaded, TokenEvent, Unavailable
from fluidpd.server.errors import APIError, bad_request, draining, error_body
from fluidpd.server.metrics import RequestTimer
from fluidpd.server.output import ChoiceOutput
from fluidpd.server.state import ServerState

log = logging.getLogger("fluidpd.server")
_background: set[asyncio.Task] = set()


async def generate(state: ServerState, chat: bool, body, raw: Request, ids: list[int], params, t0: float):
    """Submit `ids` with `params` and answer as `body` asks (stream or not); `t0`: request arrival."""
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        stream = state.runtime.submit(GenerationRequest(rid, ids, params, meta={"chat": chat}))
    except LimitExceeded as exc:
        raise APIError(400, str(exc), param="messages" if chat else "prompt", code=exc.code) from None
    except ValueError as exc:
        raise bad_request(str(exc), "messages" if chat else "prompt") from None
    except Draining as exc:
        raise draining(exc.retry_after_s) from None
    except Unavailable as exc:
        log.error("request %s refused: %s", rid, exc)
        raise APIError(503, "no worker can serve now (see the server log)", "service_unavailable") from None
    except Overloaded as exc:
        state.metrics.rejected_overload()
        raise APIError(
            429,
            f"the server is overloaded: {exc}; retry later",
            "rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
        ) from None
    timer = state.metrics.request(t0, len(ids))
    out = ChoiceOutput(state.tokenizer, ids, params, chat)
    reply = _Reply(
        rid,
        int(time.time()),
        state.model_name,
        chat,
        out,
        timer,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        per_token=bool(body.return_token_ids) or params.logprobs is not None,
        return_token_ids=bool(body.return_token_ids),
    )
    if body.stream:
        return StreamingResponse(
            _sse(stream, reply),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _whole(stream, reply, raw)


class _Reply:
    """The response bodies of one request: SSE chunks while streaming, or the whole completion."""

    def __init__(self, rid, created, model, chat, out, timer, *, include_usage, per_token, return_token_ids):
        self.rid, self.created, self.model, self.chat = rid, created, model, chat
        self.out: ChoiceOutput = out
        self.timer: RequestTimer = timer
        self.include_usage, self.per_token, self.return_token_ids = include_usage, per_token, return_token_ids

    def chunk(self, text: str | None, finish: str | None, logprobs=None, token_ids=None, role=False) -> str:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
            obj = "text_completion"
        if self.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        body = {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return _sse_line(body)

    def usage_chunk(self) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return _sse_line(
            {
                "id": self.rid,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.out.usage(),
            }
        )

    def final(self, finish: str, logprobs: list) -> dict:
        text = self.out.detok.output_text
        lp = self.out.logprobs(logprobs) if logprobs is not None else None
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        if self.return_token_ids:
            choice["token_ids"] = list(self.out.token_ids)
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.out.usage(),
        }


def _sse_line(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _failure(event: TokenEvent) -> APIError:
    if event.finish_reason == "abort":
        return APIError(503, event.error or "the request was aborted by the server", "service_unavailable")
    return APIError(500, event.error or "generation failed", "internal_server_error")


def _abort_detached(stream) -> None:
    """Abort in the runtime without awaiting here (we may be inside a cancelled task)."""
    try:
        task = asyncio.ensure_future(stream.abort())
    except RuntimeError:  # no running loop any more
        return
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _sse(stream, reply: _Reply) -> AsyncIterator[str]:
    done = False
    try:
        if reply.chat:
            yield reply.chunk(None, None, role=True)
        async for event in stream:
            now = time.perf_counter()
            reply.timer.on_tokens(len(event.token_ids), now)
            reason = event.finish_reason
            if reason in ("error", "abort"):
                done = True
                reply.timer.finish(reason, now)
                err = _failure(event)
                yield _sse_line(err.body())
                break
            delta = reply.out.add(event)
            if delta or reason is not None or (reply.per_token and event.token_ids):
                yield reply.chunk(delta, reason, reply.out.logprobs(event.logprobs), list(event.token_ids))
            if reason is not None:
                done = True
                reply.timer.finish(reason, now)
        else:
            if not done:  # the stream ended without a finish event: a runtime bug, shown as one
                done = True
                reply.timer.finish("error", time.perf_counter())
                yield _sse_line(
                    error_body(
                        "the runtime ended the stream without finishing the request", "internal_server_error", code=500
                    )
                )
        if reply.include_usage:
            yield reply.usage_chunk()
        yield "data: [DONE]\n\n"
    finally:
        if not done:  # client went away (or we were cancelled): stop the work
            reply.timer.finish("abort", time.perf_counter())
            _abort_detached(stream)


async def _whole(stream, reply: _Reply, raw: Request) -> JSONResponse:
    async def consume():
        lps: list | None = None
        async for event in stream:
            now = time.perf_counter()
            reply.timer.on_tokens(len(event.token_ids), now)
            if event.finish_reason in ("error", "abort"):
                reply.timer.finish(event.finish_reason, now)
                raise _failure(event)
            reply.out.add(event)
            if event.logprobs is not None:
                lps = (lps or []) + list(event.logprobs)
            if event.finish_reason is not None:
                reply.timer.finish(event.finish_reason, now)
                return reply.final(event.finish_reason, lps)
        reply.timer.finish("error", time.perf_counter())
        raise APIError(500, "the runtime ended the stream without finishing the request", "internal_server_error")

    async def disconnected():
        while True:
            message = await raw.receive()
            if message.get("type") == "http.disconnect":
                return

    work = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():  # client disconnected, or this handler was cancelled
            work.cancel()
            reply.timer.finish("abort", time.perf_counter())
            _abort_detached(stream)
        watch.cancel()
    if not work.done() or work.cancelled():
        return JSONResponse(error_body("client disconnected", code=499), status_code=499)
    return JSONResponse(work.result())
