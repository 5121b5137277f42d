"""Heavy input: a body over the limit is a 413 read no further; a maximal body is parsed off the
event loop and a prompt that cannot fit max_model_len is refused before tokenising, so /health keeps
answering within 100 ms meanwhile. (/tokenize tokenises whatever it is sent, off the loop: `fluidpd
bench` cuts its prompts from a long corpus that way.)"""

from __future__ import annotations

import threading
import time

import httpx
import pytest


def test_a_body_over_the_limit_is_a_413_with_an_openai_body(served):
    limit = served.app.state.server.config.max_body_bytes
    big = '{"prompt": "' + "a" * limit + '", "max_tokens": 1}'
    r = httpx.post(served.url + "/v1/completions", content=big, timeout=60)
    assert r.status_code == 413
    err = r.json()["error"]
    assert "max-body-bytes" in err["message"] and err["code"] == 413
    assert httpx.get(served.url + "/health", timeout=5).status_code == 200


def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(served):
    state = served.app.state.server
    fits = "word " * (served.runtime.max_model_len // 4)  # encodes: then max_tokens decides
    assert httpx.post(served.url + "/tokenize", json={"prompt": fits}, timeout=60).status_code == 200
    n = (served.runtime.max_model_len + 1) * state.token_bytes + 1
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "x" * n, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "route,status",
    [("/v1/completions", 400), pytest.param("/tokenize", 200, marks=pytest.mark.slow)],  # /tokenize tokenises it all
)
def test_health_answers_fast_while_maximal_bodies_are_handled(served, route, status):
    limit = served.app.state.server.config.max_body_bytes
    words = "lorem ipsum dolor sit amet " * (limit // 27 - 8)
    body = '{"prompt": "' + words + '", "max_tokens": 1}'
    assert len(body) <= limit
    statuses, stop = [], threading.Event()

    def hammer():
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                statuses.append(c.post(served.url + route, content=body).status_code)

    workers = [threading.Thread(target=hammer) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.3)
    lags = []
    with httpx.Client(timeout=5) as c:
        for _ in range(30):
            t0 = time.perf_counter()
            assert c.get(served.url + "/health").status_code == 200
            lags.append(time.perf_counter() - t0)
            time.sleep(0.05)
    stop.set()
    for w in workers:
        w.join()
    assert len(statuses) >= 2 and set(statuses) == {status}  # completions: refused, cannot fit max_model_len
    assert sorted(lags)[-2] < 0.1, lags  # the second worst: one GC pause is not the event loop
