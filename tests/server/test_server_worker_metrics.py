"""The per-worker and cluster families a runtime snapshot turns into (worker_metrics, metrics), and the
joint SLO counter the server keeps per request."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from serverhelp import metric

from fluidpd.server.metrics import ServerMetrics

WORKER = {
    "id": 1,
    "role": "decode",
    "num_requests_running": 3,
    "num_requests_waiting": 2,
    "step_time_s": 0.025,
    "generation_tokens": 40,
    "fluidtoken_borrowed_chunks": 5,
    "kv_cached_blocks": 12,
    "in_transition": True,
}


class _Runtime:
    def __init__(self, snap: dict) -> None:
        self.snap = snap
        self.snapshots = 0

    def metrics_snapshot(self) -> dict:
        self.snapshots += 1
        return self.snap


def _page(snap: dict) -> str:
    return generate_latest(ServerMetrics(_Runtime(snap), "m").registry).decode()


def test_every_worker_key_of_the_snapshot_is_exported_under_its_name():
    text = _page({"workers": [WORKER, {"id": 0}], "worker_lost_total": 2, "draining": True})
    for name, value in (
        ("fluidpd:worker_num_requests_running", 3),
        ("fluidpd:worker_num_requests_waiting", 2),
        ("fluidpd:worker_step_time_seconds", 0.025),
        ("fluidpd:worker_generation_tokens_total", 40),
        ("fluidpd:fluidtoken_borrowed_chunks_total", 5),
        ("fluidpd:kv_cached_blocks", 12),
        ("fluidpd:worker_in_transition", 1),
    ):
        assert f'{name}{{model_name="m",worker="1"}} {float(value)}' in text
        assert f'{name}{{model_name="m",worker="0"}}' not in text  # worker 0 reports none
    assert metric(text, "fluidpd:worker_lost_total") == 2 and metric(text, "fluidpd:server_draining") == 1
    empty = _page({"workers": [{"id": 0}]})
    assert "worker_num_requests_running" not in empty and "server_draining" not in empty


def test_a_request_attains_the_joint_slo_only_within_both_its_ttft_and_mean_tpot():
    runtime = _Runtime({"slo": {"ttft_s": 1.0, "tbt_s": 0.1}})
    m = ServerMetrics(runtime, "m")
    for first, gap, reason in (
        (0.5, 0.05, "length"),  # met
        (1.5, 0.05, "stop"),  # TTFT over
        (0.5, 0.2, "length"),  # mean TPOT over
        (0.5, 0.05, "abort"),  # not finished
    ):
        t = m.request(10.0, 4)
        t.on_tokens(1, 10.0 + first)
        t.on_tokens(2, 10.0 + first + 2 * gap)  # two tokens at once: TPOT is the mean, not the largest gap
        t.finish(reason, 10.0 + first + 2 * gap)
    assert runtime.snapshots == 1  # the SLO is read once, at the first finish
    text = generate_latest(m.registry).decode()
    assert metric(text, "fluidpd:request_slo_attained_total") == 1
    assert metric(text, "fluidpd:request_success_total") == 4
    no_slo = ServerMetrics(_Runtime({}), "m")
    t = no_slo.request(0.0, 4)
    t.on_tokens(1, 0.1)
    t.finish("stop", 0.1)
    assert metric(generate_latest(no_slo.registry).decode(), "fluidpd:request_slo_attained_total") == 0


def test_n_sequences_are_timed_each_on_its_own():
    """Two sequences whose tokens interleave: each gap is one sequence's own, TPOT a sequence's mean."""
    runtime = _Runtime({"slo": {"ttft_s": 1.0, "tbt_s": 0.1}})
    m = ServerMetrics(runtime, "m")
    t = m.request(0.0, 4, n=2)
    for k in range(4):  # both sequences' tokens arrive together every 0.08 s
        t.on_tokens(1, 0.5 + 0.08 * k, index=0)
        t.on_tokens(1, 0.5 + 0.08 * k, index=1)
    t.finish("length", 0.5 + 0.08 * 3)
    text = generate_latest(m.registry).decode()
    assert metric(text, "fluidpd:inter_token_latency_seconds_count") == 6  # 3 gaps per sequence, none between them
    assert metric(text, "fluidpd:inter_token_latency_seconds_sum") == pytest.approx(6 * 0.08)
    assert metric(text, "fluidpd:request_slo_attained_total") == 1  # TPOT 0.08 s, not 0.24 / 7
