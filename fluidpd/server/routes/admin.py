"""The admin API: /v1/admin/cluster (runtime.cluster_state()), /v1/admin/traces (the last requests'
timelines) and POST /v1/admin/workers/{id}/role."""

from __future__ import annotations

import dataclasses
import json
import math
from enum import Enum
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from fluidpd.runtime.api import Conflict
from fluidpd.server.body import json_body
from fluidpd.server.errors import APIError, bad_request
from fluidpd.server.protocol import RoleRequest
from fluidpd.server.state import ServerState, server_state

SWITCHABLE_ROLES = ("prefill", "decode")

router = APIRouter()


@router.get("/v1/admin/cluster")
async def cluster(state: ServerState = Depends(server_state)):
    return JSONResponse(_json(state.runtime.cluster_state()))


@router.get("/v1/admin/traces")
async def traces(limit: int = 20, state: ServerState = Depends(server_state)):
    """The last `limit` finished requests' timelines, newest first (`--request-traces` are kept)."""
    if not 1 <= limit <= 10_000:
        raise bad_request(f"limit must be in [1, 10000], got {limit}", "limit")
    data = state.runtime.request_traces(limit) if hasattr(state.runtime, "request_traces") else []
    return JSONResponse(_json({"object": "list", "data": data}))


@router.get("/v1/admin/traces/{request_id}")
async def trace(request_id: str, state: ServerState = Depends(server_state)):
    """One finished request's timeline, by the id its response carried (404 when no longer kept)."""
    found = state.runtime.request_trace(request_id) if hasattr(state.runtime, "request_trace") else None
    if found is None:
        raise APIError(404, f"no trace of request {request_id!r} is kept", "not_found_error", "request_id")
    return JSONResponse(_json(found))


@router.post("/v1/admin/workers/{worker_id}/role")
async def force_role(
    worker_id: int, body: RoleRequest = json_body(RoleRequest), state: ServerState = Depends(server_state)
):
    """{"role": "prefill" | "decode"}: 404 for no such worker, 409 for a switch the cluster's state
    forbids now (already switching, the last of its role, not serving), 400 for one it never can."""
    if body.role not in SWITCHABLE_ROLES:
        raise bad_request(f"role must be one of {', '.join(SWITCHABLE_ROLES)}, got {body.role!r}", "role")
    runtime = state.runtime
    workers = [w.get("id") for w in runtime.cluster_state().get("workers", ())]
    if worker_id not in workers:
        raise _no_worker(f"no worker {worker_id}: the workers are {', '.join(map(str, workers)) or 'none'}")
    try:
        action = runtime.force_role(worker_id, body.role)
    except KeyError as exc:
        raise _no_worker(str(exc.args[0]) if exc.args else f"no worker {worker_id}") from None
    except Conflict as exc:
        raise APIError(409, str(exc), "conflict_error", "worker_id") from None
    except ValueError as exc:
        raise bad_request(str(exc), "role") from None
    return JSONResponse(_json(action))


def _no_worker(message: str) -> APIError:
    return APIError(404, message, "not_found_error", "worker_id")


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
