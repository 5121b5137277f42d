"""Mixtures of experts and sliding windows in the simulator: expert-parallel workers, windowed hand-offs."""

import pytest
from simhelp import trace

from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.world.trace import RequestTracer


def setup(model: str, **sim) -> Setup:
    return Setup(
        get_model(model),
        get_hardware("h100"),
        Slo(2.0, 0.1),
        SimConfig(**{"n_workers": 2, **sim}),
        PolicyConfig(prefill_workers=1, prefill_batch_tokens=4096),
    )


def test_expert_parallel_worker():
    s = setup("qwen3-30b-a3b", tp=2, ep=2)
    assert s.roofline().ep == 2 and s.roofline().tp == 2
    with pytest.raises(ValueError, match="divisor"):
        SimConfig(tp=2, ep=4)
    res = simulate(trace([0.0, 0.5, 1.0], [2000] * 3, [20] * 3), "static-pd", s)
    assert res.summary["completed"] == 3


@pytest.mark.parametrize("model, windowed", [("gemma-3-27b", True), ("llama-3.1-8b", False)])
def test_handoffs_send_the_windowed_layers_window_only(model, windowed):
    s = setup(model)
    traces = []

    def trace_requests(cluster):
        cluster.tracer = RequestTracer(traces.append)

    res = simulate(trace([0.0, 1.0, 2.0, 3.0], [6000] * 4, [8] * 4), "static-pd", s, before_run=trace_requests)
    moved = res.cluster.kv_tokens_moved
    assert res.summary["completed"] == 4 and moved >= 4 * 6000
    m = s.model
    assert res.summary["kv_bytes_moved"] == 4 * m.kv_bytes(moved // 4)
    for t in traces:  # each hand-off takes its bytes' time on the link
        (move,) = [e for e in t.events if e.kind == "kv_transfer"]
        assert move.attrs["bytes"] == m.kv_bytes(move.attrs["tokens"])
        assert move.end_s - move.t_s == pytest.approx(move.attrs["bytes"] / 450e9, abs=5e-5)  # + link latency
    full = moved * m.kv_bytes_per_token
    if windowed:  # 52 of 62 layers send 1,024 tokens, not ~6,000
        assert res.summary["kv_bytes_moved"] < 0.35 * full
    else:
        assert res.summary["kv_bytes_moved"] == full
