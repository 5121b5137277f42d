"""The policy interface every world drives, and the knobs the baselines share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fluidpd.core.knobs import knob
from fluidpd.core.request import Request
from fluidpd.policy.routers import ROUTERS, check_router, make_router
from fluidpd.policy.routing import candidates
from fluidpd.policy.view import ClusterView, Role, StepPlan, WorkerView

if TYPE_CHECKING:
    from fluidpd.policy.costs import CostModel
    from fluidpd.policy.fluidconfig import FluidConfig
    from fluidpd.policy.fluidrole import RoleTransition


@dataclass(slots=True)
class PolicyConfig:
    """Scheduling knobs shared by the policies (vLLM-style names)."""

    max_num_seqs: int = knob(256, "requests decoding or admitted per worker")
    max_num_batched_tokens: int = knob(8192, "colocated: prefill tokens per step")
    chunk_budget: int = knob(512, "chunked: tokens per mixed step (Sarathi-Serve)")
    prefill_batch_tokens: int = knob(0, "static-pd: DistServe's L_m (0: profiled by the world)")
    prefill_workers: int = knob(0, "initial prefill workers of a disaggregated policy (0: a quarter)")
    router: str = knob(
        "",
        "which worker takes a new request: least-loaded, shortest-queue, round-robin, sglang-cache-aware, "
        "dynamo-kv, llm-d, cache-affinity, or (fluidpd) kv-affinity; empty: the policy's own",
    )
    tick_s: float = 0.010  # control-plane cycle (FluidPD's 10 ms)
    max_prefill_chunk: int = 0  # a whole-prompt step prefills at most this many tokens of one prompt (0: all)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "chunk_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.prefill_workers < 0 or self.prefill_batch_tokens < 0 or self.max_prefill_chunk < 0:
            raise ValueError("prefill_workers, prefill_batch_tokens and max_prefill_chunk must be >= 0")
        if self.tick_s <= 0:
            raise ValueError("tick_s must be > 0")


class Policy:
    """A serving policy: initial roles, routing, step content, hand-off, periodic control."""

    name = "policy"
    uses_tick = False
    needs_costs = False  # built with a CostModel the world fits (see `build`)
    prefilled_arrivals = False  # requests arrive with their prompt's KV in place (the decode phase alone)
    default_router = "least-loaded"
    follows_kv = False  # next turns go where a request's KV went: a hand-off's source copy evicts first
    own_routers: tuple[str, ...] = ()  # routers this policy builds itself (not in ROUTERS)

    def __init__(self, config: PolicyConfig | None = None):
        self.config = config or PolicyConfig()
        self.router_name = self.router_of(self.config)
        self.router = make_router(self.router_name) if self.router_name in ROUTERS else None

    @classmethod
    def router_of(cls, config: PolicyConfig) -> str:
        """The router this policy runs under `config` (ValueError for one it does not have)."""
        name = config.router or cls.default_router
        check_router(name, cls.own_routers)
        return name

    @property
    def label(self) -> str:
        """`<policy>+<router>`, as the KV-reuse table names its rows."""
        return f"{self.name}+{self.router_name}"

    def pick(self, req: Request, view: ClusterView, role: Role) -> int:
        """The worker of `role` the configured router picks for `req`."""
        assert self.router is not None
        return self.router.pick(req, candidates(view.workers, role), view).id

    @classmethod
    def build(
        cls, config: PolicyConfig | None = None, fluid: FluidConfig | None = None, costs: CostModel | None = None
    ) -> Policy:
        """The policy from its config; policies that need them take the FluidPD knobs and costs."""
        return cls(config)

    def roles(self, n_workers: int) -> list[Role]:
        return [Role.COLOCATED] * n_workers

    def route(self, req: Request, view: ClusterView) -> int:
        """The worker whose prefill queue takes a new request."""
        return self.pick(req, view, Role.COLOCATED)

    def plan_step(self, worker: WorkerView, view: ClusterView) -> StepPlan:
        raise NotImplementedError

    def serving_view(self, req: Request, view: ClusterView) -> ClusterView:
        """The part of the cluster `route` would place `req` in (what admission estimates over)."""
        return view

    def handoff(self, req: Request, worker: WorkerView, view: ClusterView) -> int | None:
        """Where a just-prefilled request decodes: a decode worker id, or None to stay."""
        return None

    def tick(self, view: ClusterView) -> list:
        """Periodic control (every `config.tick_s`); baselines do nothing."""
        return []

    def observe_step(self, worker: WorkerView, duration_s: float, plan: StepPlan) -> None:
        """A step of `worker` finished after `duration_s` (measured or simulated)."""

    def prefill_batching(self, role: Role) -> tuple[int, bool]:
        """How a worker in `role` batches prompts: tokens a step, and whether prompts are split
        into chunks (for `costs.batched_prefill_time`)."""
        return self.config.max_num_batched_tokens, False

    def worker_lost(self, wid: int, view: ClusterView) -> list:
        """Worker `wid` died with its KV (its requests already start over elsewhere); actions to take."""
        return []

    def rejoin_role(self, wid: int, role: Role, view: ClusterView) -> Role:
        """The role a replacement for lost worker `wid` (which had `role`) joins in."""
        return role

    def on_phase_done(self, wid: int, phase: str, now: float) -> list:
        raise ValueError(f"{self.name} runs no role transitions")

    def transition_of(self, wid: int) -> RoleTransition | None:
        """The role transition of worker `wid` under way, if any."""
        return None

    @property
    def routed_to_decode(self) -> int:
        """Requests routed to prefill on the decode worker they then decode on (a simulation's
        `routed_to_decode`); 0 for a policy that never does."""
        return 0
