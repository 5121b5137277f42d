"""Builders for small simulated clusters used across the simulator tests."""

from __future__ import annotations

from dataclasses import replace

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.registry import make_policy
from fluidpd.sim.cluster import SimCluster
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.trace import Trace


def setup_8b(workers: int = 4, **sim_kw) -> Setup:
    sim = SimConfig(n_workers=workers, **sim_kw)
    return Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        Slo(1.0, 0.05),
        sim,
        PolicyConfig(prefill_workers=1, prefill_batch_tokens=512),
    )


def cluster(trace: Trace, policy: str, setup: Setup, kv_blocks: int | None = None) -> SimCluster:
    """A cluster that keeps its finished requests, optionally with `kv_blocks` per worker."""
    roofline = setup.roofline()
    metrics = MetricsCollector(setup.slo, finished=[])
    blocks = kv_blocks if kv_blocks is not None else setup.kv_blocks(roofline)
    return SimCluster(
        trace,
        make_policy(policy, setup.policy),
        roofline.step_time,
        setup.model.kv_bytes_per_token,
        blocks,
        setup.network(),
        metrics,
        setup.sim,
    )


def trace(arrivals, prompts, outputs, name="t") -> Trace:
    return Trace(name, list(map(float, arrivals)), list(prompts), list(outputs))


def with_policy(setup: Setup, **kw) -> Setup:
    return replace(setup, policy=replace(setup.policy, **kw))
