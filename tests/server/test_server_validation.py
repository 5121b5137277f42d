"""Bad request bodies over HTTP: each is a 400 naming the field, and the server serves the next request."""

from __future__ import annotations

import httpx
import pytest

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Hi"}]


def _post(served, path: str, content: bytes, content_type: str | None = "application/json") -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    return httpx.post(served.url + path, content=content, headers=headers, timeout=60)


def _error(r: httpx.Response, param: str | None) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, 400), err
    return err


def _still_serves(served) -> None:
    r = httpx.post(
        served.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, timeout=60
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text


# ---------------------------------------------------------------------- bodies and Content-Type


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_is_json_whatever_the_content_type(served, content_type):
    r = _post(served, "/v1/completions", b'{"prompt": "The capital of France is", "max_tokens": 2}', content_type)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    r = _post(served, "/tokenize", b'{"prompt": "Paris"}', content_type)
    assert r.status_code == 200 and r.json()["tokens"] == served.runtime.tokenizer.encode("Paris")


@pytest.mark.parametrize(
    "content, says",
    [
        (b"prompt=hi&max_tokens=2", "not valid JSON"),
        (b'{"prompt": "hi",', "not valid JSON"),
        (b'{"prompt": "hi", "temperature": NaN}', "NaN is not a JSON value"),
        (b"", "empty"),
        (b'"hi"', "JSON object"),
        (b"[1, 2]", "JSON object"),
        (b"\xff\xfe\xfa", "JSON"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400(served, content, says):
    err = _error(_post(served, "/v1/completions", content, "application/x-www-form-urlencoded"), None)
    assert says in err["message"]
    _still_serves(served)


# ---------------------------------------------------------------------- lone surrogates


@pytest.mark.parametrize(
    "path, content, param, where",
    [
        ("/v1/completions", b'{"prompt": "hi \\ud800 there", "max_tokens": 2}', "prompt", "prompt"),
        ("/v1/completions", b'{"prompt": ["\\udfff"], "max_tokens": 2}', "prompt", "prompt.0"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "stop": ["ok", "\\ud800"]}', "stop", "stop.1"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "model": "\\ud800"}', "model", "model"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "user": "\\udc00"}', "user", "user"),
        ("/v1/completions", b'{"prompt": "\xed\xa0\x80", "max_tokens": 2}', "prompt", "prompt"),  # as raw bytes
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\ud83d"}], "max_tokens": 2}',
            "messages",
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\ud800"}]}]}',
            "messages",
            "messages.0.content.0.text",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "\\ud800", "content": "hi"}]}',
            "messages",
            "messages.0.role",
        ),
        ("/tokenize", b'{"prompt": "\\ud800"}', "prompt", "prompt"),
        ("/tokenize", b'{"messages": [{"role": "user", "content": "\\ude00"}]}', "messages", "messages.0.content"),
    ],
)
def test_a_lone_surrogate_is_400_naming_the_field(served, path, content, param, where):
    err = _error(_post(served, path, content), param)
    assert err["message"].startswith(f"{where} is not valid Unicode"), err
    _still_serves(served)


def test_a_surrogate_pair_is_valid_unicode(served):
    r = _post(served, "/tokenize", b'{"prompt": "rocket \\ud83d\\ude80"}')
    assert r.status_code == 200 and r.json()["tokens"] == served.runtime.tokenizer.encode("rocket \U0001f680")


def test_a_lone_surrogate_in_a_key_is_400_naming_it_escaped(served):
    err = _error(_post(served, "/v1/completions", b'{"prompt": "hi", "\\ud800": 1}'), "\\ud800")
    assert "not valid Unicode" in err["message"]
    _still_serves(served)


# ---------------------------------------------------------------------- token ids


def test_vocab_size_is_smollm2s(served):
    assert served.runtime.tokenizer.vocab_size == 49152


@pytest.mark.parametrize(
    "prompt, bad", [([49152], 49152), ([999999], 999999), ([-1, 5], -1), ([5, 2**40], 2**40), ([[7, 49152]], 49152)]
)
def test_out_of_vocabulary_token_ids_are_400(served, prompt, bad):
    r = httpx.post(served.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
    err = _error(r, "prompt")
    assert f"= {bad} is not a token id" in err["message"] and "49152 tokens" in err["message"]
    _still_serves(served)


def test_the_last_token_id_is_in_the_vocabulary(served):
    r = httpx.post(served.url + "/v1/completions", json={"prompt": [1, 49151], "max_tokens": 1}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2, r.text


@pytest.mark.parametrize("tokens", [[-1], [49152], [1, 10**12]])
def test_detokenize_out_of_vocabulary_is_400(served, tokens):
    err = _error(httpx.post(served.url + "/detokenize", json={"tokens": tokens}, timeout=60), "tokens")
    assert "is not a token id" in err["message"]
    assert httpx.post(served.url + "/detokenize", json={"tokens": [1, 2]}, timeout=60).status_code == 200


# ---------------------------------------------------------------------- sampling parameters

COMPLETION_ERRORS = [
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("temperature", -0.5),
    ("temperature", 2.5),
    ("temperature", "nan"),
    ("temperature", "inf"),
    ("top_p", 0),
    ("top_p", 1.01),
    ("top_p", -1),
    ("top_k", -2),
    ("top_k", 1.5),
    ("seed", 2**64),
    ("seed", -(2**63) - 1),
    ("stop", ""),
    ("stop", [""]),
    ("stop", ["ok", ""]),
    ("stop_token_ids", ["x"]),
    ("logprobs", -1),
    ("logprobs", 21),
    ("ignore_eos", "maybe"),
    ("n", 0),
    ("n", 17),
    ("best_of", 3),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3),
    ("logit_bias", {"5": 101}),
    ("logit_bias", {"not-a-token": 1}),
    ("prompt_logprobs", 21),
    ("max_tokens", 0),  # without echo: nothing to answer
    ("suffix", "x"),
    ("no_such_field", 1),  # never silently ignored
    ("response_formats", {"type": "json_object"}),  # a misspelt field names itself
]


@pytest.mark.parametrize("field, value", COMPLETION_ERRORS)
def test_every_completion_sampling_error_is_400_naming_the_param(served, field, value):
    body = {"prompt": "hi", "max_tokens": 2, field: value}
    err = _error(httpx.post(served.url + "/v1/completions", json=body, timeout=60), field)
    assert field in err["message"]


CHAT_ERRORS = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": 4, "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": -7}, "top_k"),
    ({"seed": 2**70}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
]


@pytest.mark.parametrize("extra, param", CHAT_ERRORS)
def test_every_chat_sampling_error_is_400_naming_the_param(served, extra, param):
    body = {"messages": CHAT, **extra}
    err = _error(httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60), param)
    assert param in err["message"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": "MAX"}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**30}, "max_tokens"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": "MAX"}, "max_tokens"),
        ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": "MAX"}, "max_completion_tokens"),
        ("/v1/completions", {"prompt": "LONG", "max_tokens": 1}, "prompt"),
        ("/v1/chat/completions", {"messages": "LONG"}, "messages"),
    ],
)
def test_too_many_tokens_is_context_length_exceeded(served, path, body, param):
    n = served.runtime.max_model_len
    long = "hello " * (n + 10)
    fill = {"MAX": n, "LONG": [{"role": "user", "content": long}] if path.endswith("chat/completions") else long}
    body = {k: fill.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    r = httpx.post(served.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", param)
    assert "maximum context length" in err["message"]


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 2.0, "seed": 7},
        {"temperature": 0},
        {"top_p": 1.0, "top_k": -1},
        {"top_k": 0},
        {"seed": -1, "temperature": 1.0},
        {"seed": 2**64 - 1, "temperature": 1.0},
        {"seed": -(2**63), "temperature": 1.0},
        {"logprobs": 20},
        {"logprobs": 0},
        {"stop": "x", "stop_token_ids": [5]},
    ],
)
def test_the_edges_of_the_ranges_are_accepted(served, extra):
    r = httpx.post(served.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, **extra}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("temperature", [5e-324, 1.2e-38, 1e-6])
def test_a_tiny_temperature_samples_greedily(served, temperature):
    # found by the fuzz: logits / 1.2e-38 overflowed float32 and failed the engine step (a 500)
    kw = {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
    greedy = httpx.post(served.url + "/v1/completions", json={**kw, "temperature": 0}, timeout=60).json()
    r = httpx.post(served.url + "/v1/completions", json={**kw, "temperature": temperature, "seed": 3}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_a_negative_seed_samples_as_its_64_bit_fold(served):
    kw = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0}
    a = httpx.post(served.url + "/v1/completions", json={**kw, "seed": -1}, timeout=60).json()
    b = httpx.post(served.url + "/v1/completions", json={**kw, "seed": 2**64 - 1}, timeout=60).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
