"""A deployment of different instances (DistServe's placements): groups of identical instances,
each tp x pp GPUs, simulated together.

A pipeline-parallel instance of pp stages runs as pp lanes (micro-batch streams, DistServe's
decode micro-batching): each lane is a simulated worker whose steps take the whole pipeline's
latency (`RooflineModel(tp, pp).step_time`) and which holds 1/pp of the instance's KV memory, so
the instance's throughput grows with pp while a token's latency does not shrink. For prefill this
stands in for a pipeline that admits a batch every stage time (within ~10% of the M/D/1 pipeline's
TTFT at the loads that matter). The lanes of an instance are alike, so a deployment can also be
simulated as a slice of one lane per instance carrying 1/pp of the load (`one_lane`): pp times
cheaper, and the same as the whole but for the pooling of the lanes' queues.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.latency.config import LatencyConfig
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
from fluidpd.sim.run import SimResult, prefill_saturation_tokens, run_cluster
from fluidpd.specs.hardware import HardwareSpec
from fluidpd.specs.models import ModelSpec
from fluidpd.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class Instances:
    """`count` identical instances of one role, each tp x pp GPUs."""

    role: Role
    tp: int
    pp: int = 1
    count: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.count


@dataclass(frozen=True, slots=True)
class Deployment:
    """Instance groups on nodes of `gpus_per_node` GPUs, packed in order. `unit` = (a, b): Algorithm
    2's units instead, each of a prefill and b decode instances whose segments share nodes, so a
    unit's KV moves over NVLink."""

    groups: tuple[Instances, ...]
    gpus_per_node: int = 8
    unit: tuple[int, int] | None = None
    one_lane: bool = False  # simulate one lane of every instance (a 1/pp slice: give it 1/pp of the load)

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    def lanes(self) -> list[tuple[Instances, int, int]]:
        """(group, instance index, node) of every lane, prefill lanes first."""
        order = sorted(self.groups, key=lambda g: g.role is not Role.PREFILL)
        out, offset = [], 0
        for g in order:
            for i in range(g.count):
                if self.unit:
                    node = i // self.unit[0 if g.role is Role.PREFILL else 1]
                else:
                    node = offset // self.gpus_per_node
                out += [(g, i, node)] * (1 if self.one_lane else g.pp)
                offset += g.tp * g.pp
        return out


def simulate_deployment(
    trace: Trace,
    policy_name: str,
    deployment: Deployment,
    model: ModelSpec,
    hw: HardwareSpec,
    slo: Slo,
    *,
    sim: SimConfig | None = None,
    policy: PolicyConfig | None = None,
    latency: LatencyConfig | None = None,
    fluid: FluidConfig | None = None,
    keep_requests: bool = False,
) -> SimResult:
    """Run `trace` through `deployment` under `policy_name` (the prefill lanes take the prefill role)."""
    lanes = deployment.lanes()
    sim = replace(sim or SimConfig(), n_workers=len(lanes))
    models: dict[tuple[int, int], RooflineModel] = {}
    for g, _, _ in lanes:
        models.setdefault((g.tp, g.pp), latency_model(model, hw, tp=g.tp, pp=g.pp, config=latency))
    scratch = 1.0 - sim.gpu_memory_utilization + sim.scratch_fraction
    kv = [models[g.tp, g.pp].kv_blocks(sim.block_size, scratch) // g.pp for g, _, _ in lanes]
    prefill = [g for g, _, _ in lanes if g.role is Role.PREFILL]
    first = models[prefill[0].tp, prefill[0].pp] if prefill else models[lanes[0][0].tp, lanes[0][0].pp]
    sim = first.sim_config(sim)  # a profiled host's contention, jitter and remap time
    pol = _lane_policy(policy_name, policy, fluid, slo, len(prefill), first, sim.compute_slots())
    network = Network(NetworkConfig(intra_node_bw=hw.nvlink_bw_unidir, inter_node_bw=hw.internode_bw))
    cluster = SimCluster(
        trace,
        pol,
        [models[g.tp, g.pp].step_time for g, _, _ in lanes],
        model.kv_bytes_per_token,
        kv,
        network,
        MetricsCollector(slo, finished=[] if keep_requests else None),
        sim,
        nodes=[node for _, _, node in lanes],
        kv_bytes=model.kv_bytes,
    )
    return run_cluster(cluster, policy_name)


def _lane_policy(
    policy_name: str,
    policy: PolicyConfig | None,
    fluid: FluidConfig | None,
    slo: Slo,
    n_prefill: int,
    first: RooflineModel,
    compute_slots: int = 0,
) -> Policy:
    """The policy over the lanes: `n_prefill` prefill workers, a prefill batch that saturates `first`."""
    cfg = policy or PolicyConfig()
    cfg = replace(
        cfg,
        prefill_workers=n_prefill or cfg.prefill_workers,
        prefill_batch_tokens=cfg.prefill_batch_tokens or prefill_saturation_tokens(first),
    )
    costs = None
    if POLICIES.get(policy_name).needs_costs:
        from fluidpd.latency.fit import fit_attention_pair_time, fit_chunk_time, fit_prefill_time

        costs = CostModel(
            slo,
            fit_prefill_time(first),
            fit_chunk_time(first),
            attn_pair_s=fit_attention_pair_time(first),
            compute_slots=compute_slots,
        )
    return make_policy(policy_name, cfg, fluid, costs)
