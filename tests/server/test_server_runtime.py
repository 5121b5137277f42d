"""The one-worker runtime through the ServingRuntime protocol, without HTTP (on the server's event loop)."""

from __future__ import annotations

import asyncio

import pytest

from fluidpd.runtime.api import GenerationRequest


@pytest.fixture()
def local(served):
    rt = served.runtime

    def run(coro_fn, timeout_s: float = 60.0):
        async def wrapped():
            return await coro_fn(rt)

        return asyncio.run_coroutine_threadsafe(wrapped(), rt.cluster.loop.aloop).result(timeout_s)

    return rt, run


def _params(**kw):
    from fluidpd.engine import SamplingParams

    return SamplingParams(**kw)


def test_submit_streams_tokens_and_finishes(local):
    rt, run = local
    ids = rt.tokenizer.encode("The capital of France is")

    async def go(rt):
        stream = rt.submit(GenerationRequest("lr-1", ids, _params(max_tokens=3, ignore_eos=True)))
        return [e async for e in stream]

    events = run(go)
    assert sum(len(e.token_ids) for e in events) == 3
    assert [e.finish_reason for e in events][-1] == "length"
    assert all(e.finish_reason is None for e in events[:-1])


def test_submit_rejects_what_can_never_run(local):
    _, run = local

    async def go(rt):
        errors = []
        for rid, ids in (("lr-long", [1] * (rt.max_model_len + 1)), ("lr-empty", []), ("lr-vocab", [10**9])):
            try:
                rt.submit(GenerationRequest(rid, ids, _params()))
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    errors = run(go)
    assert len(errors) == 3 and "max_model_len" in errors[0] and "empty" in errors[1]
    assert "10000000000" not in errors[2] and "1000000000" in errors[2] and "vocabulary" in errors[2]


def test_abort_ends_the_stream(local):
    _, run = local

    async def go(rt):
        stream = rt.submit(
            GenerationRequest(
                "lr-abort", rt.tokenizer.encode("Tell me a story"), _params(max_tokens=200, ignore_eos=True)
            )
        )
        events = []
        async for e in stream:
            events.append(e)
            if len(events) == 2:
                await stream.abort()
        return events

    events = run(go)
    assert events[-1].finish_reason == "abort"
    assert sum(len(e.token_ids) for e in events) < 200


def test_cluster_state_and_force_role(local):
    rt, _ = local
    state = rt.cluster_state()
    assert state["policy"] == "colocated" and len(state["workers"]) == 1
    assert state["workers"][0]["role"] == "colocated"
    with pytest.raises(ValueError, match="no role transitions"):
        rt.force_role(0, "prefill")
    with pytest.raises(KeyError):
        rt.force_role(1, "prefill")
    snap = rt.metrics_snapshot()
    assert {"num_requests_running", "num_requests_waiting", "workers"} <= set(snap)
    assert snap["workers"][0]["role"] == "colocated" and snap["workers"][0]["prefix_cache_queries"] >= 0
    assert snap["prefill_pressure_index"] >= 0 and snap["decode_pressure_index"] >= 0
