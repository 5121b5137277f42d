"""Admission control: shed a request on the queue in front of it, never on its own length.

A new prompt's predicted TTFT on a worker that would prefill it has two parts, at the measured
prefill speed and batched as that worker batches prompts:
  own    its uncached prefill on that worker, idle: less what the worker's prefix cache holds, or
         what a prompt queued ahead of it there shares (cached by the time it starts);
  queue  what the prompts queued there (each less what is cached or shared ahead of it) and the
         parked ones add in front of it.
The best worker is the one with the least sum. A request is refused (429) only when its queue is
over its budget: what still lets it meet `admit_ttft_factor` x SLO_TTFT, and never less than
QUEUE_FLOOR of that limit. An idle cluster therefore admits every request that fits the context;
one that misses the SLO on its own is served best effort (an SLO miss in the metrics), and is shed
only when the queue in front of it is long too. Retry-After is the time the queue needs to drain to
the budget. `admit_max_prefill_s`, the operator's hard limit, refuses (400) a request whose own
prefill is predicted over it, whatever the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile

from fluidpd.core.request import Request
from fluidpd.policy.costs import batched_prefill_time
from fluidpd.policy.telemetry import prompt_pool
from fluidpd.runtime.api import LimitExceeded, Overloaded

QUEUE_FLOOR = 0.5  # share of the TTFT limit any request may queue for, however long its own prefill
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class TtftEstimate:
    """A new prompt's predicted time to first token on the worker that would serve it first."""

    own_s: float  # its uncached prefill alone on that worker
    queue_s: float  # the wait the prompts queued in front of it add
    cached_tokens: int = 0  # prompt tokens that worker's cache holds

    @property
    def total_s(self) -> float:
        return self.own_s + self.queue_s


def estimate_ttft(cluster, req: Request, prefill_time, scale: float = 1.0) -> TtftEstimate:
    """`req`'s TtftEstimate over the routable workers that prefill prompts, in the part of the cluster
    the policy would place it in (`Policy.serving_view`: a pool of `fluidpd-pools`); inf when none is."""
    pol = cluster.policy
    pool = [w for w in prompt_pool(pol.serving_view(req, cluster)) if w.routable]
    if not pool:
        return TtftEstimate(float("inf"), float("inf"))
    parked = [r.prefill_remaining for r in cluster.parked]
    best: TtftEstimate | None = None
    for w in pool:
        ahead, seen = _queued_work(w)
        hit = _hit(w, req, seen)
        batching = pol.prefill_batching(w.role)
        mine = req.prompt_len - hit
        own = scale * batched_prefill_time([mine], prefill_time, *batching)
        total = scale * batched_prefill_time([*ahead, *parked, mine], prefill_time, *batching)
        est = TtftEstimate(own, max(0.0, total - own), hit)
        if best is None or est.total_s < best.total_s:
            best = est
    assert best is not None
    return best


def _queued_work(w) -> tuple[list[int], set[int]]:
    """The tokens each prompt queued on `w` has left to prefill, FCFS, and the blocks they hold: an
    unstarted prompt skips what the worker's cache or a prompt ahead of it holds (a burst of one
    system prompt computes it once)."""
    seen: set[int] = set()
    work = []
    for r in w.queue:
        hashes = getattr(r, "block_hashes", None)
        if not hashes:  # (a PrefillPiece, or no prefix caching)
            work.append(r.prefill_remaining)
            continue
        work.append(r.prefill_remaining - (_hit(w, r, seen) if r.prefilled == 0 else 0))
        seen.update(hashes)
    return work, seen


def _hit(w, req: Request, seen: set[int]) -> int:
    """Leading tokens of `req` held by `w`'s cache or by the prompts `seen` ahead of it (all but its
    last token at most: that one is always computed)."""
    cached = w.cached_tokens(req)
    limit = (req.prefill_target - 1) // w.block_size
    shared = sum(1 for _ in takewhile(seen.__contains__, req.block_hashes[:limit])) if seen else 0
    return max(cached, shared * w.block_size)


def queue_budget_s(own_s: float, limit_s: float) -> float:
    """How long a request whose own prefill takes `own_s` may queue before it is shed."""
    return max(limit_s - own_s, QUEUE_FLOOR * limit_s)


def admit(est: TtftEstimate, ttft_slo_s: float, factor: float, max_prefill_s: float = 0.0) -> None:
    """Raise LimitExceeded (over the hard limit) or Overloaded (its queue is over its budget)."""
    if max_prefill_s > 0 and max_prefill_s < est.own_s < float("inf"):
        raise LimitExceeded(
            f"the prompt's own prefill is predicted at {est.own_s:.1f} s on this server "
            f"({est.cached_tokens} of its tokens cached), over --admit-max-prefill-s {max_prefill_s:g}: "
            f"shorten the prompt",
            "prefill_limit_exceeded",
        )
    if factor <= 0:
        return
    limit = factor * ttft_slo_s
    budget = queue_budget_s(est.own_s, limit)
    if est.queue_s > budget:
        retry = est.queue_s - budget if est.queue_s != float("inf") else 5.0
        raise Overloaded(
            f"the queue in front of this request adds a predicted {est.queue_s:.1f} s to its "
            f"{est.own_s:.1f} s prefill, over the {budget:.1f} s it may wait (--admit-ttft-factor "
            f"{factor:g} x the {ttft_slo_s:g} s TTFT SLO)",
            min(MAX_RETRY_AFTER_S, retry),
        )
