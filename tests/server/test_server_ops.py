"""Metrics, admin, health, validation errors, disconnects and engine failures over HTTP."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from serverhelp import idle, metric

NAMES = [
    "fluidpd:time_to_first_token_seconds",
    "fluidpd:inter_token_latency_seconds",
    "fluidpd:e2e_request_latency_seconds",
    "fluidpd:num_requests_running",
    "fluidpd:num_requests_waiting",
    "fluidpd:kv_cache_usage_perc",
    "fluidpd:prefill_pressure_index",
    "fluidpd:decode_pressure_index",
    "fluidpd:worker_role",
    "fluidpd:role_transitions_total",
    "fluidpd:kv_transfer_bytes_total",
    "fluidpd:prompt_tokens_total",
    "fluidpd:generation_tokens_total",
    "fluidpd:request_success_total",
]


def test_health(served):
    assert httpx.get(served.url + "/health").status_code == 200


def test_metrics_names_and_ttft_count_grows(served, client, model):
    before = httpx.get(served.url + "/metrics").text
    client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    after = httpx.get(served.url + "/metrics").text
    for name in NAMES:
        assert re.search(rf"^{re.escape(name)}(_bucket|_count|_sum)?[{{ ]", after, re.M), name
    count = "fluidpd:time_to_first_token_seconds_count"
    assert metric(after, count) == metric(before, count) + 1
    assert metric(after, "fluidpd:generation_tokens_total") >= metric(before, "fluidpd:generation_tokens_total") + 3
    assert metric(after, "fluidpd:request_success_total", 'finish_reason="length"') >= 1
    assert 'role="colocated"' in after and 'worker="0"' in after


def test_admin_cluster_and_role_switch(served):
    state = httpx.get(served.url + "/v1/admin/cluster").json()
    assert {"workers", "policy"} <= set(state)
    assert state["workers"] and {"id", "role"} <= set(state["workers"][0])
    assert {"tokens", "bytes", "sent_bytes", "fallbacks"} <= set(state["kv_moves"])
    if state["policy"] == "colocated" and len(state["workers"]) == 1:
        r = httpx.post(served.url + "/v1/admin/workers/0/role", json={"role": "decode"})
        assert r.status_code == 400
        assert "no role transitions" in r.json()["error"]["message"]
    r = httpx.post(served.url + "/v1/admin/workers/0/role", json={"role": "boss"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "role"


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/x-www-form-urlencoded"},  # curl -d
        {"content-type": "text/plain"},
        {},
    ],
)
def test_admin_role_body_is_json_whatever_the_content_type(served, headers):
    worker = httpx.get(served.url + "/v1/admin/cluster").json()["workers"][0]["id"]
    url = f"{served.url}/v1/admin/workers/{worker}/role"
    r = httpx.post(url, content=b'{"role": "boss"}', headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "role" and "boss" in r.json()["error"]["message"]
    r = httpx.post(url, content=b'{"role": "decode"}', headers=headers)
    if r.status_code != 200:  # a runtime that cannot switch says so itself (a single colocated worker)
        assert r.status_code == 400 and r.json()["error"]["param"] == "role", r.text
        assert "JSON" not in r.json()["error"]["message"]


@pytest.mark.parametrize("worker", [7, 99, -1])
def test_admin_role_switch_of_an_unknown_worker_is_404(served, worker):
    r = httpx.post(f"{served.url}/v1/admin/workers/{worker}/role", json={"role": "decode"})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("not_found_error", "worker_id", 404)
    assert f"no worker {worker}" in err["message"]


@pytest.mark.parametrize(
    "content, says",
    [(b"role=decode", "not valid JSON"), (b"", "empty"), (b'["decode"]', "JSON object"), (b"{}", "role")],
)
def test_admin_role_body_that_is_not_a_role_object_is_400(served, content, says):
    r = httpx.post(
        served.url + "/v1/admin/workers/0/role",
        content=content,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_admin_role_worker_id_must_be_an_integer(served):
    r = httpx.post(served.url + "/v1/admin/workers/abc/role", json={"role": "decode"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "worker_id"


def test_schema_errors_are_400_openai_bodies(served, model):
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": "many"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "max_tokens" and err["type"] == "invalid_request_error"
    r = httpx.post(served.url + "/v1/chat/completions", json={"model": model})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.get(served.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_openapi_documents_the_json_bodies_and_the_error_body(served):
    schema = httpx.get(served.url + "/openapi.json").json()
    ops = {(m, path): op for path, item in schema["paths"].items() for m, op in item.items()}
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    for (method, _), op in ops.items():
        assert op["responses"]["default"]["content"]["application/json"]["schema"] == error
        assert "422" not in op["responses"]  # a bad request is a 400
        assert ("requestBody" in op) == (method == "post")
    body = ops["post", "/v1/completions"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    assert schema["components"]["schemas"]["CompletionRequest"]["required"] == ["prompt"]
    assert "text/event-stream" in ops["post", "/v1/chat/completions"]["responses"]["200"]["content"]
    assert "text/plain" in ops["get", "/metrics"]["responses"]["200"]["content"]


def test_tokenize_endpoint(served):
    r = httpx.post(served.url + "/tokenize", json={"prompt": "The capital of France"}).json()
    assert r["tokens"] == served.runtime.tokenizer.encode("The capital of France")
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == served.runtime.max_model_len


def test_stream_disconnect_aborts_the_request(served, model):
    before = httpx.get(served.url + "/metrics").text
    body = {"model": model, "prompt": "Tell me a long story.", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", served.url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data:"):
                seen += 1
                if seen == 2:
                    break
    snap = idle(served.runtime)
    assert (snap["num_requests_running"], snap["num_requests_waiting"]) == (0, 0)
    after = httpx.get(served.url + "/metrics").text
    key = ("fluidpd:request_success_total", 'finish_reason="abort"')
    assert metric(after, *key) == metric(before, *key) + 1


def test_non_stream_disconnect_aborts_the_request(served, model):
    body = {"model": model, "prompt": "Tell me a long story.", "max_tokens": 300, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/v1/completions", json=body, timeout=1.5)
    snap = idle(served.runtime)
    assert (snap["num_requests_running"], snap["num_requests_waiting"]) == (0, 0)


def test_engine_failure_fails_requests_visibly_and_the_runtime_carries_on(served, client, monkeypatch, model):
    engine = served.runtime.backends[0].engine  # the in-process worker's engine

    def broken_step(plan):
        raise RuntimeError("simulated device fault")

    monkeypatch.setattr(engine, "run_step", broken_step)
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model=model, prompt="hi", max_tokens=2)
    assert err.value.body["message"] == "the engine failed the step (see the server log)"  # no internal text
    with pytest.raises(openai.APIError, match="the engine failed the step") as err:
        for _ in client.completions.create(model=model, prompt="hi", max_tokens=2, stream=True):
            pass
    assert "simulated device fault" not in str(err.value)
    monkeypatch.undo()
    assert httpx.get(served.url + "/health").status_code == 200
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r.choices[0].text  # the runtime serves again
    snap = idle(served.runtime)
    assert all(w["kv_cache_usage_perc"] == 0 for w in snap["workers"])


def test_a_runtime_that_cannot_serve_answers_503_without_its_reason(served, model, monkeypatch):
    monkeypatch.setattr(served.runtime.cluster, "failed", "every worker is lost: spawn failed (pid 4242)")
    health = httpx.get(served.url + "/health")
    assert health.status_code == 503 and health.json()["error"]["type"] == "service_unavailable"
    r = httpx.post(served.url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and "4242" not in r.text and "4242" not in health.text
    monkeypatch.undo()
    assert httpx.get(served.url + "/health").status_code == 200
