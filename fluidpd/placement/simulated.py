"""Phase goodput by simulation, as DistServe's search scores a configuration: resample the fitted
workload at a rate, simulate, binary-search the highest rate whose attainment meets the target.

prefill: one prefill instance serving one-token requests (TTFT attainment); decode: one decoding
instance whose requests arrive prefilled (TPOT attainment); unit: Algorithm 2's prefill and decode
segments simulated together under static-pd (joint attainment, KV over NVLink). Every rate of one
search resamples with the same seed (common random numbers), so attainment falls with the rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fluidpd.core.metrics import Slo
from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.profiled import latency_model
from fluidpd.latency.roofline import RooflineModel
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.deployment import Deployment, Instances, simulate_deployment
from fluidpd.sim.goodput import goodput_rate_scale
from fluidpd.specs.hardware import HardwareSpec
from fluidpd.specs.models import ModelSpec
from fluidpd.workload.fitted import WorkloadModel


@dataclass(eq=False)
class SimulatedGoodput:
    """GoodputEstimator backed by the simulator and the (calibrated) latency model."""

    model: ModelSpec
    hw: HardwareSpec
    slo: Slo
    workload: WorkloadModel
    attainment: float = 0.9
    requests: int = 400
    seed: int = 0
    latency: LatencyConfig | None = None
    gpus_per_node: int = 8
    iters: int = 5
    sample_s: float = 20.0  # seconds of arrivals a sample spans, at least, at the search's starting rate
    one_lane: bool = True  # decode and units: simulate one lane carrying 1/pp of the load (pp x cheaper)
    sim: SimConfig = field(default_factory=SimConfig)
    sizes: dict = field(default_factory=dict, repr=False)  # requests per sample, by searched configuration
    _cache: dict = field(default_factory=dict, repr=False)

    # --- feasibility --------------------------------------------------------------------------
    def valid(self, tp: int, pp: int) -> bool:
        """Layers split evenly over stages, heads over ranks, weights fit, and KV room for the
        workload's p99 request."""
        m = self.model
        if m.n_layers % pp or m.n_heads % tp or (m.n_kv_heads % tp and tp % m.n_kv_heads):
            return False
        if m.weight_bytes / (tp * pp) >= self.hw.mem_bytes:
            return False
        longest = float(np.percentile(self.workload.prompt_len + self.workload.output_len, 99))
        try:
            tokens = self._roofline(tp, pp).capacity_kv_tokens(1.0 - self.sim.gpu_memory_utilization)
        except ValueError:
            return False
        return tokens >= longest

    # --- goodputs -----------------------------------------------------------------------------
    def prefill(self, tp: int, pp: int) -> float:
        if self._unloaded(tp, pp, ttft=True) < self.attainment:
            return 0.0
        dep = Deployment((Instances(Role.PREFILL, tp, pp),), self.gpus_per_node)
        start = pp / self._roofline(tp, pp).prefill_time(int(self.workload.prompt_len.mean()))
        return self._goodput(("prefill", tp, pp), "prefill-only", dep, start, output_len=1)

    def decode(self, tp: int, pp: int) -> float:
        if self._unloaded(tp, pp, tpot=True) < self.attainment:
            return 0.0
        # one lane carries 1/pp of the instance's load (the lanes of a decoding instance are alike)
        dep = Deployment((Instances(Role.DECODE, tp, pp),), self.gpus_per_node, one_lane=self.one_lane)
        lanes = pp if self.one_lane else 1
        batch = self._batch(tp, pp)
        start = batch / self._roofline(tp, pp).decode_time(batch, self._context()) / self._mean_output()
        # enough requests to fill the lanes several times over: a sample that fits at once would
        # meet any TPOT however fast it arrives
        n = max(self.requests, 3 * batch * (pp // lanes))
        return lanes * self._goodput(("decode", tp, pp), "decode-only", dep, start * pp / lanes, requests=n)

    def unit(
        self, pp: int, prefill_tp: int, decode_tp: int, prefill_segments: int = 1, decode_segments: int = 1
    ) -> float:
        a, b = prefill_segments, decode_segments
        if min(self._unloaded(prefill_tp, pp, ttft=True), self._unloaded(decode_tp, pp, tpot=True)) < self.attainment:
            return 0.0
        groups = (Instances(Role.PREFILL, prefill_tp, pp, a), Instances(Role.DECODE, decode_tp, pp, b))
        dep = Deployment(groups, self.gpus_per_node, unit=(a, b), one_lane=self.one_lane)  # one stage-lane slice
        lanes = pp if self.one_lane else 1
        start = min(a * self.prefill(prefill_tp, pp), b * self.decode(decode_tp, pp)) / lanes or 1.0
        n = max(self.requests, 3 * b * self._batch(decode_tp, pp) * (pp // lanes))
        key = ("unit", pp, prefill_tp, decode_tp, a, b)
        return lanes * self._goodput(key, "static-pd", dep, start, requests=n)

    def attainment_at(
        self,
        policy: str,
        deployment: Deployment,
        rate: float,
        output_len: int | None = None,
        requests: int | None = None,
    ) -> float:
        trace = self.workload.sample(rate, requests or self.requests, self.seed, output_len)
        result = simulate_deployment(
            trace, policy, deployment, self.model, self.hw, self.slo, sim=self.sim, latency=self.latency
        )
        return result.summary["attainment"]

    # --- helpers ------------------------------------------------------------------------------
    def _unloaded(self, tp: int, pp: int, ttft: bool = False, tpot: bool = False) -> float:
        """Attainment with no load at all (each request alone: its prefill, or a batch-1 decode at
        its mid context). Load only adds to it, so below the target no rate can meet it: the search
        skips simulating a configuration whose latency alone misses the SLO."""
        key = ("unloaded", tp, pp, ttft, tpot)
        if key not in self._cache:
            r, wl = self._roofline(tp, pp), self.workload
            n = min(len(wl.prompt_len), self.requests)
            idx = np.random.default_rng(self.seed).choice(len(wl.prompt_len), n, replace=False)
            ok = 0
            for p, o in zip(wl.prompt_len[idx].tolist(), wl.output_len[idx].tolist()):
                good = not ttft or r.prefill_time(p) <= self.slo.ttft_s
                good = good and (not tpot or r.decode_time(1, p + o // 2) <= self.slo.tbt_s)
                ok += good
            self._cache[key] = ok / n
        return self._cache[key]

    def _goodput(
        self,
        key: tuple,
        policy: str,
        dep: Deployment,
        start: float,
        output_len: int | None = None,
        requests: int | None = None,
    ) -> float:
        if key not in self._cache:
            # a sample spans at least sample_s at the starting rate: a short one ends before queues form
            n = self.sizes[key] = max(requests or self.requests, int(start * self.sample_s))
            self._cache[key] = goodput_rate_scale(
                lambda r: self.attainment_at(policy, dep, r, output_len, n),
                self.attainment,
                start,
                iters=self.iters,
            )
        return self._cache[key]

    def _mean_output(self) -> float:
        return float(self.workload.output_len.mean())

    def _context(self) -> int:
        return int(self.workload.prompt_len.mean() + self.workload.output_len.mean() / 2)

    def _batch(self, tp: int, pp: int) -> int:
        """Requests one lane decodes at most: what its KV holds, or what keeps a step within TPOT."""
        r, ctx = self._roofline(tp, pp), self._context()
        kv = r.capacity_kv_tokens(1.0 - self.sim.gpu_memory_utilization) // pp // max(ctx, 1)
        b = 1
        while b < kv and r.decode_time(2 * b, ctx) <= self.slo.tbt_s:
            b *= 2
        return max(1, min(b, kv))

    def _roofline(self, tp: int, pp: int) -> RooflineModel:
        key = ("roofline", tp, pp)
        if key not in self._cache:
            self._cache[key] = latency_model(self.model, self.hw, tp=tp, pp=pp, config=self.latency)
        return self._cache[key]
