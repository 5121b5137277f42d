"""Admission control: beyond --max-waiting requests waiting for a first token, or a predicted TTFT
over --admit-ttft-factor x SLO_TTFT, a request gets 429 with Retry-After and an OpenAI body; the
admitted ones complete.

Deterministic on any host: the predicted TTFT comes from a prefill speed the test sets (the profile
the coordinator predicts with), and the waiting count from submits made on the server's own event
loop with no step in between. The served fixture runs with admission off; these tests turn it on.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from serverhelp import metric

from fluidpd.core.polynomial import Polynomial
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.api import GenerationRequest, Overloaded

SLOW_PREFILL_S = 10.0  # the prefill speed these tests set: every prompt takes 10 s


@pytest.fixture()
def limited(served):
    rt = served.runtime
    cfg = rt.config
    saved = cfg.max_waiting, cfg.admit_ttft_factor, rt.profile
    yield rt
    cfg.max_waiting, cfg.admit_ttft_factor, rt.profile = saved


def on_server_loop(served, coro):
    """Run `coro` on the server's event loop (where the coordinator runs) and return its result."""
    aloop = served.runtime.cluster.loop.aloop
    return asyncio.run_coroutine_threadsafe(coro, aloop).result()


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


def test_a_predicted_ttft_over_the_slo_is_a_429_with_retry_after(served, limited, model):
    cfg = limited.config
    cfg.admit_ttft_factor = 0.8
    limited.profile = dataclasses.replace(limited.profile, prefill_time=Polynomial((SLOW_PREFILL_S,)))
    assert limited.predicted_ttft(3) == pytest.approx(SLOW_PREFILL_S)  # an idle server: its own prefill only
    body = {"model": model, "prompt": "Tell me a story about the sea", "max_tokens": 4}
    rejected = "fluidpd:request_rejected_overload_total"
    before = metric(httpx.get(served.url + "/metrics").text, rejected)
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) == round(SLOW_PREFILL_S - cfg.admit_ttft_factor * cfg.ttft_slo_s)
    err = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
    assert f"predicted time to first token is {SLOW_PREFILL_S:.1f} s" in err["message"]
    assert metric(httpx.get(served.url + "/metrics").text, rejected) == before + 1

    cfg.admit_ttft_factor = SLOW_PREFILL_S / cfg.ttft_slo_s * 1.1  # the same prediction, now within the limit
    assert httpx.post(served.url + "/v1/completions", json=body, timeout=120).status_code == 200
    cfg.admit_ttft_factor = 0.0  # 0: admission by prediction is off
    limited.profile = dataclasses.replace(limited.profile, prefill_time=Polynomial((1e6,)))
    assert httpx.post(served.url + "/v1/completions", json=body, timeout=120).status_code == 200
