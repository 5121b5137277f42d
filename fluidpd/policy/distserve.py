"""`distserve`: static-pd whose split a planner changes by restarting workers (DistServe Section VI).

Between replans it is static-pd. `force_role(wid, role)` (its admin action) queues a restart: the worker stops taking
work, finishes what it has (no migration: DistServe moves no live KV), waits for decode workers to
pull the KV it holds, goes down for `restart_s` (the modelled cold restart), and comes back in its
new role. Restarts of different workers run at once, as a redeploy of the changed instances does.
"""

from __future__ import annotations

from fluidpd.policy import fluidrole
from fluidpd.policy.fluidrole import RoleTransition
from fluidpd.policy.static_pd import StaticPD
from fluidpd.policy.view import ClusterView, Role


class DistServe(StaticPD):
    """static-pd with replanning by restart."""

    name = "distserve"
    uses_tick = True

    def __init__(self, config=None):
        super().__init__(config)
        self.restart_s = 0.0  # set by the planner from the restart model
        self.pending: list[tuple[int, Role]] = []
        self.active: dict[int, RoleTransition] = {}
        self.transitions: list[RoleTransition] = []

    def force_role(self, wid: int, role: Role, view: ClusterView) -> None:
        """Queue a restart of `wid` into `role` (ValueError if it cannot happen)."""
        fluidrole.check_switch(view, wid, role, {w for w, _ in self.switching()})
        self.pending.append((wid, role))

    def switching(self) -> list[tuple[int, Role]]:
        """(worker, role it is becoming) of every restart queued or under way."""
        return [(t.worker, t.dst_role) for t in self.active.values()] + self.pending

    def tick(self, view: ClusterView) -> list:
        actions: list = []
        for wid, role in self.pending:
            t, start = fluidrole.begin(view, wid, role, "replan", restart_s=self.restart_s)
            self.active[wid] = t
            self.transitions.append(t)
            actions += start
        self.pending.clear()
        for t in list(self.active.values()):
            if t.phase == "drain":
                actions += fluidrole.drain_step(t, view, fluidrole.FluidRoleConfig())
        return actions

    def transition_of(self, wid: int) -> RoleTransition | None:
        return self.active.get(wid)

    def worker_lost(self, wid: int, view: ClusterView) -> list:
        """A restart of the lost worker is abandoned (its replacement joins in the old role)."""
        t = self.active.pop(wid, None)
        if t is not None:
            t.reason += " (abandoned: worker lost)"
        self.pending = [p for p in self.pending if p[0] != wid]
        return []

    def on_phase_done(self, wid: int, phase: str, now: float) -> list:
        t = self.active.get(wid)
        if t is None:
            raise ValueError(f"no restart of worker {wid} in progress")
        actions = fluidrole.phase_done(t, phase, now)
        if t.done:
            del self.active[wid]
        return actions
