"""Admission control: beyond --max-waiting requests waiting for a first token, or a predicted TTFT
over --admit-ttft-factor x SLO_TTFT, a request gets 429 with Retry-After and an OpenAI body; the
admitted ones complete."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.api import GenerationRequest, Overloaded


@pytest.fixture()
def limited(served):
    cfg = served.runtime.config
    saved = cfg.max_waiting, cfg.admit_ttft_factor
    yield cfg
    cfg.max_waiting, cfg.admit_ttft_factor = saved


def test_beyond_max_waiting_a_request_gets_429_with_retry_after(served, limited, model):
    limited.max_waiting = 2

    async def burst():
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"model": model, "prompt": "Tell me a story about the sea", "max_tokens": 8, "ignore_eos": True}
            return await asyncio.gather(*(c.post(served.url + "/v1/completions", json=body) for _ in range(8)))

    rs = asyncio.run(burst())
    codes = [r.status_code for r in rs]
    assert 200 in codes and 429 in codes, codes
    r429 = next(r for r in rs if r.status_code == 429)
    assert int(r429.headers["Retry-After"]) >= 1
    err = r429.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and "max-waiting" in err["message"]
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in rs if r.status_code == 200)
    assert b"request_rejected_overload_total" in httpx.get(served.url + "/metrics").content


def test_a_predicted_ttft_far_over_the_slo_is_refused(served, limited):
    rt = served.runtime
    limited.admit_ttft_factor = 1e-6  # any queued or own prefill work is too much
    with pytest.raises(Overloaded, match="predicted time to first token"):
        rt.submit(GenerationRequest("x", [1, 2, 3], SamplingParams(max_tokens=1)))
    limited.admit_ttft_factor = 0.0  # 0: admission by prediction is off
    assert rt.predicted_ttft(3) > 0
