"""The OpenAI surface through a 1P+2D cluster behind `fluidpd serve`, under static-pd and fluidpd: every
everyday parameter end to end, an n=4 json_schema stream through a forced FluidRole switch, and a worker
killed (kill -9) under an n=4 request."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import jsonschema
import openai
import pytest

from fluidpd.engine.config import EngineConfig
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

pytestmark = pytest.mark.slow  # 3-worker clusters behind the server

PROMPT = "The capital of France is"
WORDS = {
    "type": "object",
    "properties": {
        "words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 16, "maxItems": 16}
    },
    "required": ["words"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _server(policy: str, backend: str):
    import torch

    from fluidpd.server import BackgroundServer, build_app

    torch.set_num_threads(1)
    config = EngineConfig(model="smollm2", max_model_len=512, num_kv_blocks=160, max_num_seqs=16)
    runtime = RuntimeConfig(
        workers=3,
        policy=policy,
        backend=backend,
        ttft_slo_s=5.0,
        tbt_slo_s=0.5,
        heartbeat_timeout_s=10.0,  # a loaded host delays heartbeats: only the kill loses a worker
        admit_ttft_factor=0,  # admission control is not the subject: a slow host must not 429
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=16),
        fluid=FluidConfig(tau_persist_s=1e9, drain_timeout_s=0),  # only the admin's switches
    )
    coord = build_coordinator(config, runtime, "smollm2", log=lambda m: None)
    srv = BackgroundServer(build_app(coord))
    srv.runtime = coord
    return srv


@pytest.fixture(scope="module", params=["static-pd", "fluidpd"])
def cluster(request):
    with _server(request.param, "inprocess") as srv:
        srv.policy = request.param
        yield srv


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)


def _idle(srv) -> dict:
    """The cluster once every request has left it (the last finish is accounted a moment after its event)."""
    for _ in range(600):
        state = httpx.get(srv.url + "/v1/admin/cluster", timeout=60).json()
        if state["outstanding"] == 0 and all(w["kv_blocks_used"] == 0 for w in state["workers"]):
            return state
        time.sleep(0.1)
    return state


def test_every_everyday_call_through_the_cluster(cluster):
    c, m = _client(cluster), "smollm2"
    greedy = dict(model=m, temperature=0, extra_body={"ignore_eos": True})
    one = c.completions.create(prompt=PROMPT, max_tokens=6, **greedy).choices[0].text
    three = c.completions.create(prompt=PROMPT, max_tokens=6, n=3, **greedy)
    assert [ch.text for ch in three.choices] == [one] * 3
    batch = c.completions.create(prompt=[PROMPT, "One, two,"], max_tokens=6, n=2, **greedy)
    assert [ch.index for ch in batch.choices] == [0, 1, 2, 3] and batch.choices[1].text == one
    scored = c.completions.create(model=m, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == PROMPT and lp.token_logprobs[0] is None and len(lp.token_logprobs) > 2
    ranked = c.completions.create(model=m, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    assert ranked.choices[0].model_extra["prompt_logprobs"][0] is None
    controlled = c.completions.create(
        model=m,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        logit_bias={"28": -5},
        extra_body={"repetition_penalty": 1.2, "min_p": 0.05, "top_k": 20, "min_tokens": 4, "bad_words": ["Paris"]},
    )
    assert "Paris" not in controlled.choices[0].text and controlled.usage.completion_tokens >= 4
    schema = c.chat.completions.create(
        model=m,
        messages=[{"role": "user", "content": "Sixteen words, as JSON."}],
        max_tokens=400,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "words", "schema": WORDS}},
    )
    jsonschema.validate(json.loads(schema.choices[0].message.content), WORDS)
    choice = c.chat.completions.create(
        model=m,
        messages=[{"role": "user", "content": "Yes or no?"}],
        max_tokens=4,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert choice.choices[0].message.content in ("yes", "no")
    called = c.chat.completions.create(
        model=m,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    (call,) = called.choices[0].message.tool_calls[:1]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    state = _idle(cluster)
    assert state["outstanding"] == 0 and all(w["kv_blocks_used"] == 0 for w in state["workers"])


def test_an_n4_json_schema_stream_survives_a_forced_role_switch(cluster):
    if cluster.policy != "fluidpd":
        pytest.skip("only fluidpd switches roles")
    c = _client(cluster)
    stream = c.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Sixteen words, as JSON."}],
        n=4,
        max_tokens=400,  # 16 words: the group decodes long enough for the switch to reach it
        temperature=1.0,
        seed=7,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "words", "schema": WORDS}},
    )
    texts, ends, switched, rid = ["", "", "", ""], {}, None, None
    for chunk in stream:
        rid = chunk.id
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                ends[ch.index] = ch.finish_reason
        if switched is None and any(texts) and not ends:
            state = httpx.get(cluster.url + "/v1/admin/cluster", timeout=60).json()
            holder = [w["id"] for w in state["workers"] if w["role"] == "decode" and w["decoding"]]
            if holder:
                r = httpx.post(f"{cluster.url}/v1/admin/workers/{holder[0]}/role", json={"role": "prefill"}, timeout=60)
                assert r.status_code == 200, r.text
                switched = holder[0]
    assert switched is not None, "the group never decoded on a decode worker"
    assert ends == {0: "stop", 1: "stop", 2: "stop", 3: "stop"}
    for t in texts:
        jsonschema.validate(json.loads(t), WORDS)
    trace = httpx.get(f"{cluster.url}/v1/admin/traces/{rid}", timeout=60).json()
    kinds = [e["kind"] for e in trace["events"]]
    assert "role_switch" in kinds  # the switch reached the worker while the group was on it
    assert any(e["kind"] == "kv_transfer" and e["class"] == "migration" for e in trace["events"])
    _idle(cluster)


def test_a_worker_killed_under_an_n4_request_loses_no_choice_and_no_block():
    with _server("static-pd", "process") as srv:
        c, coord = _client(srv), srv.runtime
        kw = dict(model="smollm2", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
        alone = c.completions.create(**kw).choices[0].text
        texts, ends, killed, error = ["", "", "", ""], {}, [], None
        try:
            for chunk in c.completions.create(n=4, stream=True, **kw):
                for ch in chunk.choices:
                    texts[ch.index] += ch.text
                    if ch.finish_reason:
                        ends[ch.index] = ch.finish_reason
                if not killed and any(texts):
                    holders = [w.id for w in coord.cluster.workers if w.role.value == "decode" and w.decoding]
                    if holders:
                        os.kill(coord.backends[holders[0]].pid, signal.SIGKILL)
                        killed.append(holders[0])
        except openai.APIError as exc:  # the stream's error event: the request failed visibly
            error = exc
        assert killed, "the group never decoded on a decode worker"
        # every choice finishes (restarted from the tokens already sent) or the request fails visibly
        assert error is not None or (ends == dict.fromkeys(range(4), "length") and texts == [alone] * 4)
        for _ in range(6000):  # the replacement joins (a process start: seconds, minutes on a loaded host)
            if coord.status()["status"] == "ok":
                break
            time.sleep(0.1)
        state = _idle(srv)
        assert state["outstanding"] == 0 and len(state["losses"]) == 1
        for b in coord.backends:  # each engine: no block held by a request
            assert b.submit("stats").result(timeout=600).num_used_blocks == 0
