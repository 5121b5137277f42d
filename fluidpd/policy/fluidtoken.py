"""FluidToken: decode workers with slack run bounded prefill chunks inside the TBT budget.

slack = SLO_TBT - T_iter(B) - delta_guard, with T_iter the worker's measured decode step time and
delta_guard learned from its measured jitter (JitterTracker). The chunk runs fused into the decode
step's forward pass, so its cost is the marginal time `chunk_time` (fitted like f_P: nearly free
while the dense layers stay memory-bound). C_chunk is the largest c whose marginal cost, after the
request's earlier chunks, fits the slack. A borrowed request's KV stays on the decode worker, which
then decodes it; a prompt longer than one chunk runs as chunks over successive iterations.
"""
from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.polynomial import Polynomial
from fluidpd.core.request import Request
from fluidpd.policy.actions import Borrow
from fluidpd.policy.jitter import JitterTracker
from fluidpd.policy.stepplan import chunks_within
from fluidpd.policy.view import ClusterView, Role, StepPlan, WorkerView, blocks_for


@dataclass(slots=True)
class FluidTokenConfig:
    """Knobs of the micro engine."""

    min_chunk: int = 16               # a chunk smaller than this is not worth borrowing for
    max_chunk: int = 8192
    borrowed_per_worker: int = 1      # requests a decode worker holds for borrowing at once
    guard_factor: float = 1.5         # delta_guard = factor x p99.9 of measured jitter
    guard_default_s: float = 0.003    # until enough steps are measured (the seed's 2-3 ms)

    def __post_init__(self) -> None:
        if not 1 <= self.min_chunk <= self.max_chunk or self.borrowed_per_worker < 1:
            raise ValueError("need 1 <= min_chunk <= max_chunk and borrowed_per_worker >= 1")
        if self.guard_factor <= 0 or self.guard_default_s < 0:
            raise ValueError("guard_factor must be > 0 and guard_default_s >= 0")


class FluidToken:
    """Per-worker slack, chunk sizing, borrowing and the step plan of a borrowing decode worker."""

    def __init__(self, chunk_time: Polynomial, slo_tbt_s: float, config: FluidTokenConfig | None = None):
        self.chunk_time = chunk_time
        self.slo_tbt_s = slo_tbt_s
        self.config = config or FluidTokenConfig()
        self.jitter: dict[int, JitterTracker] = {}
        self.borrowed = 0

    def tracker(self, wid: int) -> JitterTracker:
        t = self.jitter.get(wid)
        if t is None:
            c = self.config
            t = self.jitter[wid] = JitterTracker(factor=c.guard_factor, default_s=c.guard_default_s)
        return t

    def observe(self, w: WorkerView, duration_s: float) -> None:
        """A decode-only step of `w` took `duration_s` (T_iter before this step: its EWMA)."""
        if w.step_time_ewma_s > 0:
            self.tracker(w.id).observe(duration_s - w.step_time_ewma_s)

    def slack(self, w: WorkerView) -> float:
        t_iter = w.step_time_ewma_s if w.num_decoding else 0.0
        return self.slo_tbt_s - t_iter - self.tracker(w.id).guard_s

    def chunk_cost(self, prior: int, c: int) -> float:
        """Marginal time of extending a prefill from `prior` to `prior + c` tokens inside a step."""
        return self.chunk_time(prior + c) - self.chunk_time(prior)

    def chunk_tokens(self, w: WorkerView, prior: int = 0) -> int:
        """C_chunk: the largest c with chunk_cost(prior, c) <= slack (0 if below min_chunk)."""
        budget = self.slack(w)
        if budget <= 0:
            return 0
        base = self.chunk_time(prior)
        c = self.chunk_time.inverse_max(budget + base, prior + self.config.max_chunk, prior + 1) - prior
        return c if c >= self.config.min_chunk else 0

    def plan(self, w: WorkerView, max_num_seqs: int) -> StepPlan:
        """A decode worker's step: every decode, plus borrowed prefill chunks within C_chunk."""
        plan = StepPlan(decode=w.num_decoding > 0)
        if w.queue:
            head = w.queue[0]
            budget = self.chunk_tokens(w, head.prefilled)
            if budget:
                plan.chunks = chunks_within(w, budget, max_num_seqs)
        return plan

    def estimate(self, w: WorkerView, plan: StepPlan) -> float:
        """The planner's own estimate of a step's time (checked against SLO_TBT in tests)."""
        t = w.step_time_ewma_s if plan.decode else 0.0
        return t + sum(self.chunk_cost(r.prefilled, c) for r, c in plan.chunks)

    def borrow(self, view: ClusterView) -> list[Borrow]:
        """Strip requests from the head of the prefill queues onto decode workers with slack."""
        donors = [w for w in view.workers if w.role is Role.PREFILL and w.queue]
        if not donors:
            return []
        owner: dict[int, int] = {}
        for w in donors:  # a few unstarted requests from the head of each queue
            for r in _unstarted_head(w, 8):
                owner[r.id] = w.id
        waiting = sorted((r for w in donors for r in _unstarted_head(w, 8)), key=lambda r: (r.arrival_s, r.id))
        actions: list[Borrow] = []
        taken: set[int] = set()
        for w in view.workers:
            if not waiting or w.role is not Role.DECODE or not w.routable:
                continue
            if len(w.queue) >= self.config.borrowed_per_worker or not self.chunk_tokens(w):
                continue
            req = self._fitting(waiting, w, taken)
            if req is not None:
                taken.add(req.id)
                actions.append(Borrow(req, owner[req.id], w.id))
        self.borrowed += len(actions)
        return actions

    @staticmethod
    def _fitting(waiting: list[Request], w: WorkerView, taken: set[int]) -> Request | None:
        room = w.free_blocks - w.pull_blocks_pending
        for req in waiting[:8]:  # from the head: FCFS, skipping only what cannot fit here
            if req.id not in taken and blocks_for(req.prompt_len + req.output_len, w.block_size) <= room:
                return req
        return None


def _unstarted_head(w: WorkerView, n: int) -> list[Request]:
    found = []
    for r in w.queue:
        if r.worker < 0:
            found.append(r)
            if len(found) == n:
                break
    return found
