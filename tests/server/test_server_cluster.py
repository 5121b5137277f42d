"""The OpenAI server over the multi-worker runtime (fluidpd policy, 3 workers), with the admin API."""

from __future__ import annotations

import json
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


def _admin(base: str) -> dict:
    return httpx.get(f"{base}/v1/admin/cluster", timeout=30).json()


def _switch(base: str, wid: int, role: str) -> None:
    """Force `wid` into `role` and wait until the transition is done."""
    r = httpx.post(f"{base}/v1/admin/workers/{wid}/role", json={"role": role}, timeout=30)
    assert r.status_code == 200, r.text
    deadline = time.time() + 600
    while time.time() < deadline:
        state = _admin(base)
        t = state["transitions"][-1]
        if t["worker"] == wid and t["to"] == role and t["done"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {wid} never became {role}: {state['transitions'][-1]}")


def _top(base: str, capsys) -> str:
    from fluidpd.cli import main

    assert main(["top", "--url", base, "--once", "--interval", "0.2"]) == 0
    return capsys.readouterr().out


def test_a_request_trace_covers_its_phases_at_the_admin_route_and_as_otel_spans(cluster_server):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fluidpd.runtime.otel import SpanExport, tracer_provider

    base, coord = cluster_server.url, cluster_server.runtime
    if _admin(base)["workers"][1]["role"] != "decode":
        _switch(base, 1, "decode")
    decoders = [w["id"] for w in _admin(base)["workers"] if w["role"] == "decode"]
    memory = InMemorySpanExporter()
    provider = tracer_provider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    coord.traces.export = SpanExport(provider)
    try:
        body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True}
        out = httpx.post(f"{base}/v1/completions", json=body, timeout=300).json()
    finally:
        coord.traces.export = None
    rid = out["id"]
    t = httpx.get(f"{base}/v1/admin/traces/{rid}", timeout=30).json()
    assert httpx.get(f"{base}/v1/admin/traces?limit=1", timeout=30).json()["data"][0]["id"] == rid
    kinds = [e["kind"] for e in t["events"]]
    for kind in ("arrival", "queued", "admitted", "prefill_chunk", "kv_transfer", "first_token", "decode", "finish"):
        assert kind in kinds, (kind, kinds)
    assert kinds[0] == "arrival" and kinds[-1] == "finish" and t["finish_reason"] == "length"
    assert t["output_tokens"] == 8 and t["prompt_tokens"] == out["usage"]["prompt_tokens"]
    (move,) = [e for e in t["events"] if e["kind"] == "kv_transfer"]
    chunks = [e for e in t["events"] if e["kind"] == "prefill_chunk"]
    decode = [e for e in t["events"] if e["kind"] == "decode"]
    assert move["class"] == "handoff" and move["bytes"] > 0 and move["worker"] == chunks[-1]["worker"]
    assert [d["worker"] for d in decode] == [move["to"]] and move["to"] in decoders
    assert t["arrival_s"] <= t["first_token_s"] <= t["finish_s"] == decode[0]["end_s"]
    spans = memory.get_finished_spans()
    (root,) = [s for s in spans if s.name == "fluidpd.request"]
    assert root.attributes["gen_ai.request.id"] == rid and root.attributes["gen_ai.usage.completion_tokens"] == 8
    children = sorted(s.name for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id)
    assert set(children) == {"fluidpd.queued", "fluidpd.prefill_chunk", "fluidpd.kv_transfer", "fluidpd.decode"}
    assert {e.name for e in root.events} >= {"arrival", "admitted", "first_token", "finish"}
    assert all(root.start_time <= s.start_time <= s.end_time <= root.end_time for s in spans if s is not root)


def test_top_shows_a_role_switch_under_load_and_the_moved_requests_traces_show_it(cluster_server, capsys):
    import threading

    base = cluster_server.url
    if _admin(base)["workers"][2]["role"] != "decode":
        _switch(base, 2, "decode")
    frame = _top(base, capsys)
    assert "policy fluidpd" in frame and "PPI" in frame and "DPI" in frame and "last 60 s" in frame
    assert "worker 2 prefill→decode (admin)" in frame or _admin(base)["transitions"][-1]["from"] == "decode"
    ids: list[str] = []

    def stream(i: int) -> None:  # the load a `fluidpd bench` would send
        body = {"model": "smollm2", "prompt": f"Tell story {i}:", "max_tokens": 96, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    rid = json.loads(line[6:])["id"]
                    if rid not in ids:
                        ids.append(rid)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    deadline = time.time() + 600
    while _admin(base)["workers"][2]["decoding"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    _switch(base, 2, "prefill")
    frame = _top(base, capsys)
    rows = {line.split()[0]: line for line in frame.splitlines() if line.strip()[:1].isdigit()}
    assert "prefill" in rows["2"], frame  # the role changed ...
    assert "worker 2 decode→prefill (admin): done in" in frame, frame  # ... and the switch is listed
    for th in threads:
        th.join()
    traces = [httpx.get(f"{base}/v1/admin/traces/{rid}", timeout=30).json() for rid in ids]
    assert len(traces) == 6 and all(t["output_tokens"] == 96 for t in traces)
    moved = [t for t in traces if any(e["kind"] == "role_switch" for e in t["events"])]
    assert moved, [t["events"] for t in traces]
    for t in moved:
        switch = next(e for e in t["events"] if e["kind"] == "role_switch")
        assert (switch["worker"], switch["from"], switch["to"]) == (2, "decode", "prefill")
        migrations = [e for e in t["events"] if e["kind"] == "kv_transfer" and e["class"] == "migration"]
        if migrations:
            assert [e["worker"] for e in t["events"] if e["kind"] == "decode"] == [2, migrations[0]["to"]]
