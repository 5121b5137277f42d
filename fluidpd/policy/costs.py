"""What FluidPD prices its decisions with, fitted by the world that runs it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fluidpd.core.metrics import Slo
from fluidpd.core.polynomial import Polynomial


@dataclass(frozen=True, slots=True)
class CostModel:
    """The SLOs and the step-time curves a world fitted (latency model or engine profile)."""

    slo: Slo
    prefill_time: Polynomial  # f_P(s): prefill time of s tokens on a prefill worker
    chunk_time: Polynomial  # time of s tokens fused into a one-request decode step
    decode_ref_s: float | None = None  # the one-request decode step measured next to chunk_time (if any)
    attn_pair_s: float | None = None  # attention time of one query-key pair (None: from chunk_time's fit)
    kv_move_s_per_token: float = 0.0  # moving one token's KV between workers (hand-off link)
    kv_load_s_per_token: float = 0.0  # loading one token's KV from a host tier into the arena
    compute_slots: int = 0  # steps that run at full speed at once where workers share a host's cores (0: a device each)


def batched_prefill_time(
    lengths: Iterable[int], prefill_time: Callable[[float], float], batch_tokens: int, split: bool = False
) -> float:
    """f_P summed over the steps FCFS batching makes of prompts of `lengths`: whole prompts up to
    `batch_tokens` a step (a longer prompt runs alone: DistServe's L_m), or with `split` chunks that
    fill `batch_tokens` exactly (chunked prefill)."""
    if split:
        full, rest = divmod(sum(lengths), batch_tokens)
        return full * prefill_time(batch_tokens) + (prefill_time(rest) if rest else 0.0)
    total, batch = 0.0, 0
    for n in lengths:
        if batch and batch + n > batch_tokens:
            total, batch = total + prefill_time(batch), 0
        batch += n
        if batch >= batch_tokens:
            total, batch = total + prefill_time(batch), 0
    return total + (prefill_time(batch) if batch else 0.0)
