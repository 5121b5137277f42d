"""OpenAI-style error bodies and the app's exception handlers."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("fluidpd.server")


class APIError(Exception):
    """An error answered with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code if code is not None else status
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | int | None = None
) -> dict:
    # a message may quote client text: keep it encodable whatever the client sent
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def draining(retry_after_s: float) -> APIError:
    """The 503 a request gets while the server drains before it exits (a load balancer retries elsewhere)."""
    return APIError(
        503,
        "the server is shutting down and accepts no new requests; retry on another replica",
        "service_unavailable",
        code="server_draining",
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )


def dotted(loc) -> str:
    """A pydantic location ("messages", 0, "content") as the field path "messages.0.content"."""
    return ".".join(str(p) for p in loc)


def validation_error(errors: list[dict]) -> APIError:
    """A 400 for validation errors located as FastAPI does: ("body" | "path" | "query", field, ...)."""
    locs = [tuple(e.get("loc", ()))[1:] for e in errors]
    msg = "; ".join(f"{dotted(loc) or 'body'}: {e.get('msg')}" for loc, e in zip(locs[:5], errors))
    param = str(locs[0][0]) if locs and locs[0] else None
    return bad_request(msg or "invalid request", param)


def add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI body: APIError, validation (400), HTTP (404, 405), anything else (500)."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        return validation_error(list(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), kind).response()

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception):
        log.exception("unhandled error")  # the details stay in the server's log
        return APIError(500, "internal error (see the server log)", "internal_server_error").response()
