"""The DistServe seed's worked example: its closed-form estimator and constants (Section V).

Prefill is an M/D/1 queue generalised to PP x TP (execution D / TP^0.678, stage time / PP, 2% per
extra stage); decode grows its batch until memory or the TPOT SLO stops it, each step the larger
of its memory and compute time. A 70B BF16 model (GQA) on H100s, 512 in / 256 out, TTFT 0.25 s,
TPOT 50 ms, N = 2 nodes of M = 8 GPUs, R = 200 req/s. Its printed result: Algorithm 1, 8 prefill
instances (PP 5, TP 1) at 27.3 req/s and 4 decode instances (PP 2, TP 2) at 50.5 req/s, 56 GPUs;
Algorithm 2, 7 units (PP 2, prefill TP 4, decode TP 2) at 32.2 req/s, 84 GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fluidpd.placement.algorithms import algorithm1, algorithm2
from fluidpd.placement.result import Placement, from_algorithm1, from_algorithm2

GB = 1e9


@dataclass(frozen=True, slots=True)
class SeedEstimator:
    """The seed's toy simulator, constants as printed."""

    model_bytes: float = 140 * GB
    gpu_bytes: float = 80 * GB
    hbm_bw: float = 3.35e12
    s_kv: float = 327_680  # KV bytes per token
    d_prefill: float = 0.145  # notional single-GPU prefill of 512 tokens at 50% MFU
    peak_eff: float = 989e12 * 0.5
    n_layers: int = 80
    n_heads: int = 64
    in_len: int = 512
    out_len: int = 256
    ttft_slo: float = 0.25
    tpot_slo: float = 0.05
    eta: float = 0.678  # K(tp) = tp ** eta
    pp_overhead: float = 0.02

    def valid(self, tp: int, pp: int) -> bool:
        return self.n_layers % pp == 0 and self.n_heads % tp == 0 and self.model_bytes / (pp * tp) < self.gpu_bytes

    def prefill(self, tp: int, pp: int) -> float:
        ds = self.d_prefill / tp**self.eta * (1 + self.pp_overhead * (pp - 1))
        dm = ds / pp

        def ttft(r: float) -> float:
            return math.inf if r * dm >= 1 else ds + r * dm**2 / (2 * (1 - r * dm))

        return _max_rate(lambda r: ttft(r) <= self.ttft_slo)

    def decode(self, tp: int, pp: int) -> float:
        kv_budget = pp * tp * self.gpu_bytes - self.model_bytes
        ctx = self.in_len + self.out_len
        best = 0.0
        for b in range(1, 4097):
            if pp * b * ctx * self.s_kv > kv_budget:
                break
            mem = (self.model_bytes + b * ctx * self.s_kv) / (self.hbm_bw * tp**0.9)
            compute = 2 * 70e9 * b / (self.peak_eff * tp**0.9)
            tpot = max(mem, compute) * (1 + self.pp_overhead * (pp - 1))
            if tpot > self.tpot_slo:
                break
            best = pp * b / tpot / self.out_len
        return best

    def unit(
        self, pp: int, prefill_tp: int, decode_tp: int, prefill_segments: int = 1, decode_segments: int = 1
    ) -> float:
        return min(prefill_segments * self.prefill(prefill_tp, pp), decode_segments * self.decode(decode_tp, pp))


def _max_rate(meets_slo, hi: float = 1_000.0, iters: int = 60) -> float:
    lo = 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets_slo(mid) else (lo, mid)
    return lo


SEED_NODES, SEED_GPUS_PER_NODE, SEED_RATE = 2, 8, 200.0


def seed_example(max_segments: int = 4) -> dict[str, Placement]:
    """The seed's worked example: Algorithm 1, Algorithm 2 (1:1), and Algorithm 2 with up to
    `max_segments` prefill and decode segments per node (beyond the paper)."""
    est = SeedEstimator()
    n, m, r = SEED_NODES, SEED_GPUS_PER_NODE, SEED_RATE
    ratios = [(a, b) for a in range(1, max_segments + 1) for b in range(1, max_segments + 1)]
    out = {
        "algorithm1": from_algorithm1(algorithm1(est, n, m, r), r),
        "algorithm2": from_algorithm2(algorithm2(est, n, m, r), est, r),
        "algorithm2_ratios": from_algorithm2(algorithm2(est, n, m, r, ratios), est, r),
    }
    for p in out.values():
        p.cluster_gpus = n * m
    out["algorithm1"].reason = "high node-affinity"
    out["algorithm2"].reason = "low node-affinity, 1:1 segments (the paper)"
    out["algorithm2_ratios"].reason = f"low node-affinity, up to {max_segments}:{max_segments} segments per node"
    return out
