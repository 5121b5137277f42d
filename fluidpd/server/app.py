"""The OpenAI-compatible HTTP front end over any ServingRuntime (FastAPI).

routes/openai.py   /v1/completions, /v1/chat/completions (SSE or JSON; n=1), /v1/models
routes/tokens.py   /tokenize, /detokenize
routes/admin.py    /v1/admin/cluster, POST /v1/admin/workers/{id}/role
routes/ops.py      /health, /metrics
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from fluidpd.server.auth import add_auth
from fluidpd.server.config import ServeConfig
from fluidpd.server.errors import add_error_handlers
from fluidpd.server.openapi import add_openapi
from fluidpd.server.routes import admin, openai, ops, tokens
from fluidpd.server.state import ServerState

ROUTERS = (openai.router, tokens.router, admin.router, ops.router)


def build_app(runtime, *, manage_runtime: bool = True, config: ServeConfig | None = None) -> FastAPI:
    """An app serving `runtime` as `config` says; with `manage_runtime` its lifespan starts and stops
    the runtime."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_runtime:
            await runtime.start()
        try:
            yield
        finally:
            if manage_runtime:
                await runtime.stop()

    app = FastAPI(
        title="FluidPD", description="OpenAI-compatible serving with prefill/decode elasticity", lifespan=lifespan
    )
    config = config or ServeConfig()
    app.state.server = ServerState(runtime, config)
    add_error_handlers(app)
    add_auth(app, config)
    for router in ROUTERS:
        app.include_router(router)
    add_openapi(app, [route for router in ROUTERS for route in router.routes])
    return app
