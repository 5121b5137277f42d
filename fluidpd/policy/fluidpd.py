"""The FluidPD coordinator: PPI/DPI every cycle, four states, FluidToken and FluidRole.

  Balanced:                PPI <= 1 and DPI <= 1                  -> nothing
  Transient prefill spike: PPI > 1 and DPI < theta_D_low          -> FluidToken borrowing
  Sustained prefill deficit: PPI_H > theta_P_high for tau_persist and DPI < theta_D_idle
                                                                  -> FluidRole decode j* -> prefill
  Sustained decode deficit:  DPI > theta_D_high for tau_persist and PPI < theta_P_idle,
                           or the decode pool short of KV for tau_persist: hand-offs wait for
                           more than it has free, or while PPI > 1 its free KV is under
                           kv_headroom (FluidToken has no room to borrow into)
                                                                  -> FluidRole prefill k* -> decode
FluidToken borrows whenever PPI > 1, not only in the spike state: with DPI high from KV use
(overloaded) single decode workers can still have step slack and KV room, and those two checks,
per worker, are what keep borrowing from hurting decode. Where workers share a host's cores
(`CostModel.compute_slots`) it does not borrow while prefill workers with work fill every slot: a
borrowed chunk would then only take their cores. A decode pool short of KV is a decode
deficit however high PPI is: the prefill worker that switches decodes the KV it holds in place (the
KV the waiting hand-offs could not place), and its KV gives FluidToken room, whose chunks ride on
decode steps that are memory-bound anyway.
All-decode state: the last prefill worker may switch too when the decode pool is short of KV
(both phases overloaded: P/D's dedicated prefill KV cannot hold decodes, and FluidToken on every
worker is chunked prefill with a per-step TBT bound); prompts then go to the decode worker with the
least queued prefill work, and PPI is computed over the decode workers' queues, so a backlog brings
a prefill worker back by the ordinary prefill-deficit rule.
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


class FluidPD(RoleSwitches, StaticPD):
    """Static P/D plus FluidToken (ms) and FluidRole (s), driven by PPI and DPI."""

    name = "fluidpd"
    uses_tick = True
    needs_costs = True
    use_token = True
    use_role = True
    default_router = KV_AFFINITY
    own_routers = (KV_AFFINITY,)

    def __init__(
        self, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
    ):
        super().__init__(config)
        if costs is None:
            raise ValueError(f"{self.name} needs a CostModel (SLOs and the fitted step times)")
        self.fluid = fluid = fluid or FluidConfig()
        self.costs = costs
        self.token = FluidToken(costs.chunk_time, costs.slo.tbt_s, fluid.token, costs.decode_ref_s, costs.attn_pair_s)
        self.state = BALANCED
        self.pressure = Pressure(0.0, 0.0, 0.0)
        self.history: list[tuple[float, float, float, str]] = []
        self.transition: RoleTransition | None = None
        self.transitions: list[RoleTransition] = []
        self.forced: list[tuple[int, Role]] = []
        self._since: dict[str, float] = {}
        self.kv_short = False  # the decode pool is short of KV (last control cycle)
        self.prefill_scale = 1.0  # measured / modelled prefill step time (EWMA over prefill steps)
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
            self.follows_kv = True

    @classmethod
    def build(cls, config=None, fluid=None, costs=None):
        return cls(config, fluid, costs)

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
        """f_P(tokens), scaled by how much slower than profiled this world's prefill steps run."""
        return self.prefill_scale * self.costs.prefill_time(tokens)

    # --- control plane ------------------------------------------------------------------
    def tick(self, view: ClusterView) -> list:
        f, c = self.fluid, self.costs
        ppi = prefill_pressure_index(view, self.prefill_work, c.slo.ttft_s, f.ppi_cap)
        dpi = decode_pressure_index(view, c.slo.tbt_s, f.alpha, self.token.t_iter)
        self.pressure = Pressure(view.now, ppi, dpi)
        self.kv_short = kv_bound(view, f.token.kv_headroom if ppi > 1.0 else None)
        self.prefill_forecast = self.forecast(view) if ppi > f.theta_p_high else None
        role_ppi = ppi if self.prefill_forecast is None else self.prefill_forecast.ppi
        self.state = self.classify(view.now, ppi, dpi, self.kv_short, role_ppi)
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
        borrowing = {}
        if self.use_token and not self.cores_prefilling(view):
            batch = self.config.prefill_batch_tokens or self.token.config.max_chunk
            per_worker = batch / self.prefill_work(batch)
            for w in view.workers:
                if w.role is Role.DECODE and w.routable:
                    borrowing[w.id] = min(1.0, self.token.prefill_rate(w) / per_worker)
        work = sum(self.prefill_work(r.prefill_remaining - r.queued_hit) for w in prompt_pool(view) for r in w.queue)
        f = self.fluid
        return PrefillForecast(work, self.demand.rate(view.now), prefill, borrowing, self.costs.slo.ttft_s, f.horizon_s)

    def classify(
        self, now: float, ppi: float, dpi: float, kv_bound: bool = False, role_ppi: float | None = None
    ) -> str:
        """The control state; `role_ppi` (default `ppi`) is what a sustained prefill deficit reads."""
        f = self.fluid
        role_ppi = ppi if role_ppi is None else role_ppi
        deficit_p = self._held("p", role_ppi > f.theta_p_high and dpi < f.theta_d_idle, now)
        deficit_d = self._held("d", (dpi > f.theta_d_high and ppi < f.theta_p_idle) or kv_bound, now)
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


def kv_bound(view: ClusterView, headroom: float | None = None) -> bool:
    """The routable decode pool is short of KV: hand-offs wait for more than it has free, or (with
    `headroom`, while prompts queue) what it has free beyond them is under that share of its KV,
    so FluidToken has no room to borrow into."""
    pool = [w for w in view.workers if w.role is Role.DECODE and w.routable]
    free = sum(w.free_blocks - w.pull_blocks_pending for w in pool)
    if free < 0:
        return True
    return headroom is not None and free < headroom * sum(w.kv_blocks_total for w in pool)


class FluidTokenOnly(FluidPD):
    """FluidPD with only the micro engine: borrowing, no role switches."""

    name = "fluidtoken"
    use_role = False
