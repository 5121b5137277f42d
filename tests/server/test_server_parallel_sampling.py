"""n > 1 through a real server: one prefill, n choices, each indexed, usage counting the prompt once."""

from __future__ import annotations

import json

import jsonschema

PROMPT = "The capital of France is"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}


def test_n_greedy_choices_equal_the_single_answer_and_count_the_prompt_once(client, model):
    kw = dict(model=model, prompt=PROMPT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    one = client.completions.create(**kw)
    three = client.completions.create(n=3, **kw)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.text for c in three.choices} == {one.choices[0].text}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 18


def test_seeded_choices_are_the_requests_seeded_s_to_s_plus_n(client, model):
    kw = dict(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
    group = client.completions.create(n=3, seed=11, **kw)
    alone = [client.completions.create(seed=11 + j, **kw).choices[0].text for j in range(3)]
    assert [c.text for c in group.choices] == alone


def test_a_batch_with_n_indexes_choices_prompt_major(client, model):
    prompts = [PROMPT, "One, two, three,"]
    kw = dict(model=model, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    r = client.completions.create(prompt=prompts, n=2, **kw)
    alone = [client.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [alone[0], alone[0], alone[1], alone[1]]


def test_streamed_chat_choices_each_end_once(client, model):
    msgs = [{"role": "user", "content": "Name a river."}]
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=msgs,
            n=3,
            max_tokens=10,
            temperature=0.8,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text, ends = ["", "", ""], []
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                ends.append(ch.index)
    assert sorted(ends) == [0, 1, 2] and all(text)
    usage = chunks[-1].usage
    assert usage.completion_tokens == sum(1 for c in chunks for ch in c.choices if ch.delta.content is not None) or (
        usage.completion_tokens >= 3
    )


def test_n_json_schema_choices_all_validate(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a city and its rank as JSON."}],
        n=4,
        max_tokens=40,
        temperature=1.0,
        seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
    )
    assert len(r.choices) == 4
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
        assert c.finish_reason == "stop"


def test_a_client_leaving_an_n4_stream_frees_every_block(served):
    import time

    import httpx

    body = {"prompt": PROMPT, "n": 4, "max_tokens": 200, "stream": True, "ignore_eos": True, "temperature": 1.0}
    before = sum(w["tokens_out"] for w in served.runtime.cluster_state()["workers"])
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens of the choices, then the client goes away
    assert any(line.startswith("data: {") for line in got)
    engine = served.runtime.backends[0]
    for _ in range(600):  # the abort reaches the engine between two steps
        state = served.runtime.cluster_state()
        if state["outstanding"] == 0 and engine.submit("stats").result(timeout=120).num_used_blocks == 0:
            break
        time.sleep(0.1)
    assert state["outstanding"] == 0 and all(w["kv_blocks_used"] == 0 for w in state["workers"])
    assert engine.submit("stats").result(timeout=120).num_used_blocks == 0
    assert sum(w["tokens_out"] for w in state["workers"]) - before < 4 * 200  # stopped, not run to its end
