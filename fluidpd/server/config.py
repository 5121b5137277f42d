"""How the HTTP front end listens and what model name it serves."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fluidpd.core.knobs import knob
from fluidpd.server.tool_parsers import TOOL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
TOOL_CALL_PARSERS = TOOL_PARSERS.names()


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
    chat_template: str | None = knob(
        None, "chat template used instead of the model's: a file path, or the template itself (as vLLM's flag)"
    )
    tool_call_parser: str = knob(
        "hermes", "how tool calls are read from the output when tool_choice is auto", choices=TOOL_CALL_PARSERS
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
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}"
            )
        load_chat_template(self.chat_template)  # fails here on a path that cannot be read


def load_chat_template(template: str | None) -> str | None:
    """The text of a chat template given as a file path or inline, as vLLM's load_chat_template: a value that
    cannot be opened is the template itself (its escapes decoded) if it holds a jinja character, else an error."""
    if template is None:
        return None
    try:
        with open(template) as f:
            return f.read()
    except OSError as exc:
        if not any(c in template for c in "{}\n"):
            raise ValueError(
                f"the chat template {template!r} looks like a file path, but cannot be opened: {exc}"
            ) from None
        # escapes (\n, \t...) decoded; characters beyond latin-1 pass through as escapes, so they survive
        return template.encode("latin-1", "backslashreplace").decode("unicode_escape")
