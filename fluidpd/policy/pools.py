"""`fluidpd-pools`: the FluidPD control plane sharded into pools of workers, each with its own loop.

One coordinator's decisions cost O(workers) per request and per cycle (docs/control-plane.md, "At
scale"), so at a thousand workers one loop cannot hold 10 ms. Here the workers are split into pools
of about `pool_size` (64: a rack of 8 nodes of 8 GPUs), contiguous ids (whole nodes), each pool run
by its own, unchanged FluidPD over a sub-view of its workers only (`PoolView`: ids kept, iteration
over the pool). Above the pools:

  route    two levels: the router tier picks a pool in O(pools) from the pools' aggregates and a
           prefix-to-pool index (`PoolRouter`), then the pool's FluidPD routes among its workers
           (KV affinity, FluidToken's decode-worker prefill, as it does over a whole cluster)
  tick     each pool's FluidPD ticks on its sub-view (`tick_pool`: what one pool's core pays each
           10 ms; in the simulator the pools tick in turn in the same control event), then the pool
           publishes its aggregates (`Pool.refresh`, one pass over its workers); the tier's own
           part (`tick_tier`) is O(pools): FluidRole across pools (`PoolBalance`, every
           `pool_rebalance_s`)
  the rest plan_step, handoff, observe_step, worker_lost, rejoin_role, the phases of a role
           transition and admin switches go to the worker's pool, whose FluidPD answers over its
           sub-view. A hand-off therefore picks a decode worker of the prefill worker's pool, a
           borrow or a drain's migration a peer in the pool: KV never crosses pools.

Workers change pool only through `PoolBalance` (a worker whose role fits, idle, moves at once; a
decode worker is first switched to prefill by its own pool's FluidRole, then moves). With one pool
holding every worker, every decision is plain FluidPD's.
"""

from __future__ import annotations

import bisect

from fluidpd.policy import fluidrole
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.costs import CostModel
from fluidpd.policy.fluidbase import FluidBase
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.fluidrole import RoleTransition, SwitchConflict
from fluidpd.policy.pool import Pool
from fluidpd.policy.pool_balance import PoolBalance
from fluidpd.policy.pool_router import PoolRouter
from fluidpd.policy.pool_view import PoolView
from fluidpd.policy.routing import NoRoutableWorker
from fluidpd.policy.static_pd import StaticPD, split
from fluidpd.policy.telemetry import Pressure
from fluidpd.policy.view import ClusterView, Role


def pool_sizes(n_workers: int, pool_size: int) -> list[int]:
    """`n_workers` split into ceil(n / pool_size) pools as equal as can be (larger ones first)."""
    pools = max(1, -(-n_workers // pool_size))
    base, extra = divmod(n_workers, pools)
    return [base + 1] * extra + [base] * (pools - extra)


class FluidPDPools(FluidBase):
    """FluidPD per pool of `pool_size` workers, a router tier over the pools, FluidRole across them."""

    name = "fluidpd-pools"

    def __init__(
        self, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
    ):
        super().__init__(config, fluid, costs)
        self.pools: list[Pool] = []
        self.pool_of: list[int] = []  # worker id -> pool index
        self.router_tier = PoolRouter(self.pools, self._prefill_work, self.fluid.theta_d_high)
        self.balance = PoolBalance(self.fluid, 2 * self.fluid.pool_size, self.reassign)
        self.block_size = 0

    def roles(self, n_workers: int) -> list[Role]:
        """Pools of contiguous workers, each split as FluidPD splits a cluster (`prefill_workers`,
        if set, shared out in proportion to the pools' sizes)."""
        k, roles, start = self.config.prefill_workers, [], 0
        self.pools.clear()
        for i, size in enumerate(pool_sizes(n_workers, self.fluid.pool_size)):
            mine = round(k * (start + size) / n_workers) - round(k * start / n_workers) if k else 0
            roles += split(size, min(max(mine, 1), size - 1) if k else 0)
            self.pools.append(Pool(i, list(range(start, start + size)), FluidPD(self.config, self.fluid, self.costs)))
            start += size
        self.pool_of = [p.index for p in self.pools for _ in p.ids]
        return roles

    def _prefill_work(self, tokens: float) -> float:
        return self.pools[0].policy.prefill_work(tokens)

    def _pool(self, wid: int) -> Pool:
        return self.pools[self.pool_of[wid]]

    def pool_view(self, wid: int, view: ClusterView) -> PoolView:
        """The sub-view of worker `wid`'s pool."""
        return self._pool(wid).view(view)

    def reassign(self, wid: int, src: int, dst: int) -> None:
        """Worker `wid` leaves pool `src` for pool `dst`."""
        self.pools[src].ids.remove(wid)
        bisect.insort(self.pools[dst].ids, wid)
        self.pool_of[wid] = dst

    # --- data plane ---------------------------------------------------------------------
    def choose_pool(self, req, view: ClusterView) -> int:
        """The router tier's pick for `req` (read-only)."""
        if not self.block_size:
            self.block_size = view.workers[0].block_size
        return self.router_tier.pick(req, self.block_size)

    def serving_view(self, req, view: ClusterView) -> PoolView:
        """The pool the router tier would pick: admission estimates over its workers only."""
        return self.pools[self.choose_pool(req, view)].view(view)

    def route(self, req, view):
        first = self.choose_pool(req, view)
        try:
            return self._route_in(first, req, view)
        except NoRoutableWorker:  # none of its prefill (or decode) workers serves: the next best pool
            for _, _, i in sorted(self.router_tier.priced(req, self.block_size)):
                if i != first:
                    try:
                        return self._route_in(i, req, view)
                    except NoRoutableWorker:
                        continue
        raise NoRoutableWorker("no pool has a routable worker for the request")

    def _route_in(self, i: int, req, view) -> int:
        """Pool `i`'s FluidPD routes `req` among its workers; the tier records it."""
        pool = self.pools[i]
        wid = pool.policy.route(req, pool.view(view))
        self.router_tier.routed(req, i, req.prefill_target - view.workers[wid].cached_tokens(req))
        return wid

    def plan_step(self, worker, view):
        pool = self._pool(worker.id)
        return pool.policy.plan_step(worker, pool.view(view))

    def handoff(self, req, worker, view):
        pool = self._pool(worker.id)
        return pool.policy.handoff(req, worker, pool.view(view))

    def observe_step(self, worker, duration_s, plan) -> None:
        self._pool(worker.id).policy.observe_step(worker, duration_s, plan)

    def prefill_batching(self, role):
        return StaticPD.prefill_batching(self, role)  # type: ignore[arg-type]

    # --- control plane ------------------------------------------------------------------
    def tick(self, view: ClusterView) -> list:
        actions: list = []
        for i in range(len(self.pools)):
            actions += self.tick_pool(i, view)
        return actions + self.tick_tier(view)

    def tick_pool(self, i: int, view: ClusterView) -> list:
        """Pool `i`'s control cycle on its sub-view, then its aggregates (what its own core pays)."""
        pool = self.pools[i]
        sub = pool.view(view)
        actions = pool.policy.tick(sub)
        pool.refresh(sub)
        return actions

    def tick_tier(self, view: ClusterView) -> list:
        """The tier's cycle, O(pools): FluidRole across pools."""
        return self.balance.step(self.pools, view)

    def worker_lost(self, wid, view):
        return self._pool(wid).policy.worker_lost(wid, self.pool_view(wid, view))

    def rejoin_role(self, wid, role, view):
        return self._pool(wid).policy.rejoin_role(wid, role, self.pool_view(wid, view))

    def on_phase_done(self, wid, phase, now):
        actions = self._pool(wid).policy.on_phase_done(wid, phase, now)
        self.balance.on_phase_done(wid, now)
        return actions

    def transition_of(self, wid: int) -> RoleTransition | None:
        return self._pool(wid).policy.transition_of(wid)

    def switching(self) -> list[tuple[int, Role]]:
        return [s for p in self.pools for s in p.policy.switching()]

    def force_role(self, wid: int, role: Role, view: ClusterView) -> None:
        """Admin action: switch `wid` to `role` in its pool at the pool's next cycle (ValueError if it
        cannot; its pool keeps one worker of each role)."""
        fluidrole.check_switch(view, wid, role, {w for w, _ in self.switching()})
        pool = self._pool(wid)
        role_of = view.workers[wid].role
        leaving = {w for w, _ in pool.policy.switching()}
        if sum(1 for w in pool.view(view).workers if w.role is role_of and w.routable and w.id not in leaving) < 2:
            raise SwitchConflict(f"worker {wid} is the last serving {role_of.value} worker of pool {pool.index}")
        pool.policy.forced.append((wid, role))

    # --- what reports read --------------------------------------------------------------
    @property
    def transitions(self) -> list[RoleTransition]:
        return sorted((t for p in self.pools for t in p.policy.transitions), key=lambda t: (t.began_s, t.worker))

    @property
    def transition(self) -> RoleTransition | None:
        """A switch under way (the first pool's that has one)."""
        return next((p.policy.transition for p in self.pools if p.policy.transition is not None), None)

    @property
    def routed_to_decode(self) -> int:
        """The pools' routers' counts, summed."""
        return sum(p.policy.routed_to_decode for p in self.pools)

    @property
    def pressure(self) -> Pressure:
        """The pools' last PPI and DPI, averaged over the pools (each is its own pool's)."""
        if not self.pools:
            return Pressure(0.0, 0.0, 0.0)
        n = len(self.pools)
        ps = [p.policy.pressure for p in self.pools]
        return Pressure(max(x.t for x in ps), sum(x.ppi for x in ps) / n, sum(x.dpi for x in ps) / n)

    @property
    def state(self) -> str:
        """Each pool's control state, counted: e.g. `balanced x15, prefill-spike x1`."""
        counts: dict[str, int] = {}
        for p in self.pools:
            counts[p.policy.state] = counts.get(p.policy.state, 0) + 1
        return ", ".join(f"{s} x{n}" for s, n in sorted(counts.items()))

    @property
    def prefill_scale(self) -> float:
        """Measured over modelled prefill step time, averaged over the pools (admission's scale)."""
        return sum(p.policy.prefill_scale for p in self.pools) / len(self.pools) if self.pools else 1.0
