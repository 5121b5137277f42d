"""One OpenAI request from submit to the HTTP response: its prompts submitted to the runtime (each its
own request, n choices each), their events merged into SSE chunks or one JSON body.

Every accepted request is finished exactly once in the metrics; a client that goes away (or a
cancelled handler) aborts every request it made in the runtime.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from fluidpd.runtime.api import Draining, GenerationRequest, LimitExceeded, Overloaded, TokenEvent, Unavailable
from fluidpd.server.errors import APIError, bad_request, draining, error_body
from fluidpd.server.metrics import RequestTimer
from fluidpd.server.output import ChoiceOutput
from fluidpd.server.response import PromptIn, Reply, merge_logprobs, sse_line
from fluidpd.server.state import ServerState

log = logging.getLogger("fluidpd.server")
_background: set[asyncio.Task] = set()


class Submitted:
    """One prompt's request in the runtime: its stream, its timer, how many of its choices are still open."""

    def __init__(self, stream, timer: RequestTimer, n: int) -> None:
        self.stream, self.timer, self.open = stream, timer, n


async def generate(
    state: ServerState, chat: bool, body, raw: Request, prompts: list[PromptIn], params, t0: float, tools=None
):
    """Submit each prompt with `params` and answer as `body` asks (stream or not); `t0`: request arrival;
    `tools`: a chat request's ToolRequest (its calls read back from the text)."""
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    subs: list[Submitted] = []
    try:
        for i, p in enumerate(prompts):
            sub_id = rid if len(prompts) == 1 else f"{rid}-{i}"
            stream = _submit(state, chat, GenerationRequest(sub_id, p.ids, params, meta={"chat": chat}))
            subs.append(Submitted(stream, state.metrics.request(t0, len(p.ids), params.n), params.n))
    except BaseException:
        for s in subs:
            s.timer.finish("abort", time.perf_counter())
            _abort_detached(s.stream)
        raise
    n = params.n
    choices = [ChoiceOutput(state.tokenizer, p.ids, params, chat) for p in prompts for _ in range(n)]
    reply = Reply(
        rid,
        int(time.time()),
        state.model_name,
        chat,
        prompts,
        choices,
        n,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        per_token=bool(body.return_token_ids) or params.logprobs is not None,
        return_token_ids=bool(body.return_token_ids),
        tools=tools,
    )
    if body.stream:
        return StreamingResponse(
            _sse(subs, reply),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _whole(subs, reply, raw)


def _submit(state: ServerState, chat: bool, request: GenerationRequest):
    param = "messages" if chat else "prompt"
    try:
        return state.runtime.submit(request)
    except LimitExceeded as exc:
        raise APIError(400, str(exc), param=param, code=exc.code) from None
    except ValueError as exc:
        raise bad_request(str(exc), param) from None
    except Draining as exc:
        raise draining(exc.retry_after_s) from None
    except Unavailable as exc:
        log.error("request %s refused: %s", request.request_id, exc)
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


async def _merged(subs: list[Submitted]) -> AsyncIterator[tuple[int, TokenEvent | None]]:
    """(prompt index, event) from every stream as they come; (i, None) when stream i ended."""
    if len(subs) == 1:
        async for event in subs[0].stream:
            yield 0, event
        yield 0, None
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
        try:
            async for event in stream:
                await queue.put((i, event))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s.stream)) for i, s in enumerate(subs)]
    ended = 0
    try:
        while ended < len(tasks):
            i, event = await queue.get()
            ended += event is None
            yield i, event
    finally:
        for t in tasks:
            t.cancel()


def _apply(reply: Reply, subs: list[Submitted], i: int, event: TokenEvent) -> tuple[int, str]:
    """Account `event` of prompt i's stream; its choice index and the text it adds."""
    sub, now = subs[i], time.perf_counter()
    sub.timer.on_tokens(len(event.token_ids), now, event.index)
    if event.cached_tokens is not None:
        reply.cached[i] = event.cached_tokens
    if event.prompt_logprobs is not None:
        reply.prompt_logprobs[i] = event.prompt_logprobs
    index = i * reply.n + event.index
    delta = reply.choices[index].add(event)
    if event.finish_reason is not None:
        sub.open -= 1
        if sub.open == 0:
            sub.timer.finish(event.finish_reason, now)
    return index, delta


def _chunks(reply: Reply, subs: list[Submitted], i: int, event: TokenEvent) -> list[str]:
    """The SSE chunks `event` makes (none: nothing to show yet); a choice's first leads with its echo."""
    index, delta = _apply(reply, subs, i, event)
    head, head_lp = reply.head(index) if index not in reply.started else ("", None)
    lps = reply.choices[index].logprobs(event.logprobs)
    if head_lp is not None:
        lps = merge_logprobs(head_lp, lps)
    text = head + delta
    if reply.tools is not None:
        return reply.tool_chunks(index, text, event.finish_reason, lps, list(event.token_ids))
    if text or event.finish_reason is not None or (reply.per_token and event.token_ids) or head_lp:
        return [reply.chunk(index, text, event.finish_reason, lps, list(event.token_ids))]
    return []


def _end(subs: list[Submitted], reason: str) -> None:
    now = time.perf_counter()
    for s in subs:
        if not s.timer.done:
            s.timer.finish(reason, now)
            _abort_detached(s.stream)


async def _sse(subs: list[Submitted], reply: Reply) -> AsyncIterator[str]:
    try:
        if reply.chat:
            for c in reply.role_chunks():
                yield c
        async for i, event in _merged(subs):
            if event is None:
                if subs[i].open > 0:  # the stream ended without finishing: a runtime bug, shown as one
                    _end(subs, "error")
                    body = error_body(
                        "the runtime ended the stream without finishing the request", "internal_server_error", code=500
                    )
                    yield sse_line(body)
                    break
                continue
            if event.finish_reason in ("error", "abort"):
                subs[i].timer.finish(event.finish_reason, time.perf_counter())
                _end(subs, "abort")
                yield sse_line(_failure(event).body())
                break
            for chunk in _chunks(reply, subs, i, event):
                yield chunk
        if reply.include_usage:
            yield reply.usage_chunk()
        yield "data: [DONE]\n\n"
    finally:
        if not all(s.timer.done for s in subs):  # client went away (or we were cancelled): stop the work
            _end(subs, "abort")


async def _whole(subs: list[Submitted], reply: Reply, raw: Request) -> JSONResponse:
    async def consume():
        async for i, event in _merged(subs):
            if event is None:
                if subs[i].open > 0:
                    _end(subs, "error")
                    raise APIError(
                        500, "the runtime ended the stream without finishing the request", "internal_server_error"
                    )
                continue
            if event.finish_reason in ("error", "abort"):
                subs[i].timer.finish(event.finish_reason, time.perf_counter())
                _end(subs, "abort")
                raise _failure(event)
            _apply(reply, subs, i, event)
        return reply.final()

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
            _end(subs, "abort")
        watch.cancel()
    if not work.done() or work.cancelled():
        return JSONResponse(error_body("client disconnected", code=499), status_code=499)
    return JSONResponse(work.result())
