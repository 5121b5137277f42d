"""The shared step planner: which prefill chunks and decode tokens run together in one step.

Every world (simulator, runtime) asks these functions for the content of a worker's next
step, so a policy plans identically whether its steps are priced or executed. A simulator asks
once per simulated step: plans are built with positional arguments (StepPlan(chunks, decode)),
which Python calls markedly faster than keywords.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request
from fluidpd.policy.view import StepPlan, WorkerView, blocks_for, group_blocks


@dataclass(slots=True)
class Admission:
    """Free KV blocks and sequence slots left while a step is being planned."""

    free_blocks: int
    free_seqs: int

    @classmethod
    def of(cls, w: WorkerView, max_num_seqs: int) -> Admission:
        return cls(w.free_blocks, max_num_seqs - w.num_decoding - w.num_held - w.num_prefilling)

    def admit(self, prefilled: int, target: int, block_size: int, req=None) -> bool:
        """Reserve room for a request's whole prefill when it starts (`req`: a request group's
        blocks after its fork); True when it fits."""
        if prefilled > 0:
            return True
        if req is not None and getattr(req, "n", 1) > 1:
            need = group_blocks(req.prompt_len, req.live, req.prompt_len + req.generated, block_size)
        else:
            need = blocks_for(target, block_size)
        if need > self.free_blocks or self.free_seqs <= 0:
            return False
        self.free_blocks -= need
        self.free_seqs -= 1
        return True


def past_ttft(now: float, slo_ttft_s: float) -> Callable:
    """The late-last test: a request that arrived more than SLO_TTFT ago has missed it already."""
    deadline = now - slo_ttft_s
    return lambda r: r.arrival_s < deadline


def on_time_first(queue: Iterable, late: Callable | None, started: int | None = None) -> Iterable:
    """`queue` in order, but the started requests first (they hold their KV, which an unstarted one
    behind them may need: it cannot start before they finish) and the unstarted requests for which
    `late(r)` (e.g. `past_ttft`: they have missed their TTFT SLO already) last, FCFS among
    themselves. Under overload, FCFS spends every worker on requests that missed already and makes
    the next ones miss too; this serves the ones that can still make it, and the late ones as soon
    as there is room. `started` bounds the started requests in `queue` (a worker's num_prefilling):
    once that many are found the rest streams lazily, so a planner that stops early never walks a
    long queue."""
    unstarted: list = []
    behind: list = []
    rest = iter(queue)
    if started is None or started > 0:
        found = 0
        for r in rest:
            if r.prefilled:
                yield r
                found += 1
                if started is not None and found >= started:
                    break
            elif late is not None and late(r):
                behind.append(r)
            else:
                unstarted.append(r)
        else:
            yield from unstarted
            yield from behind
            return
    yield from unstarted
    if late is None:
        yield from rest
        return
    for r in rest:
        if late(r):
            behind.append(r)
        else:
            yield r
    yield from behind


def whole_prompts(
    w: WorkerView, max_tokens: int, max_num_seqs: int, max_chunk: int = 0, late: Callable | None = None
) -> list:
    """FCFS whole prompts up to `max_tokens` (DistServe's L_m batching; a longer prompt runs alone,
    and with `max_chunk` one longer than that takes a step per `max_chunk` tokens); with
    `late`, the late ones last (`on_time_first`)."""
    room = Admission.of(w, max_num_seqs)
    chunks: list[tuple[Request | PrefillPiece, int]] = []
    tokens = 0
    for req in on_time_first(w.queue, late, w.num_prefilling):
        need = req.prefill_remaining
        if max_chunk and need > max_chunk:
            need = max_chunk
        if chunks and tokens + need > max_tokens:
            break
        if not room.admit(req.prefilled, req.prefill_target, w.block_size, req):
            break
        chunks.append((req, need))
        tokens += need
        if tokens >= max_tokens:
            break
    return chunks


def chunks_within(w: WorkerView, budget: int, max_num_seqs: int, late: Callable | None = None) -> list:
    """FCFS prefill chunks filling `budget` tokens; the last one may be a partial prompt (with `late`,
    the late ones last: `on_time_first`)."""
    room = Admission.of(w, max_num_seqs)
    chunks = []
    for req in on_time_first(w.queue, late, w.num_prefilling):
        if budget <= 0:
            break
        if not room.admit(req.prefilled, req.prefill_target, w.block_size, req):
            break
        c = min(req.prefill_remaining, budget)
        chunks.append((req, c))
        budget -= c
    return chunks


def prefill_first(w: WorkerView, max_tokens: int, max_num_seqs: int, max_chunk: int = 0) -> StepPlan:
    """vLLM-style colocated step: waiting prompts first (alone), otherwise every decode."""
    chunks = whole_prompts(w, max_tokens, max_num_seqs, max_chunk)
    if chunks:
        return StepPlan(chunks)
    return StepPlan([], w.num_decoding > 0)


def decodes_then_chunks(w: WorkerView, budget: int, max_num_seqs: int, late: Callable | None = None) -> StepPlan:
    """Sarathi-Serve / vLLM v1 step: every decode, then prefill chunks in the remaining budget."""
    chunks = chunks_within(w, budget - w.num_decoding, max_num_seqs, late)
    return StepPlan(chunks, w.num_decoding > 0)


def prefill_only(
    w: WorkerView, max_tokens: int, max_num_seqs: int, max_chunk: int = 0, late: Callable | None = None
) -> StepPlan:
    """A prefill instance's step: an L_m-token batch of whole prompts."""
    return StepPlan(whole_prompts(w, max_tokens, max_num_seqs, max_chunk, late))


def decode_only(w: WorkerView) -> StepPlan:
    """A decode instance's step: one token for every decoding request."""
    return StepPlan([], w.num_decoding > 0)
