"""What the placement algorithms ask of a goodput estimator (simulator-backed or closed-form)."""

from __future__ import annotations

from typing import Protocol


class GoodputEstimator(Protocol):
    """Goodput (req/s at the attainment target) of one instance or unit, and feasibility."""

    def valid(self, tp: int, pp: int) -> bool:
        """Whether a tp x pp instance can hold the model (memory, layer and head divisibility)."""

    def prefill(self, tp: int, pp: int) -> float:
        """Highest rate one prefill instance serves with TTFT attainment >= the target."""

    def decode(self, tp: int, pp: int) -> float:
        """Highest rate one decoding instance serves with TPOT attainment >= the target."""

    def unit(self, pp: int, prefill_tp: int, decode_tp: int, prefill_segments: int, decode_segments: int) -> float:
        """Highest rate an Algorithm 2 unit serves: per pipeline stage, `prefill_segments` prefill and
        `decode_segments` decode segments on one node (joint attainment)."""
