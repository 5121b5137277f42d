"""How the HTTP front end listens and what model name it serves."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fluidpd.core.knobs import knob

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(slots=True)
class ServeConfig:
    """Address, port, served model name and log level of `fluidpd serve`."""

    host: str = knob("127.0.0.1", "bind address")
    port: int = knob(8000, "port (0: any free port)")
    served_model_name: str | None = knob(
        None, "the model name clients send and /v1/models lists (default: what --model was given)"
    )
    log_level: str = knob("info", "uvicorn log level", choices=LOG_LEVELS)
    max_body_bytes: int = knob(4 * 1024 * 1024, "largest request body accepted (413 beyond)")
    api_key: str | None = knob(
        None, "require 'Authorization: Bearer KEY' on every route but /health (env FLUIDPD_API_KEY)"
    )
    admin_key: str | None = knob(None, "the key /v1/admin/* requires (default: --api-key; env FLUIDPD_ADMIN_KEY)")
    allowed_hosts: str | None = knob(
        None,
        "comma-separated Host header names served, '*' any (default: loopback names on a loopback --host, else any)",
    )
    shutdown_timeout_s: float = knob(
        30.0,
        "on SIGTERM/Ctrl-C, how long the admitted requests may take to finish (new ones get 503) before "
        "they are cut; a second signal cuts them at once",
    )

    def __post_init__(self) -> None:
        self.api_key = self.api_key or os.environ.get("FLUIDPD_API_KEY") or None
        self.admin_key = self.admin_key or os.environ.get("FLUIDPD_ADMIN_KEY") or None
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not self.shutdown_timeout_s >= 0:
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be empty")
