"""Calibration knobs of the roofline latency model."""

from __future__ import annotations

from dataclasses import dataclass

GRAMMAR_MASK_S = 35e-6  # see LatencyConfig.grammar_mask_s


@dataclass(frozen=True, slots=True)
class LatencyConfig:
    """Efficiency factors and fixed costs that turn datasheet peaks into step times.

    Defaults are datasheet-era estimates for H100-class GPUs; a GPU with measured figures gets
    its own fitted set (`fluidpd.latency.calibration`):
    - mfu 0.5: dense GEMM fraction of peak (the DistServe seed's 50 % MFU).
    - attn_efficiency 0.4: attention kernels (FlashAttention-2/3 with causal masking and
      short, ragged sequences) reach less of peak than large GEMMs.
    - bw_efficiency 0.8: achievable fraction of HBM bandwidth when streaming weights.
    - kv_bw_efficiency 0.8: the same for attention's KV reads and writes (paged attention kernels
      may reach less of it than weight streaming does).
    - step_overhead_s 2 ms: per-iteration scheduling, sampling and kernel-launch time of a GPU
      engine (the FluidPD seed puts tail launch latency near 2 ms on H100).
    - tp_comm_efficiency 0.8: NCCL bus bandwidth as a fraction of unidirectional NVLink.
    - allreduce_latency_s 8 us: fixed cost of one small all-reduce on NVLink at tp 2, growing with
      log2(tp) (tree and NVSwitch all-reduces take log2(tp) steps).
    - p2p_latency_s 10 us: fixed cost of one pipeline-stage activation send.
    - alltoall_latency_s 10 us: fixed cost of one expert-parallel dispatch or combine on NVLink
      (an estimate like the all-reduce's: every rank sends to every other at once, one step).
    - pp_stage_loss 0.02: time lost per extra pipeline stage (imbalance, per-stage launches), as a
      fraction of the step (the DistServe seed's worked example: 2% per extra stage).
    - grammar_mask_s 35 us: a structured-output row's token mask, filled on the host and applied to its
      logits before the pick (llguidance on a 49,152-token vocabulary here: 14 us to fill, about 20 to
      apply; benchmarks/engine/structured_outputs_choice.py), serial with the step.
    - overlap 1.0: how much of a kernel group's shorter bound (compute or memory) hides under the
      longer one: 1 = perfectly (time = max), 0 = not at all (time = sum). Below 1, a prefill
      chunk in a decode step costs time even while the step is memory-bound (interference).
    """

    mfu: float = 0.5
    attn_efficiency: float = 0.4
    bw_efficiency: float = 0.8
    kv_bw_efficiency: float = 0.8
    step_overhead_s: float = 2e-3
    tp_comm_efficiency: float = 0.8
    allreduce_latency_s: float = 8e-6
    p2p_latency_s: float = 10e-6
    alltoall_latency_s: float = 10e-6
    overlap: float = 1.0
    pp_stage_loss: float = 0.02
    grammar_mask_s: float = GRAMMAR_MASK_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.pp_stage_loss < 1.0:
            raise ValueError(f"pp_stage_loss must be in [0, 1), got {self.pp_stage_loss}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap}")
        for f in ("mfu", "attn_efficiency", "bw_efficiency", "kv_bw_efficiency", "tp_comm_efficiency"):
            v = getattr(self, f)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{f} must be in (0, 1], got {v}")
        for f in (
            "step_overhead_s",
            "allreduce_latency_s",
            "p2p_latency_s",
            "alltoall_latency_s",
            "grammar_mask_s",
        ):
            v = getattr(self, f)
            if not v >= 0.0:
                raise ValueError(f"{f} must be >= 0, got {v}")
