"""Dispatch rules for decode workers (new requests go through `fluidpd.policy.routers`)."""

from __future__ import annotations

from collections.abc import Iterable

from fluidpd.policy.view import Role, WorkerView


class NoRoutableWorker(RuntimeError):
    """No worker of the role a request needs is routable now (e.g. the only one died)."""


def candidates(workers: Iterable[WorkerView], role: Role) -> list[WorkerView]:
    found = [w for w in workers if w.role is role and w.routable]
    if not found:
        raise NoRoutableWorker(f"no routable {role.value} worker")
    return found


def least_queued_decode(workers: Iterable[WorkerView]) -> int:
    """The decode worker with the least queued prefill work, then the most free KV (where a prompt
    goes when no prefill worker is routable: FluidToken prefills it there)."""
    best = min(
        candidates(workers, Role.DECODE),
        key=lambda w: (w.queued_tokens, -(w.free_blocks - w.pull_blocks_pending), w.id),
    )
    return best.id


def least_loaded_decode(workers: Iterable[WorkerView]) -> int:
    """The decode worker with the most free KV after the pulls promised to it; lowest id on ties."""
    best = min(
        candidates(workers, Role.DECODE),
        key=lambda w: (-(w.free_blocks - w.pull_blocks_pending), w.num_decoding, w.id),
    )
    return best.id
