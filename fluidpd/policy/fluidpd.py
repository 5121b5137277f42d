"""The FluidPD coordinator: PPI/DPI every cycle, four states, FluidToken and FluidRole.

  Balanced:                PPI <= 1 and DPI <= 1                  -> nothing
  Transient prefill spike: PPI > 1 and DPI < theta_D_low          -> FluidToken borrowing
  Sustained prefill deficit: PPI_H > theta_P_high for tau_persist and DPI < theta_D_idle
                                                                  -> FluidRole decode j* -> prefill
  Sustained decode deficit:  DPI > theta_D_high for tau_persist and PPI < theta_P_idle,
                           or for tau_persist the shape with one more decode worker is predicted
                           to serve more over the horizon than this one, by more than the switch costs
                                                                  -> FluidRole prefill k* -> decode
FluidToken borrows whenever PPI > 1, not only in the spike state: with DPI high from KV use
(overloaded) single decode workers can still have step slack and KV room, and those two checks,
per worker, are what keep borrowing from hurting decode. Where workers share a host's cores
(`CostModel.compute_slots`) it does not borrow while prefill workers with work fill every slot: a
borrowed chunk would then only take their cores.
A prefill -> decode switch is a prediction too: each shape serves min(prefill share, decode share)
of what arrives over the horizon (`PrefillForecast.served`, `DecodeForecast.served`: the prefill
capacity, FluidToken's borrowing on the decode workers included, against the queued and routed
prefill work; the decode pool's KV against its predicted demand). One more decode worker is taken
when that share gains more than the switch costs (`switch_cost_s` of one worker out of the cluster,
over the horizon): a decode pool short of KV switches a prefill worker, which decodes the KV it
holds in place, unless the prefill side would then fall further behind than decode gains. A
decode -> prefill switch is also held to it: none that the prediction says serves less.
All-decode state: the last prefill worker may switch too when the prediction says so (both phases
overloaded: P/D's dedicated prefill KV cannot hold decodes, and FluidToken on every worker is
chunked prefill with a per-step TBT bound); prompts then go to the decode worker with the least
queued prefill work, and PPI is computed over the decode workers' queues, so a backlog brings a
prefill worker back by the ordinary prefill-deficit rule.
A decode -> prefill switch is a prediction, not a reading (`fluidpd.policy.shape`): PPI_H is where
the prefill backlog will be after `horizon_s` at the work routed per second over the last horizon,
against this shape's prefill capacity, FluidToken's borrowing on the decode workers included; and j*
is only a decode worker that would add more prefill work over the horizon than `switch_cost_s`
(one that already prefills nearly a prefill worker's worth by borrowing gains nothing by switching).
No thrashing: one transition at a time, a worker keeps a role for tau_residence, a decode -> prefill
switch does not undo an automatic prefill -> decode one within a horizon, and at least one decode
worker (and, unless the decode pool is short of KV, one prefill worker) always remains.
"""

from __future__ import annotations

from fluidpd.policy import fluidrole, routing, stepplan
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.costs import CostModel
from fluidpd.policy.decode_demand import DecodeDemand, DecodeForecast
from fluidpd.policy.fluidbase import FluidBase
from fluidpd.policy.fluidconfig import LATE_LAST, FluidConfig
from fluidpd.policy.fluidrole import RoleTransition
from fluidpd.policy.fluidtoken import FluidToken
from fluidpd.policy.role_switches import RoleSwitches
from fluidpd.policy.routers.kv_affinity import KV_AFFINITY, KvAffinity
from fluidpd.policy.shape import PrefillDemand, PrefillForecast
from fluidpd.policy.static_pd import StaticPD
from fluidpd.policy.telemetry import Pressure, decode_pressure_index, prefill_pressure_index, prompt_pool
from fluidpd.policy.view import ClusterView, Role

BALANCED = "balanced"
PREFILL_SPIKE = "prefill-spike"
PREFILL_DEFICIT = "prefill-deficit"
DECODE_DEFICIT = "decode-deficit"
OVERLOADED = "overloaded"
PREFILL_SCALE_EWMA, MIN_PREFILL_SCALE, MAX_PREFILL_SCALE = 0.5, 1.0, 20.0


class FluidPD(RoleSwitches, FluidBase, StaticPD):
    """Static P/D plus FluidToken (ms) and FluidRole (s), driven by PPI and DPI."""

    name = "fluidpd"
    use_token = True
    use_role = True

    def __init__(
        self, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
    ):
        super().__init__(config, fluid, costs)
        fluid, costs = self.fluid, self.costs
        self.token = FluidToken(costs.chunk_time, costs.slo.tbt_s, fluid.token, costs.decode_ref_s, costs.attn_pair_s)
        self.state = BALANCED
        self.pressure = Pressure(0.0, 0.0, 0.0)
        self.history: list[tuple[float, float, float, str]] = []
        self.transition: RoleTransition | None = None
        self.transitions: list[RoleTransition] = []
        self.forced: list[tuple[int, Role]] = []
        self._since: dict[str, float] = {}
        self.decode_demand = DecodeDemand(fluid.horizon_s, fluid.history_s)
        self.decode_forecast: DecodeForecast | None = None
        self.to_decode = 0.0  # what one more decode worker gains in predicted served share, less its cost
        self.prefill_scale = 1.0  # measured / modelled prefill step time (EWMA over prefill steps)
        self._f_p: dict[float, float] = {}  # costs.prefill_time by token count
        self.prefill_forecast: PrefillForecast | None = None  # the last control cycle's, while PPI > theta_P_high
        self.demand = PrefillDemand(fluid.horizon_s)  # prefill work routed per second (the shape predictor's)
        self.affinity = None
        if self.router_name == KV_AFFINITY:
            self.affinity = KvAffinity(
                self.prefill_work,
                lambda: self.config.prefill_batch_tokens,
                self.token,
                costs.kv_move_s_per_token,
                costs.kv_load_s_per_token,
            )

    @property
    def routed_to_decode(self) -> int:
        """Requests the KV-affinity router sent to prefill on their decode worker (0 under another router)."""
        return self.affinity.on_decode if self.affinity is not None else 0

    # --- data plane ---------------------------------------------------------------------
    def route(self, req, view):
        if self.use_token and not any(w.role is Role.PREFILL and w.routable for w in view.workers):
            wid = routing.least_queued_decode(view.workers)
        elif self.affinity is not None:
            wid = self.affinity.route(req, view)
        else:
            wid = self.pick(req, view, Role.PREFILL)
        new = req.prefill_target - view.workers[wid].cached_tokens(req)
        self.demand.add(view.now, self.prefill_work(new))
        return wid

    def plan_step(self, worker, view):
        late = self.late(view.now)
        if worker.role is Role.DECODE:
            return self.token.plan(worker, self.config.max_num_seqs, late)
        c = self.config
        return stepplan.prefill_only(worker, c.prefill_batch_tokens, c.max_num_seqs, c.max_prefill_chunk, late)

    def late(self, now: float):
        """With `queue_order` late-last, the test of a queued request that has missed its TTFT SLO
        already (`stepplan.past_ttft`): such requests wait behind the rest. None: FCFS."""
        return stepplan.past_ttft(now, self.costs.slo.ttft_s) if self.fluid.queue_order == LATE_LAST else None

    def handoff(self, req, worker, view):
        if worker.role is Role.DECODE:
            return None  # prefilled on a decode worker: the KV is already where the request decodes
        if self.affinity is not None:  # the decode worker holding most of its context, with room and slack
            return self.affinity.decode_for(req, view).id
        return routing.least_loaded_decode(view.workers)

    def observe_step(self, worker, duration_s: float, plan) -> None:
        if worker.role is Role.DECODE:
            self.token.observe(worker, duration_s, plan)
        elif worker.role is Role.PREFILL and plan.chunks and not plan.decode:
            modelled = self.costs.prefill_time(plan.prefill_tokens)
            if modelled > 0:  # f_P as this world runs it: a loaded host prefills slower than profiled
                ratio = min(MAX_PREFILL_SCALE, max(MIN_PREFILL_SCALE, duration_s / modelled))
                self.prefill_scale += PREFILL_SCALE_EWMA * (ratio - self.prefill_scale)

    def prefill_work(self, tokens: float) -> float:
        """f_P(tokens), scaled by how much slower than profiled this world's prefill steps run (f_P
        memoized by token count: PPI evaluates it for every queued prompt every cycle)."""
        t = self._f_p.get(tokens)
        if t is None:
            t = self._f_p[tokens] = self.costs.prefill_time(tokens)
        return self.prefill_scale * t

    # --- control plane ------------------------------------------------------------------
    def tick(self, view: ClusterView) -> list:
        f, c = self.fluid, self.costs
        ppi = prefill_pressure_index(view, self.prefill_work, c.slo.ttft_s, f.ppi_cap)
        dpi = decode_pressure_index(view, c.slo.tbt_s, f.alpha, self.token.t_iter)
        self.pressure = Pressure(view.now, ppi, dpi)
        self.decode_forecast = df = self.decode_demand.observe(view)
        decode_short = df.room(f.token.kv_headroom) < 1.0
        self.prefill_forecast = self.forecast(view) if ppi > f.theta_p_high or decode_short else None
        role_ppi = ppi if self.prefill_forecast is None or ppi <= f.theta_p_high else self.prefill_forecast.ppi
        self.to_decode = self.decode_gain(view) if decode_short else 0.0
        self.state = self.classify(view.now, ppi, dpi, self.to_decode > 0, role_ppi)
        if not self.history or view.now - self.history[-1][0] >= f.history_s:
            self.history.append((view.now, ppi, dpi, self.state))
        actions: list = []
        if self.transition is not None:
            actions += self._drive(self.transition, view)
        elif self.forced:
            actions += self._start(view, *self.forced.pop(0), reason="admin")
        elif self.use_role and self.state == PREFILL_DEFICIT and not self._reversal(view.now, Role.PREFILL):
            actions += self._start(
                view, fluidrole.choose_decode_to_prefill(view, self._worth_prefill(view)), Role.PREFILL
            )
        elif self.use_role and self.state == DECODE_DEFICIT:
            actions += self._start(view, fluidrole.choose_prefill_to_decode(view, self._can_move(view)), Role.DECODE)
        if self.use_token and ppi > 1.0 and not self.cores_prefilling(view):
            actions += self.token.borrow(view, self.late(view.now))
        return actions

    def cores_prefilling(self, view: ClusterView) -> bool:
        """Every compute slot of a host whose workers share its cores is taken by a prefill worker with
        work: a chunk borrowed by a decode worker would slow them by as much as it computes."""
        slots = self.costs.compute_slots
        return slots > 0 and sum(1 for w in view.workers if w.role is Role.PREFILL and w.queue) >= slots

    def forecast(self, view: ClusterView) -> PrefillForecast | None:
        """The prefill side of this shape over the next horizon (`fluidpd.policy.shape`); None in the
        all-decode state (no prefill worker), where the plain PPI brings one back."""
        prefill = sum(1 for w in view.workers if w.role is Role.PREFILL and w.routable)
        if not prefill:
            return None
        borrowing, lendable = {}, {}
        if self.use_token and not self.cores_prefilling(view):
            batch = self.config.prefill_batch_tokens or self.token.config.max_chunk
            per_worker = batch / self.prefill_work(batch)
            for w in view.workers:
                if w.role is Role.DECODE and w.routable:
                    lendable[w.id] = min(1.0, self.token.prefill_rate(w) / per_worker)
                    borrowing[w.id] = lendable[w.id] if self.token.has_room(w) else 0.0
        work = sum(self.prefill_work(r.prefill_remaining - r.queued_hit) for w in prompt_pool(view) for r in w.queue)
        f = self.fluid
        now = view.now
        rate, seen = self.demand.rate(now), self.demand.rate(now, seen=True)
        return PrefillForecast(work, rate, prefill, borrowing, self.costs.slo.ttft_s, f.horizon_s, lendable, seen)

    def served(self, moved: int, leaving: int | None = None) -> float:
        """The share of what arrives over the horizon that the shape with `moved` workers moved from
        decode to prefill (negative: from prefill to decode) serves: min of the prefill and decode
        sides, FluidToken lending what its slack allows on the decode workers in proportion to the KV
        they have for it. `leaving`: the decode worker that becomes a prefill worker (a worker that
        joins the decode pool lends the pool's mean)."""
        pf, df = self.prefill_forecast, self.decode_forecast
        assert pf is not None and df is not None
        lent = sum(pf.lendable.values())
        if moved > 0 and leaving is not None:
            lent -= pf.lendable.get(leaving, 0.0)
        elif moved < 0 and pf.lendable:
            lent -= moved * lent / len(pf.lendable)
        room = df.room(self.fluid.token.kv_headroom, -moved)
        return min(pf.served(moved, lent * room), df.served(-moved))

    def decode_gain(self, view: ClusterView) -> float:
        """What one more decode worker gains in predicted served share over the horizon, less the
        switch's cost (`switch_cost_s` of one routable worker's time, over the horizon); 0 without a
        prefill worker to move."""
        if self.prefill_forecast is None or self.decode_forecast is None:
            return 0.0
        f = self.fluid
        n = sum(1 for w in view.workers if w.routable)
        return self.served(-1) - self.served(0) - f.switch_cost_s / (max(n, 1) * f.horizon_s)

    def classify(
        self, now: float, ppi: float, dpi: float, to_decode: bool = False, role_ppi: float | None = None
    ) -> str:
        """The control state; `role_ppi` (default `ppi`) is what a sustained prefill deficit reads."""
        f = self.fluid
        role_ppi = ppi if role_ppi is None else role_ppi
        deficit_p = self._held("p", role_ppi > f.theta_p_high and dpi < f.theta_d_idle, now)
        deficit_d = self._held("d", (dpi > f.theta_d_high and ppi < f.theta_p_idle) or to_decode, now)
        if deficit_p:
            return PREFILL_DEFICIT
        if deficit_d:
            return DECODE_DEFICIT
        if ppi > 1.0 and dpi < f.theta_d_low:
            return PREFILL_SPIKE
        if ppi <= 1.0 and dpi <= 1.0:
            return BALANCED
        return OVERLOADED

    def _held(self, key: str, cond: bool, now: float) -> bool:
        """True once `cond` has held continuously for tau_persist."""
        if not cond:
            self._since.pop(key, None)
            return False
        since = self._since.setdefault(key, now)
        return now - since >= self.fluid.tau_persist_s


class FluidTokenOnly(FluidPD):
    """FluidPD with only the micro engine: borrowing, no role switches."""

    name = "fluidtoken"
    use_role = False
