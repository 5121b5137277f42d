"""Every query of the Grafana dashboard (deploy/grafana/fluidpd-dashboard.json) resolves against a live
server: each metric it selects, each label it matches, groups by, joins on or shows in a legend, and each
literal label value it matches, is on the server's /metrics page with that exact name. The server is the
one the dashboard is for at its fullest: the fluidpd policy over two workers with a node KV store, after
requests that hit the prefix cache and make the arenas evict, so every family has samples."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from promql_refs import dashboard_refs, exported_labels, missing
from serverhelp import idle

from fluidpd.engine.config import EngineConfig
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

pytestmark = pytest.mark.slow  # a two-worker cluster behind the server

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fluidpd-dashboard.json"
SHARED = "Once upon a time in a land far away there lived a king who had three daughters. " * 4  # 73 tokens
STRANGERS = [f"Story number {k}: " + "the cat sat on the mat and " * 10 + str(k) for k in range(4)]


@pytest.fixture(scope="module")
def metrics_page() -> str:
    import torch

    from fluidpd.server import BackgroundServer, build_app

    torch.set_num_threads(1)
    config = EngineConfig(model="smollm2", max_model_len=256, num_kv_blocks=32, max_num_seqs=8)
    runtime = RuntimeConfig(
        workers=2,
        policy="fluidpd",
        backend="inprocess",
        admit_ttft_factor=0,
        scheduling=PolicyConfig(prefill_workers=1),
        kv_offloading_size=0.01,  # GiB: the node KV store, for its usage and traffic panels
    )
    coord = build_coordinator(config, runtime, "smollm2", log=lambda m: None)
    with BackgroundServer(build_app(coord)) as srv:
        # the shared prompt again and again: prefix hits (and their reuse gaps); the strangers fill the
        # 16-block prefill arena so it evicts (idle-before-evict)
        for prompt in [SHARED, SHARED, *STRANGERS, SHARED]:
            body = {"model": "smollm2", "prompt": prompt, "max_tokens": 3, "temperature": 0}
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
        idle(coord)  # the workers' books closed on every request
        page = httpx.get(f"{srv.url}/metrics", timeout=60)
        assert page.status_code == 200
        yield page.text


def test_every_dashboard_query_resolves_against_a_live_server(metrics_page):
    from prometheus_client.parser import text_string_to_metric_families

    exported = exported_labels(text_string_to_metric_families(metrics_page))
    queries = dashboard_refs(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 30
    unresolved = [f"{where}\n    {m}" for where, q in queries for m in missing(q, exported)]
    assert not unresolved, "the dashboard queries what the server does not export:\n" + "\n".join(unresolved)


def test_the_new_per_worker_metrics_count_what_the_workers_did(metrics_page):
    from prometheus_client.parser import text_string_to_metric_families

    values = {
        (s.name, s.labels.get("worker")): s.value
        for fam in text_string_to_metric_families(metrics_page)
        for s in fam.samples
    }
    generated = values[("fluidpd:generation_tokens_total", None)]
    assert generated > 0
    per_worker = sum(values[("fluidpd:worker_generation_tokens_total", w)] for w in ("0", "1"))
    assert per_worker == generated  # every token the server streamed, generated on one worker or the other
    assert values[("fluidpd:worker_step_time_seconds", "1")] > 0  # the decode worker stepped
    assert values[("fluidpd:kv_cached_blocks", "0")] > 0 and values[("fluidpd:kv_cached_blocks", "1")] > 0
    assert all(values[("fluidpd:worker_num_requests_running", w)] == 0 for w in ("0", "1"))  # all done
    assert values[("fluidpd:worker_lost_total", None)] == 0 and values[("fluidpd:server_draining", None)] == 0
