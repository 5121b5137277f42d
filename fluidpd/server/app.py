"""The OpenAI-compatible HTTP front end over any ServingRuntime (FastAPI).

    /v1/completions, /v1/chat/completions   streaming (SSE) and not; n=1
    /v1/models, /health, /metrics, /tokenize, /detokenize
    /v1/admin/cluster                       runtime.cluster_state()
    POST /v1/admin/workers/{id}/role        {"role": "prefill" | "decode"} -> runtime.force_role
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
import uuid
from contextlib import asynccontextmanager
from enum import Enum
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fluidpd.runtime.api import GenerationRequest, TokenEvent
from fluidpd.server.metrics import RequestTimer, ServerMetrics
from fluidpd.server.protocol import (APIError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                     IncrementalDetokenizer, RoleRequest, TokenizeRequest, bad_request,
                                     chat_messages, check_unsupported, error_body, finite, sampling_params)

log = logging.getLogger("fluidpd.server")
SWITCHABLE_ROLES = ("prefill", "decode")
_background: set[asyncio.Task] = set()


def build_app(runtime, *, manage_runtime: bool = True) -> FastAPI:
    """An app serving `runtime`; with `manage_runtime` its lifespan starts and stops the runtime."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_runtime:
            await runtime.start()
        try:
            yield
        finally:
            if manage_runtime:
                await runtime.stop()

    app = FastAPI(title="FluidPD", description="OpenAI-compatible serving with prefill/decode elasticity",
                  lifespan=lifespan)
    server = _Server(runtime)
    app.state.runtime, app.state.metrics = runtime, server.metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        msg = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                        for e in errors[:5]) or "invalid request"
        return JSONResponse(error_body(msg, param=loc[0] if loc else None, code=400), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind, code=exc.status_code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "internal_server_error",
                                       code=500), status_code=500)

    @app.get("/health")
    async def health():
        if getattr(runtime, "healthy", True) is False:
            return JSONResponse(error_body(getattr(runtime, "last_error", None) or "runtime unhealthy",
                                           "internal_server_error", code=503), status_code=503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/admin/cluster")
    async def cluster():
        return JSONResponse(_json(runtime.cluster_state()))

    @app.post("/v1/admin/workers/{worker_id}/role")
    async def force_role(worker_id: int, body: RoleRequest):
        if body.role not in SWITCHABLE_ROLES:
            raise bad_request(f"role must be one of {', '.join(SWITCHABLE_ROLES)}, got {body.role!r}", "role")
        try:
            action = runtime.force_role(worker_id, body.role)
        except KeyError as exc:
            raise APIError(404, f"no worker {worker_id}: {exc}", "not_found_error", "worker_id") from None
        except ValueError as exc:
            raise bad_request(str(exc), "role") from None
        return JSONResponse(_json(action))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        server.check_model(body.model)
        if body.messages is not None:
            ids = server.encode_chat(body.messages)
        elif body.prompt is not None:
            ids = runtime.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            raise bad_request("give a prompt or messages", "prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": runtime.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        server.check_model(body.model)
        return {"prompt": runtime.tokenizer.decode(body.tokens)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        t0 = time.perf_counter()
        server.check_model(body.model)
        check_unsupported(body)
        ids = server.completion_prompt(body.prompt)
        params = sampling_params(body, len(ids), runtime.max_model_len, "prompt")
        return await server.generate(False, body, raw, ids, params, t0)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        t0 = time.perf_counter()
        server.check_model(body.model)
        check_unsupported(body)
        ids = server.encode_chat(body.messages)
        params = sampling_params(body, len(ids), runtime.max_model_len, "messages")
        return await server.generate(True, body, raw, ids, params, t0)

    return app


class _Server:
    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.tokenizer = runtime.tokenizer
        self.model_name = runtime.model_name
        self.names = {self.model_name, *getattr(runtime, "model_aliases", ())}
        self.metrics = ServerMetrics(runtime, self.model_name)
        self.created = int(time.time())

    def model_card(self) -> dict:
        rt = self.runtime
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "fluidpd",
                "root": getattr(rt, "model_path", self.model_name), "parent": None,
                "max_model_len": rt.max_model_len}

    def check_model(self, name: str | None) -> None:
        if name is None or name in self.names or os.path.basename(name) in self.names:
            return
        raise APIError(404, f"The model `{name}` does not exist. This server serves `{self.model_name}`.",
                       "not_found_error", "model", "model_not_found")

    def completion_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(f"only one prompt per request (got {len(prompt)}); send them separately",
                                  "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise bad_request("prompt is empty", "prompt")
        return ids

    def encode_chat(self, messages) -> list[int]:
        msgs = chat_messages(messages)
        try:
            return self.tokenizer.encode_chat(msgs)
        except Exception as exc:  # noqa: BLE001 - template errors are the client's message shape
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None

    # ------------------------------------------------------------------ generation
    async def generate(self, chat: bool, body, raw: Request, ids: list[int], params, t0: float):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            stream = self.runtime.submit(GenerationRequest(rid, ids, params, meta={"chat": chat}))
        except ValueError as exc:
            raise bad_request(str(exc), "messages" if chat else "prompt") from None
        timer = self.metrics.request(t0, len(ids))
        out = _Output(self.tokenizer, ids, params, chat)
        ctx = _Ctx(rid, int(time.time()), body.model or self.model_name, chat, out, timer,
                   include_usage=bool(body.stream_options and body.stream_options.include_usage),
                   per_token=bool(body.return_token_ids) or params.logprobs is not None,
                   return_token_ids=bool(body.return_token_ids))
        if body.stream:
            return StreamingResponse(_sse(stream, ctx), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(stream, ctx, raw)


class _Output:
    """Text, token count and logprobs of one request's choice, as events arrive."""

    def __init__(self, tokenizer, prompt_ids: list[int], params, chat: bool) -> None:
        self.tok = tokenizer
        self.prompt_len = len(prompt_ids)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop, params.include_stop_str_in_output)
        self.hidden = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.hidden |= set(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.chat = chat
        self.token_ids: list[int] = []
        self.text_offset = 0

    def add(self, event: TokenEvent) -> str:
        ids = event.token_ids
        self.token_ids += ids
        shown = ids[:-1] if event.finish_reason == "stop" and ids and ids[-1] in self.hidden else ids
        delta = self.detok.add(shown)
        if event.finish_reason is not None:
            delta += self.detok.finish(event.finish_reason)
        return delta

    def usage(self) -> dict:
        n = len(self.token_ids)
        return {"prompt_tokens": self.prompt_len, "completion_tokens": n, "total_tokens": self.prompt_len + n}

    def _piece(self, tid: int) -> str:
        return self.tok.decode([tid], skip_special_tokens=False)

    def logprobs(self, lps: list | None) -> dict | None:
        if lps is None:
            return None
        if self.chat:
            content = []
            for lp in lps:
                piece = self._piece(lp.token_id)
                top = [{"token": self._piece(t), "logprob": finite(v), "bytes": list(self._piece(t).encode())}
                       for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])]
                content.append({"token": piece, "logprob": finite(lp.logprob), "bytes": list(piece.encode()),
                                "top_logprobs": top})
            return {"content": content, "refusal": None}
        tokens, token_lps, tops, offsets = [], [], [], []
        for lp in lps:
            piece = self._piece(lp.token_id)
            tokens.append(piece)
            token_lps.append(finite(lp.logprob))
            top = {self._piece(t): finite(v) for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])}
            tops.append(top or {piece: finite(lp.logprob)})
            offsets.append(self.text_offset)
            self.text_offset += len(piece)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


class _Ctx:
    def __init__(self, rid, created, model, chat, out, timer, *, include_usage, per_token, return_token_ids):
        self.rid, self.created, self.model, self.chat = rid, created, model, chat
        self.out: _Output = out
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
        return _sse_line({"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                          "choices": [], "usage": self.out.usage()})

    def final(self, finish: str, logprobs: list) -> dict:
        text = self.out.detok.output_text
        lp = self.out.logprobs(logprobs) if logprobs is not None else None
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        if self.return_token_ids:
            choice["token_ids"] = list(self.out.token_ids)
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.out.usage()}


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
    except RuntimeError:   # no running loop any more
        return
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _sse(stream, ctx: _Ctx) -> AsyncIterator[str]:
    done = False
    try:
        if ctx.chat:
            yield ctx.chunk(None, None, role=True)
        async for event in stream:
            now = time.perf_counter()
            ctx.timer.on_tokens(len(event.token_ids), now)
            reason = event.finish_reason
            if reason in ("error", "abort"):
                done = True
                ctx.timer.finish(reason, now)
                err = _failure(event)
                yield _sse_line(err.body())
                break
            delta = ctx.out.add(event)
            if delta or reason is not None or (ctx.per_token and event.token_ids):
                yield ctx.chunk(delta, reason, ctx.out.logprobs(event.logprobs), list(event.token_ids))
            if reason is not None:
                done = True
                ctx.timer.finish(reason, now)
        else:
            if not done:     # the stream ended without a finish event: a runtime bug, shown as one
                done = True
                ctx.timer.finish("error", time.perf_counter())
                yield _sse_line(error_body("the runtime ended the stream without finishing the request",
                                           "internal_server_error", code=500))
        if ctx.include_usage:
            yield ctx.usage_chunk()
        yield "data: [DONE]\n\n"
    finally:
        if not done:          # client went away (or we were cancelled): stop the work
            ctx.timer.finish("abort", time.perf_counter())
            _abort_detached(stream)


async def _whole(stream, ctx: _Ctx, raw: Request) -> JSONResponse:
    async def consume():
        lps: list | None = None
        async for event in stream:
            now = time.perf_counter()
            ctx.timer.on_tokens(len(event.token_ids), now)
            if event.finish_reason in ("error", "abort"):
                ctx.timer.finish(event.finish_reason, now)
                raise _failure(event)
            ctx.out.add(event)
            if event.logprobs is not None:
                lps = (lps or []) + list(event.logprobs)
            if event.finish_reason is not None:
                ctx.timer.finish(event.finish_reason, now)
                return ctx.final(event.finish_reason, lps)
        ctx.timer.finish("error", time.perf_counter())
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
        if not work.done():   # client disconnected, or this handler was cancelled
            work.cancel()
            ctx.timer.finish("abort", time.perf_counter())
            _abort_detached(stream)
        watch.cancel()
    if not work.done() or work.cancelled():
        return JSONResponse(error_body("client disconnected", code=499), status_code=499)
    return JSONResponse(work.result())


def _jsonable(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, Enum):
        return x.value
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    if hasattr(x, "__dict__"):
        return vars(x)
    return str(x)


def _json(obj) -> Any:
    """`obj` as strict JSON data (dataclasses, enums, numpy; NaN and inf become null)."""
    def clean(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return clean(json.loads(json.dumps(obj, default=_jsonable)))


class BackgroundServer:
    """uvicorn serving `app` on a daemon thread (tests, notebooks):

        with BackgroundServer(build_app(runtime)) as srv:
            openai.OpenAI(base_url=srv.url + "/v1", api_key="-")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.app, self.host, self.port, self.log_level = app, host, port, log_level
        self.server = None
        self.thread = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 300.0) -> "BackgroundServer":
        import threading

        import uvicorn

        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level=self.log_level,
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="fluidpd-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the HTTP server failed to start (see its log)")
            if time.monotonic() > deadline:
                raise TimeoutError("the HTTP server did not start in time")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
        self.server = self.thread = None

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
