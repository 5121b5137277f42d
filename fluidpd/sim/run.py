"""Build a simulated cluster from names and knobs, run a trace through it, report the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from fluidpd.core.metrics import MetricsCollector, Slo, hit_rate
from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.fit import fit_attention_pair_time, fit_chunk_time, fit_prefill_time
from fluidpd.latency.profiled import latency_model
from fluidpd.latency.roofline import RooflineModel
from fluidpd.policy.base import Policy, PolicyConfig
from fluidpd.policy.costs import CostModel
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.view import Role
from fluidpd.sim.cluster import SimCluster
from fluidpd.sim.config import SimConfig
from fluidpd.sim.network import Network, NetworkConfig
from fluidpd.specs.hardware import HardwareSpec
from fluidpd.specs.models import ModelSpec
from fluidpd.workload.blockmap import oracle_hits
from fluidpd.workload.trace import Trace


@dataclass(slots=True)
class Setup:
    """Everything a simulation needs besides the trace and the policy name."""

    model: ModelSpec
    hardware: HardwareSpec
    slo: Slo
    sim: SimConfig = field(default_factory=SimConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    latency: LatencyConfig | None = None  # None: the GPU's calibration (fluidpd.latency.calibration)
    fluid: FluidConfig = field(default_factory=FluidConfig)

    def roofline(self) -> RooflineModel:
        """The step-time model: the host profile's fit where the hardware has one, else the roofline."""
        return latency_model(self.model, self.hardware, tp=self.sim.tp, config=self.latency, ep=self.sim.ep)

    def kv_blocks(self, roofline: RooflineModel) -> int:
        s = self.sim
        return roofline.kv_blocks(s.block_size, 1.0 - s.gpu_memory_utilization + s.scratch_fraction)

    def costs(self, roofline: RooflineModel) -> CostModel:
        """FluidPD's cost model: f_P and the fused-chunk time fitted on the latency model."""
        sim = roofline.sim_config(self.sim)  # the host profile's tier bandwidth and contention
        return CostModel(
            self.slo,
            fit_prefill_time(roofline),
            fit_chunk_time(roofline),
            attn_pair_s=fit_attention_pair_time(roofline),
            kv_move_s_per_token=self.model.kv_bytes_per_token / self.hardware.nvlink_bw_unidir,
            kv_load_s_per_token=self.model.kv_bytes_per_token / sim.kv_offloading_bw,
            compute_slots=sim.compute_slots(),
        )

    def network(self) -> Network:
        hw = self.hardware
        return Network(NetworkConfig(intra_node_bw=hw.nvlink_bw_unidir, inter_node_bw=hw.internode_bw))


@dataclass(slots=True)
class SimResult:
    """Summary row of one policy on one trace, with what plots need."""

    policy: str
    summary: dict
    cluster: SimCluster

    def row(self) -> dict:
        return {"policy": self.policy, **self.summary}


def prefill_saturation_tokens(roofline: RooflineModel, tolerance: float = 0.1, limit: int = 16384) -> int:
    """DistServe's L_m, profiled on the latency model: the shortest prompt whose per-token prefill
    time is within `tolerance` of the best per-token time (batching further gains nothing)."""
    lengths = range(16, limit + 1, 16)
    per_token = [roofline.prefill_time(n) / n for n in lengths]
    best = min(per_token)
    return next(n for n, t in zip(lengths, per_token) if t <= best * (1 + tolerance))


def simulate(
    trace: Trace,
    policy_name: str,
    setup: Setup,
    progress=None,
    *,
    keep_requests: bool = False,
    before_run=None,
    policy_cls: type[Policy] | None = None,
) -> SimResult:
    """Run `trace` through a simulated cluster under `policy_name`.

    keep_requests: keep the finished Request objects in `result.cluster.metrics.finished`;
    before_run(cluster): called once the cluster is built (e.g. to schedule admin actions);
    policy_cls: a variant of the registered policy (an ablation), built the same way.
    """
    roofline = setup.roofline()
    policy_cfg = setup.policy
    if not policy_cfg.prefill_batch_tokens:
        policy_cfg = replace(policy_cfg, prefill_batch_tokens=prefill_saturation_tokens(roofline))
    costs = setup.costs(roofline) if (policy_cls or POLICIES.get(policy_name)).needs_costs else None
    if policy_cls is None:
        policy = make_policy(policy_name, policy_cfg, setup.fluid, costs)
    else:
        policy = policy_cls.build(policy_cfg, setup.fluid, costs)
    metrics = MetricsCollector(setup.slo, finished=[] if keep_requests else None)
    cluster = SimCluster(
        trace,
        policy,
        roofline.step_time,
        setup.model.kv_bytes_per_token,
        setup.kv_blocks(roofline),
        setup.network(),
        metrics,
        roofline.sim_config(setup.sim),
        kv_bytes=setup.model.kv_bytes,
    )
    return run_cluster(cluster, policy_name, progress, before_run)


def run_cluster(cluster: SimCluster, policy_name: str, progress=None, before_run=None) -> SimResult:
    """Run a built cluster over its trace and summarise it."""
    if before_run:
        before_run(cluster)
    t0 = time.perf_counter()
    cluster.run(progress)
    wall = time.perf_counter() - t0
    summary = cluster.metrics.summary(len(cluster.trace))
    summary["sim_wall_s"] = wall
    summary["preemptions"] = sum(w.preemptions for w in cluster.workers)
    for kind in ("prefill", "decode", "mixed"):
        summary[f"busy_{kind}_s"] = sum(w.busy_s[kind] for w in cluster.workers)
    summary.update(prefix_cache_summary(cluster))
    summary["kv_bytes_moved"] = cluster.kv_bytes_moved
    summary["kv_bytes_per_request"] = summary["kv_bytes_moved"] / max(1, summary["completed"])
    summary["max_mean_load"] = prefill_load_imbalance(cluster)
    summary["routed_to_decode"] = cluster.policy.routed_to_decode
    summary.update(switch_rate(cluster))
    return SimResult(policy_name, summary, cluster)


def switch_rate(cluster: SimCluster) -> dict:
    """Role switches (FluidRole transitions or restarts, every one begun) and their rate per hour of
    the trace's span."""
    n = len(getattr(cluster.policy, "transitions", []))
    span = cluster.trace.duration_s
    return {"role_switches": n, "switches_per_hour": n * 3600.0 / span if span > 0 else 0.0}


def prefill_load_imbalance(cluster: SimCluster) -> float:
    """Max over mean of the prompt tokens each prefill (or colocated) worker computed (its first
    admissions' uncached tokens), roles as the run ended: how unevenly routing spread prefill work
    over the pool it routes to (a hot prefix piled onto its holder reads high)."""
    pool = [w for w in cluster.workers if w.role is not Role.DECODE] or cluster.workers
    load = [w.prefix_cache_queries - w.prefix_cache_hits for w in pool]
    return max(load) / (sum(load) / len(load)) if sum(load) > 0 else 1.0


def prefix_cache_summary(cluster: SimCluster) -> dict:
    """Token hit rates: per worker and in all (prompt tokens of first admissions a cached prefix
    skipped), next to the infinite-cache oracle's over the same requests (`oracle_hits`), where the
    trace has block ids."""
    ws = cluster.workers
    hits, queries = sum(w.prefix_cache_hits for w in ws), sum(w.prefix_cache_queries for w in ws)
    out: dict = {
        "prefix_cache_hit_rate": hit_rate(hits, queries),
        "prefix_cache_hit_rate_by_worker": [hit_rate(w.prefix_cache_hits, w.prefix_cache_queries) for w in ws],
    }
    tiers = {id(w.host): w.host for w in ws if w.host is not None}
    if tiers:  # the hit rate split by tier, and the host tiers' traffic
        out["prefix_cache_host_hit_rate"] = hit_rate(sum(w.host_hits for w in ws), queries)
        out["prefix_cache_device_hit_rate"] = out["prefix_cache_hit_rate"] - out["prefix_cache_host_hit_rate"]
        for k in ("offloaded_blocks", "loaded_blocks", "evicted_blocks"):
            out[f"host_tier_{k}"] = sum(getattr(t, k) for t in tiers.values())
    if cluster.trace.hash_ids is not None:
        # over the requests the hit rate counts (admitted), in the order this run had them arrive
        # (a closed loop's differs from the trace's)
        admitted = {i for i in cluster.sent if cluster.queried[i]}
        hits_queries = oracle_hits(cluster.trace, cluster.config.block_size, cluster.sent, admitted)
        out["prefix_cache_oracle_hit_rate"] = hit_rate(*hits_queries)
    return out
