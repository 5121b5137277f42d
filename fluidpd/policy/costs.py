"""What FluidPD prices its decisions with, fitted by the world that runs it."""

from __future__ import annotations

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
