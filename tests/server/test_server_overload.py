"""Admission control sheds on the queue in front of a request, never on its own length: an idle
server admits every request that fits the context; a request whose queue would make it miss gets 429
with a Retry-After the queue sets and an OpenAI body; beyond --max-waiting requests waiting for a
first token, 429 too; --admit-max-prefill-s is a hard limit (400 that names it). The admitted
requests complete.

Deterministic on any host: the predicted TTFT comes from a prefill speed the test sets (the profile
the coordinator predicts with), the queue from a worker whose step the test holds until it lets go,
and the waiting count from submits made on the server's own event loop with no step in between. The
served fixture runs with admission off; these tests turn it on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading

import httpx
import pytest
from serverhelp import idle, metric

from fluidpd.core.polynomial import Polynomial
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.admission import queue_budget_s
from fluidpd.runtime.api import GenerationRequest, Overloaded

PER_TOKEN_S = 1.0  # the prefill speed these tests set: every prompt token takes 1 s
PROMPT = "Tell me a story about the sea"  # under one KV block: never a prefix-cache hit
REJECTED = "fluidpd:request_rejected_overload_total"


@pytest.fixture()
def limited(served):
    rt = served.runtime
    cfg = rt.config
    saved = cfg.max_waiting, cfg.admit_ttft_factor, cfg.admit_max_prefill_s, rt.profile
    rt.profile = dataclasses.replace(rt.profile, prefill_time=Polynomial((PER_TOKEN_S, 0.0)))
    yield rt
    cfg.max_waiting, cfg.admit_ttft_factor, cfg.admit_max_prefill_s, rt.profile = saved


def on_server_loop(served, coro):
    """Run `coro` on the server's event loop (where the coordinator runs) and return its result."""
    aloop = served.runtime.cluster.loop.aloop
    return asyncio.run_coroutine_threadsafe(coro, aloop).result()


def estimate(served, ids):
    async def now():
        return served.runtime.ttft_estimate(ids)

    return on_server_loop(served, now())


def prompt_ids(served) -> list[int]:
    return served.runtime.tokenizer.encode(PROMPT)


class HeldWorker:
    """Holds the only worker's engine steps until `release`: what is queued stays queued."""

    def __init__(self, served, monkeypatch):
        service = served.runtime.backends[0].service
        self.gate, run_step = threading.Event(), service.run_step

        def held(plan):
            self.gate.wait()
            return run_step(plan)

        monkeypatch.setattr(service, "run_step", held)

    def release(self) -> None:
        self.gate.set()


def test_beyond_max_waiting_a_request_is_refused_and_the_admitted_complete(served, limited):
    limited.config.max_waiting = 2
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    async def burst():
        admitted = [limited.submit(GenerationRequest(f"w{i}", [1, 2, 3, 4 + i], params)) for i in range(2)]
        with pytest.raises(Overloaded, match="max-waiting 2") as refused:
            limited.submit(GenerationRequest("w2", [1, 2, 3, 9], params))
        tokens = []
        for stream in admitted:
            tokens.append([t async for ev in stream for t in ev.token_ids])
        return refused.value, tokens

    refused, tokens = on_server_loop(served, burst())
    assert refused.retry_after_s >= 1
    assert [len(t) for t in tokens] == [8, 8]


def test_an_idle_server_admits_a_prompt_that_misses_the_slo_on_its_own(served, limited, model):
    cfg = limited.config
    cfg.admit_ttft_factor = 0.8
    ids = prompt_ids(served)
    est = estimate(served, ids)
    assert est.queue_s == 0 and est.own_s == pytest.approx(PER_TOKEN_S * len(ids))
    assert est.own_s > cfg.admit_ttft_factor * cfg.ttft_slo_s  # 8 s predicted, over the 4 s limit
    before = metric(httpx.get(served.url + "/metrics").text, REJECTED)
    r = httpx.post(
        served.url + "/v1/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert metric(httpx.get(served.url + "/metrics").text, REJECTED) == before


def test_a_queue_that_would_make_a_request_miss_is_a_429_with_retry_after(served, limited, model, monkeypatch):
    cfg = limited.config
    cfg.admit_ttft_factor = 0.8
    ids = prompt_ids(served)
    held = HeldWorker(served, monkeypatch)
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def queue_one():
        return limited.submit(GenerationRequest("ahead", list(ids), params))

    ahead = on_server_loop(served, queue_one())
    try:
        est = estimate(served, ids)
        assert est.queue_s == pytest.approx(PER_TOKEN_S * len(ids)) and est.own_s == pytest.approx(est.queue_s)
        budget = queue_budget_s(est.own_s, cfg.admit_ttft_factor * cfg.ttft_slo_s)
        assert budget == pytest.approx(0.5 * cfg.admit_ttft_factor * cfg.ttft_slo_s)  # the floor: it misses anyway
        assert est.queue_s > budget
        before = metric(httpx.get(served.url + "/metrics").text, REJECTED)
        body = {"model": model, "prompt": PROMPT, "max_tokens": 4}
        r = httpx.post(served.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) == math.ceil(est.queue_s - budget)  # the queue drained to the budget
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
        assert f"the queue in front of this request adds a predicted {est.queue_s:.1f} s" in err["message"]
        assert metric(httpx.get(served.url + "/metrics").text, REJECTED) == before + 1

        # a limit whose budget covers the same queue admits it
        cfg.admit_ttft_factor = 2 * est.queue_s / cfg.ttft_slo_s

        async def admitted():
            return limited.submit(GenerationRequest("behind", list(ids), params))

        behind = on_server_loop(served, admitted())
    finally:
        held.release()

    async def drain(stream):
        return [t async for ev in stream for t in ev.token_ids]

    assert [len(on_server_loop(served, drain(s))) for s in (ahead, behind)] == [4, 4]
    assert idle(limited)["num_requests_waiting"] == 0


def test_the_hard_prefill_limit_is_a_400_that_names_it(served, limited, model):
    cfg = limited.config
    cfg.admit_ttft_factor = 0.0  # the hard limit holds with admission by queue off
    cfg.admit_max_prefill_s = 3.0
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "prefill_limit_exceeded" and err["param"] == "prompt"
    assert "--admit-max-prefill-s 3" in err["message"]
    cfg.admit_max_prefill_s = PER_TOKEN_S * len(prompt_ids(served))  # at the limit, not over it
    assert httpx.post(served.url + "/v1/completions", json=body, timeout=120).status_code == 200
