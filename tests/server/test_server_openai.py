"""The OpenAI API through the official `openai` client against a real server (SmolLM2 on CPU)."""

from __future__ import annotations

import httpx
import openai
import pytest

PROMPT = "The capital of France is"


def _tok(served):
    return served.runtime.tokenizer


def test_completion_greedy_knows_paris_and_counts_usage(served, client, model):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    choice = r.choices[0]
    assert "Paris" in choice.text
    assert r.object == "text_completion" and r.model == model
    assert r.usage.prompt_tokens == len(_tok(served).encode(PROMPT))
    assert choice.finish_reason in ("length", "stop")
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_completion_matches_non_streaming(client, model):
    kw = dict(model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 8)
    assert usage.total_tokens == usage.prompt_tokens + 8


def test_prompt_as_token_ids(served, client, model):
    ids = _tok(served).encode(PROMPT)
    a = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    b = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids)


def test_chat_streaming_and_not(served, client, model):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.prompt_tokens == len(_tok(served).encode_chat(msgs))
    chunks = list(
        client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=8, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_strings_cut_the_text(client, model):
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    text = base.choices[0].text  # " Paris.\n\nThe ..." for SmolLM2
    assert "." in text
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, stop=["."])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(".")]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt=PROMPT, max_tokens=6, temperature=0, stop=".", stream=True
        )
    )
    assert streamed == r.choices[0].text
    kept = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stop=["."],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == text[: text.index(".") + 1]


def test_seed_makes_sampling_reproducible(client, model):
    kw = dict(model=model, prompt="Once upon a time", max_tokens=8, temperature=0.8, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_completion_logprobs(client, model):
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 for c in content)


@pytest.mark.parametrize(
    "bad, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"temperature": 2.5}, "temperature"),
        ({"n": 17}, "n"),
        ({"prompt": "LONG"}, "prompt"),
        ({"max_tokens": "LONG"}, "max_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_parameters_are_400_with_openai_bodies(served, client, bad, param, model):
    kw = dict(model=model, prompt="hi", max_tokens=2)
    kw.update(bad)
    if kw["prompt"] == "LONG":
        kw["prompt"] = "hello " * (served.runtime.max_model_len + 10)
    if kw["max_tokens"] == "LONG":
        kw["max_tokens"] = served.runtime.max_model_len + 10
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**kw)
    assert err.value.status_code == 400
    body = err.value.body
    assert set(body) >= {"message", "type", "param", "code"} and body["message"]
    assert body["param"] == param


def test_too_long_prompt_message(served, client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt="hello " * (served.runtime.max_model_len + 10), max_tokens=2)
    assert "maximum context length" in err.value.body["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
    assert err.value.status_code == 404 and "gpt-4o" in err.value.body["message"]


def test_models_lists_exactly_the_served_name(served, client):
    models = client.models.list().data
    assert [m.id for m in models] == [served.runtime.model_name]
    assert models[0].model_extra["max_model_len"] == served.runtime.max_model_len


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
        ("/tokenize", {"prompt": PROMPT}),
        ("/detokenize", {"tokens": [1, 2]}),
    ],
)
def test_only_the_served_name_is_accepted(served, model, path, body):
    url = served.url + path
    assert httpx.post(url, json=body, timeout=60).status_code == 200  # no `model`: the served one
    assert httpx.post(url, json={**body, "model": model}, timeout=60).status_code == 200
    others = {"smollm2", "gpt-4o", model.lower(), model.upper(), f"models/{model}", f"{model}.gguf", f" {model}"}
    for other in sorted(others - {model}):
        r = httpx.post(url, json={**body, "model": other}, timeout=60)
        assert r.status_code == 404, (other, r.text)
        err = r.json()["error"]
        assert (err["code"], err["param"], err["type"]) == ("model_not_found", "model", "not_found_error")
        assert other in err["message"] and model in err["message"]
