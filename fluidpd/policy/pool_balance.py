"""FluidRole across pools, at its seconds scale: a pool short of prefill takes a worker from another.

Each pool's own FluidPD switches its own workers between prefill and decode (FluidRole inside the
pool, unchanged). What it cannot do is grow: a pool whose prompts keep coming (a hot prefix, a
session-heavy tenant) while its decode side has no worker to spare stays short. Every
`pool_rebalance_s` the balance looks at the pools' last PPI and DPI (their own ticks' readings):

  recipient  PPI > theta_P_high, held for tau_persist (read every tick), below twice the pool size
  donor      another pool with PPI < theta_P_idle and DPI < theta_D_idle, no switch of its own
             queued or under way

and moves one worker, one move at a time across the cluster:

  * a worker whose role already fits changes pool and nothing else: an idle prefill worker of a
    donor that keeps another (no queue, no prompt in flight, no KV held for a pull, no transfer),
    from the donor with the least PPI. Nothing it holds belongs to its old pool, so every hand-off
    stays inside one pool.
  * otherwise a decode worker changes role first, in its old pool, through the FluidRole machinery
    that pool already runs (`RoleSwitches._start`: stop routing, its decodes migrated to that pool's
    peers or finished in place, remap, dispatch, route), chosen as that pool chooses j* among the
    workers its own rules let go (residence, the decode floor); when the transition is done
    (`on_phase_done` of its `route` phase) it is an empty, routable prefill worker and joins the
    short pool. The donor is the pool with the most decode to spare (least DPI), and only a pool
    with more to spare than the short pool itself: where the short pool's own decode side is the
    idlest, its own FluidRole switches one of its workers (its prefill deficit rule), and the
    balance leaves it to.
    A drain that rolls back or is abandoned (the worker lost) cancels the move.

The recipient's persistence restarts after a move, so a pool grows by at most one worker per
tau_persist. The reverse (a pool short of decode taking a worker) is not built: a pool's decode
deficit is met by its own prefill workers, and decode KV does not move between pools.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fluidpd.policy import fluidrole
from fluidpd.policy.fluidrole import RoleTransition
from fluidpd.policy.view import ClusterView, Role, WorkerView

if TYPE_CHECKING:
    from fluidpd.policy.fluidconfig import FluidConfig
    from fluidpd.policy.pool import Pool


@dataclass(slots=True)
class PoolMove:
    """Worker `worker` leaving pool `src` for pool `dst`: directly, or through `transition`."""

    worker: int
    src: int
    dst: int
    began_s: float
    transition: RoleTransition | None = None  # None: its role fitted, it moved at once
    ended_s: float = math.nan
    outcome: str = ""  # "moved", or why it was cancelled


def idle_prefill(w: WorkerView) -> bool:
    """A routable prefill worker holding nothing that belongs to its pool."""
    return (
        w.role is Role.PREFILL
        and w.routable
        and not w.queue
        and not w.num_prefilling
        and not w.num_held
        and not w.transfers_out
        and not w.transfers_in
    )


class PoolBalance:
    """Persistence of each pool's prefill shortage, and the one cross-pool move under way."""

    def __init__(self, fluid: FluidConfig, max_size: int, reassign: Callable[[int, int, int], None]):
        self.fluid = fluid
        self.max_size = max_size
        self.reassign = reassign  # (worker, src pool, dst pool): membership changes
        self.since: dict[int, float] = {}  # pool -> since when its PPI has been above theta_P_high
        self.last_s = -math.inf
        self.move: PoolMove | None = None
        self.moves: list[PoolMove] = []

    def step(self, pools: list[Pool], view: ClusterView) -> list:
        """Every tick: persistence; every `pool_rebalance_s`: at most one move."""
        now, f = view.now, self.fluid
        for p in pools:
            if p.policy.pressure.ppi > f.theta_p_high:
                self.since.setdefault(p.index, now)
            else:
                self.since.pop(p.index, None)
        self._follow(pools, now)
        if self.move is not None or now - self.last_s < f.pool_rebalance_s or len(pools) < 2:
            return []
        self.last_s = now
        short = [
            p for p in pools if now - self.since.get(p.index, now) >= f.tau_persist_s and len(p.ids) < self.max_size
        ]
        if not short:
            return []
        dst = max(short, key=lambda p: (p.policy.pressure.ppi, -p.index))
        return self._take(pools, dst, view)

    def _follow(self, pools: list[Pool], now: float) -> None:
        """The move under way: done, cancelled, or still draining."""
        m = self.move
        if m is None or m.transition is None:
            return
        t = m.transition
        if t.done:
            self._finish(m, now)
        elif t.rolled_back or pools[m.src].policy.transition is not t:
            self._end(m, now, "cancelled: " + ("rolled back" if t.rolled_back else "abandoned"))

    def on_phase_done(self, wid: int, now: float) -> None:
        """A phase of `wid`'s transition ended: the move completes with its `route` phase."""
        m = self.move
        if m is not None and m.worker == wid and m.transition is not None and m.transition.done:
            self._finish(m, now)

    def _finish(self, m: PoolMove, now: float) -> None:
        self.reassign(m.worker, m.src, m.dst)
        self._end(m, now, "moved")
        self.since.pop(m.dst, None)

    def _end(self, m: PoolMove, now: float, outcome: str) -> None:
        m.ended_s, m.outcome = now, outcome
        self.move = None

    def _take(self, pools: list[Pool], dst: Pool, view: ClusterView) -> list:
        f, now = self.fluid, view.now
        donors = [
            p
            for p in pools
            if p is not dst
            and p.policy.transition is None
            and not p.policy.forced
            and p.policy.pressure.ppi < f.theta_p_idle
            and p.policy.pressure.dpi < f.theta_d_idle
        ]
        for src in sorted(donors, key=lambda p: (p.policy.pressure.ppi, p.index)):
            sub = src.view(view)
            prefill = [w for w in sub.workers if w.role is Role.PREFILL and w.routable]
            idle = [w for w in prefill if idle_prefill(w)]
            if len(prefill) >= 2 and idle:
                m = PoolMove(min(idle, key=lambda w: (w.num_cached_blocks, w.id)).id, src.index, dst.index, now)
                self.moves.append(m)
                self._finish(m, now)
                return []
        for src in sorted(donors, key=lambda p: (p.policy.pressure.dpi, p.index)):
            if src.policy.pressure.dpi >= dst.policy.pressure.dpi:
                break  # the short pool has the most decode to spare: its own FluidRole's switch
            sub = src.view(view)
            wid = fluidrole.choose_decode_to_prefill(sub, src.policy._can_move(sub))
            if wid is None:
                continue
            actions = src.policy._start(sub, wid, Role.PREFILL, reason=f"pool {src.index} -> {dst.index}")
            self.move = PoolMove(wid, src.index, dst.index, now, src.policy.transition)
            self.moves.append(self.move)
            return actions
        return []
