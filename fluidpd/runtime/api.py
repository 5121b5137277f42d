"""What the serving front end (HTTP server, load generator) sees of the runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class TokenEvent:
    """New tokens of one request; the last event of a request carries `finish_reason`."""

    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (OpenAI's words)
    logprobs: list | None = None  # engine TokenLogprob per new token, when asked for
    error: str | None = None  # set with finish_reason "error": what went wrong
    cached_tokens: int | None = None  # on a request's first event: prompt tokens served by the prefix cache
    prompt_logprobs: list | None = None  # on its first event, when asked: TokenLogprob per prompt token (None first)
    index: int = 0  # the sequence (choice) of an n > 1 request these tokens belong to


@dataclass(slots=True)
class GenerationRequest:
    """A request as the front end submits it."""

    request_id: str
    prompt_token_ids: list[int]
    params: object  # fluidpd.engine.SamplingParams
    arrival_s: float = 0.0  # set by the runtime
    meta: dict = field(default_factory=dict)


class RequestStream(Protocol):
    """Async iterator of TokenEvents for one request; ends after the event with finish_reason."""

    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    async def abort(self) -> None: ...


class Overloaded(RuntimeError):
    """The runtime refuses a request for now (admission control): retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LimitExceeded(ValueError):
    """A request over a hard per-request limit the operator set (HTTP 400 with `code`)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class Unavailable(RuntimeError):
    """The runtime cannot serve at all now (every worker lost): HTTP 503."""


class Draining(Unavailable):
    """The runtime is shutting down and admits nothing new (HTTP 503): retry after `retry_after_s`
    (another replica, or this one restarted)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Conflict(ValueError):
    """An admin action the cluster's current state forbids (a worker already switching, the last
    of its role, one not serving): HTTP 409."""


class ServingRuntime(Protocol):
    """The runtime behind the OpenAI API: workers, the coordinator and its policy."""

    model_name: str
    tokenizer: object  # fluidpd.engine.tokenizer.Tokenizer
    max_model_len: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Accept a request (ValueError for one that can never run, e.g. too long, LimitExceeded
        for one over an operator's limit; Overloaded for one refused for now: the queue in front of
        it would make it miss the SLO; Unavailable when nothing can serve, Draining while shutting down)."""

    def status(self) -> dict:
        """/health's body: {"status": "ok" | "degraded" | "draining" | "down", ...}; while draining,
        `outstanding`: the admitted requests not yet ended."""

    def drain(self) -> None:
        """Admit nothing new (submit raises Draining); the admitted requests run on."""

    def cut(self) -> int:
        """End every admitted request now (each stream with an "abort" event); how many there were."""

    def cluster_state(self) -> dict:
        """JSON-able: workers (id, role, routable, queue, decoding, kv use), PPI, DPI, state,
        recent transitions with phase durations, policy name."""

    def force_role(self, worker_id: int, role: str) -> dict:
        """Admin: switch a worker's role (ValueError if it cannot: Conflict where the cluster's
        state forbids it now); returns the accepted action."""

    def metrics_snapshot(self) -> dict:
        """Counters, gauges and histogram samples for /metrics (see fluidpd.server.metrics)."""
