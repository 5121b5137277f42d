"""FluidRole: switch a live worker between prefill and decode in place.

Four phases, each a visible state with timestamps:
  1. drain: no new work is routed to the worker; decoding requests with few remaining tokens
     finish, the rest have their KV migrated to peers with room (over links capped at the
     migration share); a prefill worker finishes its in-flight prefills and its queue moves on.
  2. remap: the memory arena is re-sliced between KV pages and activation scratch.
  3. dispatch: the engine swaps its step planner / kernels to the new role.
  4. route: the coordinator registers the worker in its new pool and updates capacity.
The world reports how long phases 2-4 took. A drain that runs over its timeout rolls back: the
worker serves again in its old role (what the drain moved stays moved). Every transition has an
epoch, carried by its phases: a phase reported for an abandoned or rolled-back transition (a lost
worker's late callback) is stale and ignored.

A restart (what a static deployment does instead: DistServe's replanning) is a transition too:
drain without migration, until the worker holds nothing, then `restart` (down for the restart's
downtime, back in the new role), then `route`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from fluidpd.policy.actions import Migrate, ResumeRouting, RunPhase, StopRouting
from fluidpd.policy.view import ClusterView, Role, WorkerView, blocks_for

PHASES = ("drain", "remap", "dispatch", "route")
RESTART_PHASES = ("drain", "restart", "route")
ROLLED_BACK = "rolled back"
_EPOCHS = itertools.count(1)


class SwitchConflict(ValueError):
    """A role switch the cluster's current state forbids (already switching, the last of its role,
    not serving): the HTTP API answers 409."""


@dataclass(slots=True)
class RoleTransition:
    """One worker's move to `dst_role`, with the start and end time of every phase."""

    worker: int
    src_role: Role
    dst_role: Role
    began_s: float
    reason: str = "auto"
    phase: str = "drain"
    started: dict = field(default_factory=dict)
    ended: dict = field(default_factory=dict)
    migrated: set = field(default_factory=set)
    phases: tuple[str, ...] = PHASES
    restart_s: float = 0.0  # restarts: the downtime
    epoch: int = field(default_factory=lambda: next(_EPOCHS))

    @property
    def is_restart(self) -> bool:
        return self.phases == RESTART_PHASES

    def __post_init__(self) -> None:
        self.started["drain"] = self.began_s

    @property
    def done(self) -> bool:
        return "route" in self.ended

    @property
    def rolled_back(self) -> bool:
        return self.phase == ROLLED_BACK

    def expects(self, a: RunPhase) -> bool:
        """`a` is this transition's phase in progress (not a stale report of an earlier one)."""
        return a.worker == self.worker and a.epoch == self.epoch and a.phase == self.phase

    def durations(self) -> dict[str, float]:
        return {p: self.ended[p] - self.started[p] for p in self.phases if p in self.ended}

    @property
    def total_s(self) -> float:
        return self.ended["route"] - self.began_s if self.done else float("nan")


@dataclass(slots=True)
class FluidRoleConfig:
    """Knobs of the macro engine."""

    drain_finish_s: float = 0.25  # a decoding request this close to done finishes in place

    def __post_init__(self) -> None:
        if self.drain_finish_s < 0:
            raise ValueError("drain_finish_s must be >= 0")


def drain_cost(w: WorkerView) -> tuple[int, int]:
    """What switching a decode worker costs: tokens left to generate, then KV tokens to move or lose
    (its live KV, and the cached blocks no request holds, which a prefill arena may not keep)."""
    w.sync_decoding()
    return sum(r.remaining_tokens for r in w.decoding.values()), (w.kv_blocks_used + w.evictable_blocks) * w.block_size


def choose_decode_to_prefill(view: ClusterView, eligible) -> int | None:
    """j*: the decode worker whose drain costs least."""
    pool = [w for w in view.workers if w.role is Role.DECODE and w.routable and eligible(w)]
    return min(pool, key=lambda w: (*drain_cost(w), w.id)).id if pool else None


def choose_prefill_to_decode(view: ClusterView, eligible) -> int | None:
    """k*: the prefill worker with the least queued and in-flight prefill work; among equals, the
    one holding most KV for pulls (as a decode worker it decodes that KV in place), then the one
    whose cache the prefill pool loses least of."""
    pool = [w for w in view.workers if w.role is Role.PREFILL and w.routable and eligible(w)]
    return min(pool, key=lambda w: (w.queued_uncached, -w.num_held, w.num_cached_blocks, w.id)).id if pool else None


def check_switch(view: ClusterView, wid: int, role: Role, leaving: set[int]) -> None:
    """ValueError unless `wid` may switch to `role` while the workers in `leaving` leave their roles
    (SwitchConflict where the cluster's state, not the ask, forbids it)."""
    if not 0 <= wid < len(view.workers):
        raise ValueError(f"no worker {wid}")
    w = view.workers[wid]
    if w.role is role or w.role is Role.COLOCATED:
        raise ValueError(f"worker {wid} is {w.role.value}; cannot switch it to {role.value}")
    if wid in leaving:
        raise SwitchConflict(f"worker {wid} is already switching roles")
    if not w.routable:
        raise SwitchConflict(f"worker {wid} is not serving (lost, or not yet replaced)")
    staying = [x for x in view.workers if x.role is w.role and x.routable and x.id not in leaving]
    if len(staying) < 2:
        raise SwitchConflict(f"worker {wid} is the last serving {w.role.value} worker")


def begin(
    view: ClusterView, wid: int, dst_role: Role, reason: str = "auto", restart_s: float | None = None
) -> tuple[RoleTransition, list]:
    """Start a FluidRole transition, or with `restart_s` a restart into `dst_role`."""
    w = view.workers[wid]
    if w.role is dst_role or w.role is Role.COLOCATED:
        raise ValueError(f"worker {wid} is {w.role.value}; cannot switch it to {dst_role.value}")
    if restart_s is None:
        return RoleTransition(wid, w.role, dst_role, view.now, reason), [StopRouting(wid)]
    t = RoleTransition(wid, w.role, dst_role, view.now, reason, phases=RESTART_PHASES, restart_s=restart_s)
    return t, [StopRouting(wid)]


def drained(w: WorkerView, restart: bool = False) -> bool:
    """Nothing left on the worker that its old role must finish (a restart also waits for the KV
    it holds for decode workers to be pulled)."""
    if w.transfers_out or w.transfers_in or (restart and w.num_held):
        return False
    if w.role is Role.DECODE:
        return w.num_decoding == 0 and not w.queue and w.num_prefilling == 0
    return not w.queue and w.num_prefilling == 0


def drain_step(t: RoleTransition, view: ClusterView, config: FluidRoleConfig) -> list:
    """One control cycle of a drain: migrations to issue, or the start of the remap."""
    w = view.workers[t.worker]
    if drained(w, t.is_restart):
        nxt = t.phases[1]
        t.ended["drain"] = t.started[nxt] = view.now
        t.phase = nxt
        return [RunPhase(t.worker, nxt, t.dst_role, t.restart_s if t.is_restart else None, t.epoch)]
    if w.role is not Role.DECODE or t.is_restart:
        return []
    return migrations(t, w, view, config)


def migrations(t: RoleTransition, w: WorkerView, view: ClusterView, config: FluidRoleConfig) -> list:
    """Long-horizon requests move to the peers with the most room; short ones finish here."""
    t_iter = w.step_time_ewma_s or 0.0
    peers = [p for p in view.workers if p.role is Role.DECODE and p.routable and p.id != w.id]
    room = {p.id: p.free_blocks - p.pull_blocks_pending for p in peers}
    actions = []
    w.sync_decoding()
    for req in sorted(w.decoding.values(), key=lambda r: -r.remaining_tokens):
        if req.id in t.migrated or req.remaining_tokens * t_iter <= config.drain_finish_s:
            continue
        need = blocks_for(req.context_len + 1, w.block_size)
        dst = max(room, key=lambda k: (room[k], -k), default=None)
        if dst is None or room[dst] < need:
            break  # no peer has room now: it decodes here until one does
        room[dst] -= need
        t.migrated.add(req.id)
        actions.append(Migrate(req, w.id, dst))
    return actions


def phase_done(t: RoleTransition, phase: str, now: float) -> list:
    """The world finished `phase`; start the next one."""
    if phase != t.phase:
        raise ValueError(f"worker {t.worker}: phase {phase} finished during {t.phase}")
    t.ended[phase] = now
    nxt = t.phases.index(phase) + 1
    if nxt == len(t.phases):
        return []
    t.phase = t.phases[nxt]
    t.started[t.phase] = now
    return [RunPhase(t.worker, t.phase, t.dst_role, epoch=t.epoch)]


def rollback(t: RoleTransition, now: float, why: str) -> list:
    """Give up `t`'s drain: its worker serves again in its old role."""
    if t.phase != "drain":
        raise ValueError(f"worker {t.worker}: only a drain rolls back, not {t.phase}")
    t.ended["drain"] = now
    t.phase = ROLLED_BACK
    t.reason += f" (rolled back: {why})"
    return [ResumeRouting(t.worker)]
