"""What the routes share: the runtime, the served model name and the server's metrics."""

from __future__ import annotations

import time

from fastapi import Request

from fluidpd.server.errors import APIError
from fluidpd.server.metrics import ServerMetrics


class ServerState:
    """The runtime behind the app and what the server keeps about it."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.tokenizer = runtime.tokenizer
        self.model_name: str = runtime.model_name
        self.metrics = ServerMetrics(runtime, self.model_name)
        self.created = int(time.time())

    def model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "fluidpd",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.runtime.max_model_len,
        }

    def check_model(self, name: str | None) -> None:
        """Accept exactly the served name (or none), else 404 model_not_found as vLLM does."""
        if name is None or name == self.model_name:
            return
        raise APIError(
            404,
            f"The model `{name}` does not exist. This server serves `{self.model_name}`.",
            "not_found_error",
            "model",
            "model_not_found",
        )


def server_state(request: Request) -> ServerState:
    """A FastAPI dependency: the app's ServerState."""
    return request.app.state.server
