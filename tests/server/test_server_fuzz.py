"""Fuzz: schemathesis sends every operation of the app's own OpenAPI schema (/openapi.json) requests
made from it, valid and not: none is a 5xx or hangs, and the server is healthy afterwards (/health
ok, a completion served, no request outstanding, no KV block in use).

Generation is bounded meanwhile by serving a max_model_len of MAX_MODEL_LEN (prompt + completion):
no request takes more than a few seconds on a CPU.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

from fluidpd.server.app import ROUTERS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a hang guard, far above the work

MAX_MODEL_LEN = 48
TIMEOUT_S = 10  # per request: the longest here takes ~2 s
STREAM_EVENTS = 20  # schemathesis reads this many SSE events, then goes away (an abort)
# per operation, half as many for the two generation routes (up to a second each); a deeper run:
# FLUIDPD_FUZZ_EXAMPLES=1000 (the tiny-temperature bug took some 600)
EXAMPLES = int(os.environ.get("FLUIDPD_FUZZ_EXAMPLES", "100"))
OPERATIONS = [f"{m} {r.path}" for router in ROUTERS for r in router.routes for m in sorted(r.methods)]
# Not checked: a schema-valid request may still be refused (a 400 for a prompt beyond max_model_len,
# 404 for another model), and pydantic's lax mode (as vLLM's) reads 0.0 as false or "2" as 2
EXCLUDED = [positive_data_acceptance, negative_data_rejection]


@pytest.fixture(scope="module")
def fuzzed(served):
    """The test server, serving max_model_len MAX_MODEL_LEN meanwhile."""
    rt = served.runtime
    saved, rt.max_model_len = rt.max_model_len, MAX_MODEL_LEN
    yield served
    rt.max_model_len = saved


@pytest.fixture(scope="module")
def api(fuzzed):
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    schema.config.max_stream_events = STREAM_EVENTS
    return schema


def _streamed(case):
    """`case` asking for SSE (few generated bodies do)."""
    if isinstance(case.body, dict):
        case.body["stream"] = True
    return case


class Hung(BaseException):
    """A request unanswered within TIMEOUT_S: raised past hypothesis, which would resend it for
    minutes while shrinking it."""


def sse_without_errors(ctx, response, case):
    """A stream (a 200 sent before any token) has no error event, a 5xx in disguise, and ends in
    [DONE], or is cut short after STREAM_EVENTS: cut short before, it went silent (a hang)."""
    if not "".join(response.headers.get("content-type", ())).startswith("text/event-stream"):
        return None
    events = [e[len("data: ") :] for e in response.text.split("\n\n") if e.startswith("data: ")]
    errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert not errors, errors
    if response.stream_cut_short and len(events) < STREAM_EVENTS:
        raise Hung(f"the stream went silent after {len(events)} events: {case.as_curl_command()}")
    assert response.stream_cut_short or events[-1:] == ["[DONE]"], response.text[-500:]
    return True


def test_every_operation_is_fuzzed(api):
    ops = [result.ok() for result in api.get_all_operations()]
    assert sorted(f"{op.method.upper()} {op.path}" for op in ops) == sorted(OPERATIONS)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_no_request_is_a_server_error_or_hangs(fuzzed, api, operation):
    method, path = operation.split(" ", 1)
    op = api[path][method]
    valid = op.as_strategy(GenerationMode.POSITIVE)
    cases = st.one_of(valid, valid.map(_streamed), op.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES // 2 if path.endswith("completions") else EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case):
        try:
            case.call_and_validate(
                base_url=fuzzed.url,
                timeout=TIMEOUT_S,
                excluded_checks=EXCLUDED,
                additional_checks=[sse_without_errors],
            )
        except requests.Timeout:
            raise Hung(f"no answer in {TIMEOUT_S} s: {case.as_curl_command(base_url=fuzzed.url)}") from None

    call()


def test_the_server_is_healthy_after_the_fuzz(fuzzed):
    r = httpx.get(fuzzed.url + "/health", timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    r = httpx.post(fuzzed.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    rt, deadline = fuzzed.runtime, time.monotonic() + 300  # an abort is finished off the request
    while True:
        state = rt.cluster_state()
        used = [w["kv_blocks_used"] for w in state["workers"]]
        engines = [e for e in (getattr(b, "engine", None) for b in rt.backends) if e is not None]  # in-process
        idle = state["outstanding"] == 0 and not any(used) and not any(e.blocks.num_used for e in engines)
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert state["outstanding"] == 0 and not any(used), state
    assert [e.blocks.num_used for e in engines] == [0] * len(engines)
    assert not any(e.has_unfinished() for e in engines)
    snap = rt.metrics_snapshot()
    assert (snap["num_requests_running"], snap["num_requests_waiting"]) == (0, 0), snap
