"""Heavy input: a body over the limit is a 413 read no further; a maximal body is parsed off the
event loop and a prompt that cannot fit max_model_len is refused before tokenising, so /health keeps
answering meanwhile (how fast: benchmarks/runtime/health_under_load.py). (/tokenize tokenises whatever it
is sent, off the loop: `fluidpd bench` cuts its prompts from a long corpus that way.)"""

from __future__ import annotations

import threading

import httpx
import pytest

import fluidpd.server.body as body_module


def test_a_body_over_the_limit_is_a_413_with_an_openai_body(served):
    limit = served.app.state.server.config.max_body_bytes
    big = '{"prompt": "' + "a" * limit + '", "max_tokens": 1}'
    r = httpx.post(served.url + "/v1/completions", content=big, timeout=60)
    assert r.status_code == 413
    err = r.json()["error"]
    assert "max-body-bytes" in err["message"] and err["code"] == 413
    assert httpx.get(served.url + "/health", timeout=60).status_code == 200


def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(served):
    state = served.app.state.server
    fits = "word " * (served.runtime.max_model_len // 4)  # encodes: then max_tokens decides
    assert httpx.post(served.url + "/tokenize", json={"prompt": fits}, timeout=60).status_code == 200
    n = (served.runtime.max_model_len + 1) * state.token_bytes + 1
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "x" * n, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in r.json()["error"]["message"]


def held(real, entered: threading.Event, release: threading.Event):
    """`real`, but it first says it has started and waits until released (in whatever thread runs it)."""

    def wrapper(*args, **kwargs):
        entered.set()
        release.wait()
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    "route,status,stage",
    [
        ("/v1/completions", 400, "parse"),  # parsed, then refused: it cannot fit max_model_len
        pytest.param("/tokenize", 200, "tokenise", marks=pytest.mark.slow),  # /tokenize tokenises it all
    ],
)
def test_health_answers_while_a_maximal_body_is_handled_off_the_loop(served, monkeypatch, route, status, stage):
    """The body's parse (or tokenisation) is held until /health has answered: were it run on the
    event loop, /health could not answer and this test would fail, however fast the host."""
    limit = served.app.state.server.config.max_body_bytes
    words = "lorem ipsum dolor sit amet " * (limit // 27 - 8)
    body = '{"prompt": "' + words + '", "max_tokens": 1}'
    assert len(body) <= limit
    entered, release = threading.Event(), threading.Event()
    if stage == "parse":
        monkeypatch.setattr(body_module, "_validate", held(body_module._validate, entered, release))
    else:
        tok = served.app.state.server.tokenizer
        monkeypatch.setattr(tok, "encode", held(tok.encode, entered, release))
    reply: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: reply.append(httpx.post(served.url + route, content=body, timeout=600)))
    sender.start()
    try:
        assert entered.wait(600), "the maximal body never reached its parse"
        health = httpx.get(served.url + "/health", timeout=60)  # the held work would block it for ever
    finally:
        release.set()
        sender.join()
    assert health.status_code == 200
    assert [r.status_code for r in reply] == [status]
