"""Operations: /health (200 ok or degraded, 503 down or draining, with a JSON status) and Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from fluidpd.server.errors import APIError
from fluidpd.server.state import ServerState, server_state

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(server_state)):
    runtime = state.runtime
    if getattr(runtime, "healthy", True) is False:  # why is in the server log, not in this open route
        return APIError(503, "no worker can serve now", "service_unavailable").response()
    status = runtime.status() if hasattr(runtime, "status") else {"status": "ok"}
    return JSONResponse(status, status_code=503 if status.get("status") == "draining" else 200)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: ServerState = Depends(server_state)):
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
