"""The OpenAI server over the multi-worker runtime (fluidpd policy, 3 workers), with the admin API."""

from __future__ import annotations

import time

import httpx
import pytest

from fluidpd.engine.config import EngineConfig
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

pytestmark = pytest.mark.slow  # a 3-worker cluster behind the server


@pytest.fixture(scope="module")
def cluster_server():
    import torch

    from fluidpd.server import BackgroundServer, build_app

    torch.set_num_threads(1)
    config = EngineConfig(model="smollm2", max_model_len=512, num_kv_blocks=128, max_num_seqs=16)
    runtime = RuntimeConfig(
        workers=3,
        policy="fluidpd",
        backend="inprocess",
        ttft_slo_s=5.0,
        tbt_slo_s=0.5,
        admit_ttft_factor=0,  # admission control is not the subject: a slow host must not 429
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=16),
        fluid=FluidConfig(tau_persist_s=1e9, drain_timeout_s=0),  # only the admin's switches, never rolled back
    )
    coord = build_coordinator(config, runtime, "smollm2", log=lambda m: None)
    with BackgroundServer(build_app(coord)) as srv:
        srv.runtime = coord
        yield srv


def test_completions_stream_and_not_through_the_cluster(cluster_server):
    import openai

    c = openai.OpenAI(base_url=cluster_server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    out = c.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert "Paris" in out.choices[0].text and out.usage.completion_tokens == 8
    chunks = list(
        c.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == out.choices[0].text


def test_admin_cluster_state_and_forced_role_switch(cluster_server):
    base = cluster_server.url
    state = httpx.get(f"{base}/v1/admin/cluster", timeout=30).json()
    assert state["policy"] == "fluidpd" and len(state["workers"]) == 3
    assert [w["role"] for w in state["workers"]] == ["prefill", "decode", "decode"]
    assert all(not w["own_process"] and w["rss_bytes"] > 0 for w in state["workers"])  # in-process: this one
    # as `curl -X POST .../v1/admin/workers/2/role -d '{"role": "prefill"}'` sends it
    r = httpx.post(
        f"{base}/v1/admin/workers/2/role",
        content=b'{"role": "prefill"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["worker"] == 2 and r.json()["role"] == "prefill"
    bad = httpx.post(f"{base}/v1/admin/workers/1/role", json={"role": "sideways"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "role"
    for wid in (3, 99, -1):
        missing = httpx.post(f"{base}/v1/admin/workers/{wid}/role", content=b'{"role": "decode"}', timeout=30)
        assert missing.status_code == 404, missing.text
        assert (missing.json()["error"]["type"], missing.json()["error"]["param"]) == ("not_found_error", "worker_id")
    deadline = time.time() + 600
    while time.time() < deadline:
        state = httpx.get(f"{base}/v1/admin/cluster", timeout=30).json()
        if state["transitions"] and state["transitions"][-1]["done"]:
            break
        time.sleep(0.2)
    t = state["transitions"][-1]
    assert t["done"] and t["worker"] == 2 and t["to"] == "prefill" and t["reason"] == "admin"
    assert state["workers"][2]["role"] == "prefill"
    last = httpx.post(f"{base}/v1/admin/workers/1/role", json={"role": "prefill"}, timeout=30)
    assert last.status_code == 409 and "last serving decode" in last.json()["error"]["message"], last.text
    assert last.json()["error"]["type"] == "conflict_error"  # the state forbids it now, not the ask
    metrics = httpx.get(f"{base}/metrics", timeout=30).text
    assert "fluidpd:worker_role" in metrics and "fluidpd:prefill_pressure_index" in metrics


def test_the_cluster_serves_exactly_its_model_name(cluster_server):
    base = cluster_server.url
    assert [m["id"] for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]] == ["smollm2"]
    r = httpx.post(
        f"{base}/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 1}, timeout=30
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
