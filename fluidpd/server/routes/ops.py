"""Operations: /health (200 ok or degraded, 503 down, with a JSON status) and Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from fluidpd.server.errors import APIError
from fluidpd.server.state import ServerState, server_state

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(server_state)):
    runtime = state.runtime
    if getattr(runtime, "healthy", True) is False:
        return APIError(
            503, getattr(runtime, "last_error", None) or "runtime unhealthy", "internal_server_error"
        ).response()
    status = runtime.status() if hasattr(runtime, "status") else {"status": "ok"}
    return JSONResponse(status)


@router.get("/metrics")
async def metrics(state: ServerState = Depends(server_state)):
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
