"""FluidPD's role switches: which worker may switch, and the one switch under way (started, driven, abandoned)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from fluidpd.policy import fluidrole
from fluidpd.policy.fluidrole import RoleTransition
from fluidpd.policy.view import ClusterView, Role

if TYPE_CHECKING:
    from fluidpd.policy.fluidconfig import FluidConfig
    from fluidpd.policy.shape import PrefillForecast
    from fluidpd.policy.telemetry import Pressure


class RoleSwitches:
    """Mixin of FluidPD: FluidRole's switches, one at a time, within the residence and decode-floor limits."""

    if TYPE_CHECKING:  # what FluidPD provides
        fluid: FluidConfig
        pressure: Pressure
        to_decode: float

        def served(self, moved: int, leaving: int | None = None) -> float: ...

        use_token: bool
        prefill_forecast: PrefillForecast | None
        transition: RoleTransition | None
        transitions: list[RoleTransition]
        forced: list[tuple[int, Role]]
        _since: dict[str, float]

    def _reversal(self, now: float, role: Role) -> bool:
        """A switch to `role` would undo the last automatic switch within the forecast horizon it was
        taken for (the shape is held a horizon before a decode -> prefill switch reverses it)."""
        last = next((t for t in reversed(self.transitions) if t.reason.startswith("auto")), None)
        return last is not None and last.src_role is role and now - last.began_s < self.fluid.horizon_s

    def _can_move(self, view: ClusterView):
        """Whether a worker may switch roles now (the cluster is read once: nothing changes while
        the switch is chosen)."""
        serving = Counter(x.role for x in view.workers if x.routable)
        floor = DecodeFloor(view, self.fluid.decode_kv_share)

        def eligible(w) -> bool:
            last_may_go = w.role is Role.PREFILL and self.use_token and self.to_decode > 0
            if (serving[w.role] < 2 and not last_may_go) or view.now - w.role_since < self.fluid.tau_residence_s:
                return False
            return w.role is not Role.DECODE or self._decode_floor_holds(floor, w)

        return eligible

    def _worth_prefill(self, view: ClusterView):
        """Eligible, and as a prefill worker it gains more prefill work over the horizon than the
        switch costs (one that already prefills nearly as much by borrowing is not), in a shape
        predicted to serve no less (the decode side may lose more than prefill gains)."""
        eligible, fc = self._can_move(view), self.prefill_forecast
        if fc is None:
            return eligible
        now = self.served(0)
        return lambda w: eligible(w) and fc.gain_s(w.id) > self.fluid.switch_cost_s and self.served(1, w.id) >= now

    def _decode_floor_holds(self, floor: DecodeFloor, leaving) -> bool:
        """The decode pool without `leaving` still holds the KV decode needs (what is in use and
        promised to hand-offs) within `decode_kv_share` of its KV, and stays below theta_D_high."""
        rest, room = floor.without(leaving)
        dpi = self.pressure.dpi * len(floor.pool) / max(rest, 1)
        return rest > 0 and floor.demand <= room and dpi < self.fluid.theta_d_high

    def _start(self, view: ClusterView, wid: int | None, role: Role, reason: str = "auto") -> list:
        if wid is None:
            return []
        self.transition, actions = fluidrole.begin(view, wid, role, reason)
        self.transitions.append(self.transition)
        self._since.clear()
        return actions

    def _drive(self, t: RoleTransition, view: ClusterView) -> list:
        if t.phase != "drain":
            return []
        timeout = self.fluid.drain_timeout_s
        if timeout and view.now - t.began_s > timeout:
            self.transition = None
            return fluidrole.rollback(t, view.now, f"drain over {timeout:g} s")
        return fluidrole.drain_step(t, view, self.fluid.role)

    def on_phase_done(self, wid: int, phase: str, now: float) -> list:
        t = self.transition
        if t is None or t.worker != wid:
            raise ValueError(f"no transition of worker {wid} in progress")
        actions = fluidrole.phase_done(t, phase, now)
        if t.done:
            self.transition = None
        return actions

    def transition_of(self, wid: int) -> RoleTransition | None:
        t = self.transition
        return t if t is not None and t.worker == wid else None

    def worker_lost(self, wid: int, view: ClusterView) -> list:
        """A switch of the lost worker is abandoned; one under way elsewhere goes on."""
        t = self.transition_of(wid)
        if t is not None:
            t.reason += " (abandoned: worker lost)"
            self.transition = None
        self.forced = [f for f in self.forced if f[0] != wid]
        return []

    def switching(self) -> list[tuple[int, Role]]:
        """(worker, role it is becoming) of every switch queued or under way."""
        t = self.transition
        return list(self.forced) + ([(t.worker, t.dst_role)] if t is not None else [])

    def force_role(self, wid: int, role: Role, view: ClusterView) -> None:
        """Admin action: switch `wid` to `role` at the next cycle (ValueError if it cannot)."""
        fluidrole.check_switch(view, wid, role, {w for w, _ in self.switching()})
        self.forced.append((wid, role))


class DecodeFloor:
    """The routable decode pool's KV demand (in use and promised to hand-offs) and size."""

    def __init__(self, view: ClusterView, share: float):
        self.pool = {x.id: x for x in view.workers if x.role is Role.DECODE and x.routable}
        self.demand = sum(x.kv_blocks_used + x.pull_blocks_pending for x in self.pool.values())
        self.blocks = sum(x.kv_blocks_total for x in self.pool.values())
        self.share = share

    def without(self, leaving) -> tuple[int, float]:
        """Workers left without `leaving`, and `share` of their KV blocks."""
        if leaving.id not in self.pool:
            return len(self.pool), self.share * self.blocks
        return len(self.pool) - 1, self.share * (self.blocks - self.pool[leaving.id].kv_blocks_total)
