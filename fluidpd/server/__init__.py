"""The OpenAI-compatible HTTP server (`fluidpd serve`): FastAPI over a ServingRuntime.

    from fluidpd.server import build_app
    app = build_app(runtime)                  # uvicorn.run(app, host="127.0.0.1", port=8000)

Names are imported on use, so `fluidpd.server.config` (the CLI's flags) needs no FastAPI.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"build_app": "fluidpd.server.app", "BackgroundServer": "fluidpd.server.background"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fluidpd.server' has no attribute {name!r}")
