"""Small FluidPD simulations for the policy tests."""

from __future__ import annotations

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.cluster import SimCluster
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, prefill_saturation_tokens
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.world.events import EventKind


def setup_70b(workers: int = 8, prefill: int = 2, jitter: float = 0.0) -> Setup:
    return Setup(
        get_model("llama-3.3-70b", "fp8"),
        get_hardware("h100"),
        Slo(2.0, 0.04),
        SimConfig(n_workers=workers, step_jitter_cv=jitter, seed=1),
        PolicyConfig(prefill_workers=prefill),
    )


def run_elastic(trace, policy_cls, setup: Setup, hook=None) -> SimCluster:
    """Run `trace` under an elastic policy class; `hook(cluster)` runs every 0.5 s of sim time."""
    roofline = setup.roofline()
    cfg = setup.policy
    cfg.prefill_batch_tokens = prefill_saturation_tokens(roofline)
    policy = policy_cls(cfg, setup.fluid, setup.costs(roofline))
    c = SimCluster(
        trace,
        policy,
        roofline.step_time,
        setup.model.kv_bytes_per_token,
        setup.kv_blocks(roofline),
        setup.network(),
        MetricsCollector(setup.slo, finished=[]),
        setup.sim,
    )
    if hook:

        def tick(_=None):
            hook(c)
            if c.outstanding or c.loop.now < trace.arrival_s[-1]:
                c.loop.at(c.loop.now + 0.5, EventKind.CONTROL, tick)

        c.loop.at(0.0, EventKind.CONTROL, tick)
    c.run()
    return c
