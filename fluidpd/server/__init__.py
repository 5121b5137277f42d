"""The OpenAI-compatible HTTP server (`fluidpd serve`): FastAPI over a ServingRuntime.

    from fluidpd.runtime.local import LocalRuntime
    from fluidpd.server import build_app
    app = build_app(LocalRuntime())           # uvicorn.run(app, host="127.0.0.1", port=8000)
"""
from fluidpd.server.app import BackgroundServer, build_app

__all__ = ["BackgroundServer", "build_app"]
