"""What the control plane asks a world to do; each world carries these out its own way."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.request import Request
from fluidpd.policy.view import Role


@dataclass(frozen=True, slots=True)
class Borrow:
    """FluidToken: move an unstarted request from a prefill queue to a decode worker's queue."""

    request: Request
    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class BorrowSplit:
    """FluidToken's parallel spread: prefill a long prompt as pieces on several decode workers,
    then gather the KV to `dsts[0]`, which decodes the request."""

    request: Request
    src: int
    dsts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StopRouting:
    """FluidRole drain, first step: no new work for `worker`; its unstarted work goes elsewhere."""

    worker: int


@dataclass(frozen=True, slots=True)
class ResumeRouting:
    """FluidRole rollback: `worker` takes new work again in the role it kept."""

    worker: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """FluidRole drain: move a decoding request's live KV to `dst`, where it keeps decoding."""

    request: Request
    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class RunPhase:
    """FluidRole phases 2-4 (`remap`, `dispatch`, `route`) on `worker`, which is becoming `role`,
    or a restart's `restart` phase (the process down for `duration_s`, then up in the new role).

    The world reports completion through `Policy.on_phase_done`.
    """

    worker: int
    phase: str
    role: Role
    duration_s: float | None = None  # None: the world's own time for the phase
    epoch: int = 0  # the transition's: a report for an older one is stale
