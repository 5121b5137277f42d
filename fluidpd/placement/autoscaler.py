"""`autoscaler`: a planner in the manner of Dynamo's SLA planner, on a fixed cluster.

Every `interval_s` it reads the last interval's request rate, mean input length (ISL) and mean
output length (OSL), predicts the next interval as the last one (Dynamo's constant predictor), and
sizes each phase from profiled per-worker capacity: prefill workers = rate x ISL / prefill tokens/s
of one worker at its saturating batch (DistServe's L_m); decode workers = rate x OSL / decode
tokens/s of one worker at the largest batch whose step fits `itl_share` of the TBT SLO within its
KV. The cluster's split follows the ratio of the two demands; each change restarts the workers it
moves (the restart model's downtime), as a redeploy of engines does. Dynamo's correction factors
(observed over expected TTFT and ITL) are left out: in simulation the profile is the latency model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.knobs import knob
from fluidpd.placement.replan import ReplanConfig, Replanner
from fluidpd.sim.run import prefill_saturation_tokens
from fluidpd.workload.profiler import ProfilerConfig


@dataclass(slots=True)
class AutoscalerConfig:
    """Interval and ITL target of the SLA planner."""

    interval_s: float = knob(60.0, "autoscaler: seconds between adjustments (its observation window too)")
    itl_share: float = knob(0.9, "autoscaler: share of the TBT SLO a decode step may take")

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and 0 < self.itl_share <= 1):
            raise ValueError("interval_s must be > 0 and itl_share in (0, 1]")


class SlaPlanner(Replanner):
    """Resizes the split every interval from the observed load and profiled capacity."""

    def __init__(self, setup, config: AutoscalerConfig | None = None, restart_s: float = 0.0, history=None):
        self.autoscaler = config or AutoscalerConfig()
        window = ProfilerConfig(window_s=self.autoscaler.interval_s, persist_s=0.0)
        super().__init__(setup, ReplanConfig(check_s=self.autoscaler.interval_s, profiler=window), restart_s, history)
        r = setup.roofline()
        lm = prefill_saturation_tokens(r)
        self.prefill_tok_s = lm / r.prefill_time(lm)
        self._roofline = r
        self._kv_tokens = setup.kv_blocks(r) * setup.sim.block_size

    def decode_tok_s(self, context: int) -> float:
        """One decode worker's tokens/s at the largest batch that meets the ITL target and fits its KV."""
        target = self.autoscaler.itl_share * self.setup.slo.tbt_s
        b, fit = 1, max(1, self._kv_tokens // max(context, 1))
        while b * 2 <= fit and self._roofline.decode_time(b * 2, context) <= target:
            b *= 2
        return b / self._roofline.decode_time(b, context)

    def plan(self, now: float) -> int | None:
        s = self.profiler.stats(now)
        if s is None:
            return None
        n = self.setup.sim.n_workers
        prefill = s.rate * s.prompt_mean / self.prefill_tok_s
        decode = s.rate * s.output_mean / self.decode_tok_s(int(s.prompt_mean + s.output_mean / 2))
        if prefill + decode <= 0:
            return None
        k = min(n - 1, max(1, round(n * prefill / (prefill + decode))))
        return None if k == self._target() else k
