"""Dispatch rules for decode workers (new requests go through `fluidpd.policy.routers`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
    return most_room(candidates(workers, Role.DECODE)).id


def most_room(pool: Sequence[WorkerView]) -> WorkerView:
    """The worker of `pool` with the most free KV after the pulls promised to it, then the fewest
    sequences decoding, then the lowest id (a scan of the room, then a key only over the ties)."""
    room = [w.pull_blocks_pending - w.free_blocks for w in pool]
    ties = least_of(pool, room)
    if len(ties) == 1:
        return ties[0]
    return lowest_id(least_of(ties, [w.num_decoding for w in ties]))


def least_of(pool: Sequence[WorkerView], keys: list) -> list[WorkerView]:
    """The workers of `pool` whose key (in `keys`, in pool order) is the least, in pool order."""
    least = min(keys)
    return [w for w, k in zip(pool, keys) if k == least]


def lowest_id(pool: Sequence[WorkerView]) -> WorkerView:
    ids = [w.id for w in pool]
    return pool[ids.index(min(ids))]
