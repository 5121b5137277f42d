"""FluidToken: decode workers with slack run bounded prefill chunks inside the TBT budget.

slack = SLO_TBT - T_iter(B) - delta_guard. T_iter is an EWMA of the worker's measured decode-only
steps; delta_guard is the seed's rule, 1.5 x the p99.9 of how far decode-only steps ran over T_iter
(step-time jitter; JitterTracker). The chunk cost model's own error is not jitter: it is corrected
online per worker by a scale (EWMA of the measured chunk part of mixed steps over EWMA of the
modelled one), so a worker slower than the fit (e.g. sharing its CPU) takes smaller chunks after
one step. Only chunks modelled dearer than the guard band feed it: the measured part of a cheaper
one is mostly jitter, and a scale learned from jitter mis-sizes the next, larger chunk. What the
planner still gets wrong is priced from its measured distribution: the slack never lets a step,
times the p99 of measured / estimated over the worker's recent mixed steps (OverrunTracker), pass
SLO_TBT; until some are measured, chunks cost `overrun_prior` x their model.
The chunk runs fused into the decode step's forward pass, so its cost is marginal: with g the
fitted time of n tokens fused into a one-request decode step (flat while the dense layers stay
memory-bound, then compute), c prompt tokens after `prior` tokens of their prompt, in a step with
B decodes, cost g(B + c) - g(B) (the dense layers see B + c tokens; the decodes use up the free
compute first) plus c x prior x the attention time of one query-key pair (the earlier tokens are
attended to, not recomputed). C_chunk is the largest c that fits the slack. A borrowed
request's KV stays on the decode worker, which then decodes it: borrowing takes the KV the
request's hand-off would take, only earlier, so each decode worker keeps free its share of the KV
the prefill pool holds or is computing (what hand-offs will pull), at most `kv_headroom` of its KV
(past that, a large prefill pool would shut borrowing off just when prompts queue). A
prompt longer than one chunk runs as chunks over successive iterations, and a prompt of at least
`split_min_tokens` spreads over several decode workers with slack at once: piece j attends to the
pieces before it (context-parallel, its cost counts that prior), and when all pieces are done the
first token is out (released with the first decode step when the world holds first tokens) and
their KV is gathered to the worker that decodes the request.
"""

from __future__ import annotations

from collections.abc import Callable

from fluidpd.core.piece import PrefillPiece
from fluidpd.core.polynomial import Polynomial
from fluidpd.core.request import Request
from fluidpd.policy.borrowing import Borrowing
from fluidpd.policy.fluidtoken_config import FluidTokenConfig
from fluidpd.policy.jitter import JitterTracker, OverrunTracker
from fluidpd.policy.stepplan import Admission, chunks_within, on_time_first
from fluidpd.policy.view import StepPlan, WorkerView

EWMA = 0.2
SCALE_GAIN, MIN_SCALE, MAX_SCALE = 0.2, 0.25, 20.0
MAX_BATCH_CHECKED = 1024  # decodes in a step up to which `has_slack` may skip the chunk search


class FluidToken(Borrowing):
    """Per-worker slack, chunk sizing, borrowing and the step plan of a borrowing decode worker."""

    def __init__(
        self,
        chunk_time: Polynomial,
        slo_tbt_s: float,
        config: FluidTokenConfig | None = None,
        decode_ref_s: float | None = None,
        attn_pair_s: float | None = None,
    ):
        self.chunk_time = chunk_time
        self._g: dict[int, float] = {}  # chunk_time by token count (memoized: the searches repeat them)
        # one query-key pair of attention; without a measured figure, the fit's quadratic term
        # (a chunk's causal self-attention: c^2 / 2 pairs) gives it
        quad = chunk_time.coeffs[-3] if len(chunk_time.coeffs) >= 3 else 0.0
        self.attn_pair_s = attn_pair_s if attn_pair_s is not None else max(0.0, 2.0 * quad)
        self.slo_tbt_s = slo_tbt_s
        self.config = config or FluidTokenConfig()
        self.jitter: dict[int, JitterTracker] = {}
        self.overrun: dict[int, OverrunTracker] = {}
        self.t_iter_s: dict[int, float] = {}
        self.scale: dict[int, float] = {}  # measured / modelled chunk time, per worker (online calibration)
        self._chunk_ewma: dict[int, tuple[float, float]] = {}  # (measured, modelled) chunk time EWMAs
        self.decode_ref_s = decode_ref_s  # the decode step time the cost model was fitted next to
        self._observed: dict[int, int] = {}  # per worker: decode steps observed (what changes its trackers)
        self.init_borrowing()
        self._g_rises_upto = self._rising_prefix(self.config.max_chunk + MAX_BATCH_CHECKED)

    def _rising_prefix(self, limit: int) -> int:
        """The largest n <= `limit` with g non-decreasing over 0..n, as evaluated."""
        g = self._chunk_time
        for n in range(limit):
            if g(n + 1) < g(n):
                return n
        return limit

    def tracker(self, wid: int) -> JitterTracker:
        t = self.jitter.get(wid)
        if t is None:
            c = self.config
            default = c.guard_default_s if c.guard_default_s is not None else 0.1 * self.slo_tbt_s
            t = self.jitter[wid] = JitterTracker(factor=c.guard_factor, default_s=default)
        return t

    def overrun_of(self, wid: int) -> OverrunTracker:
        t = self.overrun.get(wid)
        if t is None:
            c = self.config
            t = self.overrun[wid] = OverrunTracker(quantile=c.overrun_quantile)
        return t

    def observe(self, w: WorkerView, duration_s: float, plan: StepPlan) -> None:
        """A step of `w` with decodes took `duration_s`. Decode-only steps update T_iter (the first
        step, mixed or not, sets it: a worker whose steps all carry chunks has one too) and their
        excess over it the jitter record behind delta_guard; mixed steps their ratio to the
        planner's estimate (the overrun quantile) and the cost scale."""
        if not plan.decode:
            return
        self._observed[w.id] = self._observed.get(w.id, 0) + 1
        prev = self.t_iter_s.get(w.id)
        if prev is None:  # the first measure: a decode-only step, or a mixed one less its modelled chunks
            self.t_iter_s[w.id] = max(0.0, duration_s - self.chunks_cost(w.num_decoding, plan, self.cost_scale(w)))
            return
        scale = self.cost_scale(w)
        est = self.chunks_cost(w.num_decoding, plan, scale)
        if not plan.chunks:
            self.tracker(w.id).observe(duration_s - prev)
            self.t_iter_s[w.id] = prev + EWMA * (duration_s - prev)
            return
        self.overrun_of(w.id).observe(duration_s, prev + est)
        if est / scale > self.tracker(w.id).guard_s:
            measured, modelled = self._chunk_ewma.get(w.id, (0.0, 0.0))
            measured += SCALE_GAIN * (duration_s - prev - measured)
            modelled += SCALE_GAIN * (est / scale - modelled)
            self._chunk_ewma[w.id] = (measured, modelled)
            self.scale[w.id] = min(MAX_SCALE, max(MIN_SCALE, measured / modelled))

    def state_key(self, w: WorkerView) -> tuple:
        """Everything `w`'s slack, chunk size and borrowing rate are computed from, besides the
        constants: its batch, its measured step times (T_iter, scale, jitter and overrun trackers:
        changed only by `observe`, which counts) and the world's step EWMA. Equal keys, equal
        values: a cycle recomputes them only for the workers that changed since the last one."""
        wid = w.id
        return (
            w.num_decoding,
            w.step_time_ewma_s,
            self.t_iter_s.get(wid),
            self.scale.get(wid),
            self._observed.get(wid),
        )

    def t_iter(self, w: WorkerView) -> float:
        """T_iter(B): the decode part of recent steps (0 with nothing to decode)."""
        if not w.num_decoding:
            return 0.0
        return self.t_iter_s.get(w.id, w.step_time_ewma_s)

    def slack(self, w: WorkerView, forecast: bool = False) -> float:
        """What a step's chunks may take: the seed's SLO_TBT - T_iter - delta_guard, and no more than
        keeps the whole step within SLO_TBT at the measured overrun quantile of this worker's mixed
        steps, though never less than the guard band (so chunks stay measured and the quantile stays
        current). Before `min_samples` are measured, a step's chunks are priced at `overrun_prior` x
        their model (a `forecast` of borrowing takes them at the model)."""
        t, slo, guard = self.t_iter(w), self.slo_tbt_s, self.tracker(w.id).guard_s
        seed, over = slo - t - guard, self.overrun_of(w.id)
        if not over.ready:
            return seed if forecast or seed <= 0 else seed / self.config.overrun_prior
        return min(seed, max(slo / over.factor - t, guard))

    def cost_scale(self, w: WorkerView) -> float:
        """How much slower than the fitted model this worker's chunks have run; before any mixed
        step, how much slower its decode steps run than the reference the model was fitted with."""
        s = self.scale.get(w.id)
        if s is not None:
            return s
        t = self.t_iter_s.get(w.id)
        return max(1.0, t / self.decode_ref_s) if t and self.decode_ref_s else 1.0

    def _chunk_time(self, n: int) -> float:
        """g(n), memoized (n is a token count: at most max_chunk plus a batch)."""
        t = self._g.get(n)
        if t is None:
            t = self._g[n] = self.chunk_time(n)
        return t

    def _cost(self, batch: int, tokens: int, pairs: int, scale: float) -> float:
        """`tokens` prompt tokens attending to `pairs` earlier ones, fused into a B-decode step."""
        if not tokens:
            return 0.0
        g = self._chunk_time
        return scale * (g(batch + tokens) - g(batch) + self.attn_pair_s * pairs)

    def chunk_cost(self, batch: int, prior: int, c: int, scale: float = 1.0) -> float:
        """Marginal time of c prompt tokens (after `prior` of them) fused into a B-decode step."""
        return self._cost(batch, c, c * prior, scale)

    def chunks_cost(self, batch: int, plan: StepPlan, scale: float = 1.0) -> float:
        tokens = sum(c for _, c in plan.chunks)
        return self._cost(batch, tokens, sum(c * req.kv_prior for req, c in plan.chunks), scale)

    def chunk_tokens(self, w: WorkerView, prior: int = 0, forecast: bool = False) -> int:
        """C_chunk: the largest c with chunk_cost(B, prior, c) <= slack (0 if below min_chunk)."""
        budget = self.slack(w, forecast) / self.cost_scale(w)
        if budget <= 0:
            return 0
        lo = _largest(self._fits(w.num_decoding, prior, budget), self.config.max_chunk)
        return lo if lo >= self.config.min_chunk else 0

    def _fits(self, b: int, prior: int, budget: float):
        """c -> chunk_cost(b, prior, c) <= budget, with g(b) evaluated once."""
        g, g_b, pair_s = self._chunk_time, self._chunk_time(b), self.attn_pair_s
        return lambda c: g(b + c) - g_b + pair_s * (c * prior) <= budget

    def has_slack(self, w: WorkerView, slack_s: float) -> bool:
        """chunk_tokens(w) > 0, given `slack_s` = slack(w). Where g is non-decreasing over the search,
        so is a chunk's cost in c: some chunk fits iff the smallest one worth borrowing does (one
        evaluation, no search)."""
        b, c = w.num_decoding, self.config
        if b + c.max_chunk > self._g_rises_upto:
            return self.chunk_tokens(w) > 0
        budget = slack_s / self.cost_scale(w)
        return budget > 0 and self._fits(b, 0, budget)(c.min_chunk)

    def plan(self, w: WorkerView, max_num_seqs: int, late: Callable | None = None) -> StepPlan:
        """A decode worker's step: every decode, plus prefill chunks of its queue (FCFS) whose
        marginal cost, each priced at its own prior, fits the slack."""
        plan = StepPlan([], w.num_decoding > 0)
        if w.queue:
            budget = self.slack(w) / self.cost_scale(w)
            plan.chunks = self._fill(w, budget, max_num_seqs, late)
            if not plan.chunks and not plan.decode:  # nothing decodes yet, but a hand-off may land any
                # moment: keep the step within what a decode step's slack would allow (a started
                # prompt first: an idle worker that plans nothing is never stepped again)
                plan.chunks = chunks_within(w, self.config.min_chunk, max_num_seqs, late)
        return plan

    def _fill(self, w: WorkerView, budget: float, max_num_seqs: int, late: Callable | None = None) -> list:
        """Chunks from the head of `w`'s queue while their summed marginal cost fits `budget`: each
        the largest that fits after the chunks before it (an unstarted request starts after its
        expected cached prefix); none below min_chunk but a prompt's last."""
        room = Admission.of(w, max_num_seqs)
        g, pair_s, c_max = self._chunk_time, self.attn_pair_s, self.config.max_chunk
        b, pairs = w.num_decoding, 0.0  # tokens in the step so far; the planned chunks' attention cost
        chunks: list[tuple[Request | PrefillPiece, int]] = []
        for req in on_time_first(w.queue, late, w.num_prefilling):
            prior = req.kv_prior or req.queued_hit
            left = budget - (g(b) - g(w.num_decoding)) - pairs
            todo = req.prefill_remaining - (0 if req.prefilled else req.queued_hit)
            lo = _largest(self._fits(b, prior, left), max(1, min(c_max, todo)))
            if lo < self.config.min_chunk and lo < todo:
                break
            if not room.admit(req.prefilled, req.prefill_target, w.block_size, req):
                break
            chunks.append((req, lo))
            b += lo
            pairs += pair_s * lo * prior
            if lo < todo:
                break
        return chunks

    def estimate(self, w: WorkerView, plan: StepPlan) -> float:
        """The planner's own estimate of a step's time (checked against SLO_TBT in tests)."""
        return (self.t_iter(w) if plan.decode else 0.0) + self.chunks_cost(w.num_decoding, plan, self.cost_scale(w))


def _largest(fits, hi: int) -> int:
    """The largest c in [0, hi] with fits(c), for fits monotone (true up to some c); 0 if none."""
    if fits(hi):
        return hi
    lo = 0  # invariant: fits(lo) or lo == 0; not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
