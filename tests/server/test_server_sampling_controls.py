"""vLLM's sampling controls over the OpenAI API (presence/frequency/repetition penalties, logit_bias, min_p,
min_tokens, bad_words): each accepted and applied end to end, and a 400 naming the field when out of range."""

from __future__ import annotations

import httpx
import pytest

PROMPT = "The capital of France is"
REPETITIVE = "one two three one two three one two three one two three one two three"
SHORT_ANSWER = [{"role": "user", "content": "What is 2+2? Answer with a number only."}]


def _complete(client, model, prompt=PROMPT, max_tokens=6, **extra):
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True, **extra}
    )
    return r.choices[0].text


def _first_token(served, text: str) -> int:
    return served.runtime.tokenizer.encode(text, add_special_tokens=False)[0]


def test_logit_bias_moves_greedy_off_its_token_and_onto_another(served, client, model):
    plain = _complete(client, model)
    first = _first_token(served, plain)
    avoided = _complete(client, model, logit_bias={str(first): -100})
    assert avoided != plain and _first_token(served, avoided) != first
    forced = _complete(client, model, max_tokens=3, logit_bias={"1234": 100})
    assert forced == served.runtime.tokenizer.decode([1234, 1234, 1234])


def test_presence_and_frequency_penalties_change_a_repetitive_generation(client, model):
    plain = _complete(client, model, REPETITIVE, max_tokens=24)
    assert _complete(client, model, REPETITIVE, max_tokens=24, presence_penalty=0) == plain
    assert _complete(client, model, REPETITIVE, max_tokens=24, presence_penalty=2) != plain
    assert _complete(client, model, REPETITIVE, max_tokens=24, frequency_penalty=2) != plain
    assert _complete(client, model, REPETITIVE, max_tokens=24, repetition_penalty=1.5) != plain


def test_min_p_of_one_keeps_only_the_top_token(client, model):
    plain = _complete(client, model, max_tokens=8)
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=1.5, seed=3, extra_body={"ignore_eos": True, "min_p": 1}
    )
    assert r.choices[0].text == plain


def test_bad_words_are_never_completed(client, model):
    plain = _complete(client, model, max_tokens=8)
    assert "Paris" in plain
    text = _complete(client, model, max_tokens=8, bad_words=["Paris"])
    assert "Paris" not in text


def test_min_tokens_holds_off_the_end_of_a_chat_answer(client, model):
    kw = dict(model=model, messages=SHORT_ANSWER, max_tokens=24, temperature=0)
    early = client.chat.completions.create(**kw)
    assert early.choices[0].finish_reason == "stop" and early.usage.completion_tokens < 12
    held = client.chat.completions.create(**kw, extra_body={"min_tokens": 12})
    assert held.usage.completion_tokens >= 12
    assert held.choices[0].message.content.startswith(early.choices[0].message.content)


def test_chat_takes_every_control_at_once(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=10,
        temperature=0.8,
        seed=1,
        presence_penalty=-0.5,
        frequency_penalty=0.5,
        logit_bias={"2": -100},
        extra_body={"repetition_penalty": 1.1, "min_p": 0.05, "min_tokens": 10, "bad_words": ["seven", "eight"]},
    )
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"


ERRORS = [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias"),
    ({"logit_bias": {"5": -101}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"49152": 1}}, "logit_bias"),  # SmolLM2's vocabulary is 49,152 tokens
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": ["ok", "  "]}, "bad_words"),
    ({"bad_words": [f"w{i}" for i in range(129)]}, "bad_words"),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("extra, param", ERRORS)
def test_out_of_range_controls_are_400_naming_the_field(served, path, extra, param):
    body = {"max_tokens": 2, **extra}
    body.update({"prompt": PROMPT} if path == "/v1/completions" else {"messages": SHORT_ANSWER})
    r = httpx.post(served.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, 400), err
    assert param in err["message"]


def test_the_edges_of_the_ranges_are_accepted(served):
    body = {
        "prompt": PROMPT,
        "max_tokens": 2,
        "temperature": 0,
        "presence_penalty": -2,
        "frequency_penalty": 2,
        "logit_bias": {"0": -100, "49151": 100},
        "repetition_penalty": 0.5,
        "min_p": 1,
        "min_tokens": 2,
        "bad_words": ["x"],
    }
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


def test_bad_words_become_vllms_token_sequences(served):
    from fluidpd.server.sampling import bad_words_token_ids

    tok = served.runtime.tokenizer
    ids = bad_words_token_ids(tok, ["Paris", " hello world"])
    plain, spaced = tok.encode("Paris", add_special_tokens=False), tok.encode(" Paris", add_special_tokens=False)
    want = [tuple(plain)] + ([tuple(spaced)] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])
    want += [tuple(tok.encode("hello world", add_special_tokens=False))]
    spaced = tok.encode(" hello world", add_special_tokens=False)
    if spaced[0] != want[-1][0] and len(spaced) == len(want[-1]):
        want.append(tuple(spaced))
    assert ids == tuple(want) and len(ids) == 4
