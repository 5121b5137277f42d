"""Request bodies: at most ServeConfig.max_body_bytes (413 beyond, read no further), JSON whatever
the Content-Type (as curl -d sends), valid Unicode, then the pydantic model; parsed off the event
loop, so a large body never stalls other requests (or /health).

@router.post("/v1/completions")
async def completions(body: CompletionRequest = json_body(CompletionRequest)): ...
"""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from fluidpd.server.errors import APIError, bad_request, dotted, validation_error

M = TypeVar("M", bound=BaseModel)


def json_body(model: type[M]):
    """A FastAPI dependency: the request body parsed as JSON and validated as `model` (else a 400)."""

    async def parse(request: Request) -> M:
        raw = await read_body(request, request.app.state.server.config.max_body_bytes)
        return await run_in_threadpool(_validate, model, raw)

    parse.body_model = model  # for the OpenAPI schema (openapi.py)
    return Depends(parse)


def _validate(model: type[M], raw: bytes) -> M:
    data = parse_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to be over `limit` bytes (declared or sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is over {limit} bytes (the server's --max-body-bytes)", code=413)


def parse_json(raw: bytes) -> dict:
    """`raw` as a JSON object whose strings are all valid Unicode, or a 400 saying what is wrong."""
    if not raw.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text: send a JSON object") from None
    except ValueError as exc:  # json.JSONDecodeError, or NaN / Infinity (not JSON)
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got a JSON {type(data).__name__}")
    bad = lone_surrogate(data)  # never the root: that is an object
    if bad is not None:
        raise bad_request(
            f"{dotted(bad)} is not valid Unicode: it holds a lone surrogate (an unpaired \\uD800-\\uDFFF escape)",
            str(bad[0]),
        )
    return data


def lone_surrogate(data) -> tuple | None:
    """The location of the first string (or key) in `data` that is not valid Unicode, or None."""
    todo: list[tuple[tuple, object]] = [((), data)]
    while todo:
        loc, value = todo.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return loc
        elif isinstance(value, dict):
            for k in value:
                if not _encodable(k):
                    return (*loc, k.encode("utf-8", "backslashreplace").decode("utf-8"))
            todo.extend(((*loc, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            todo.extend(((*loc, i), v) for i, v in reversed(list(enumerate(value))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # json.loads keeps an unpaired "\ud800" as a surrogate code point
        return False
    return True


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")
