"""What the runtime advertises it can serve, it serves; what one request breaks, breaks that request alone."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator, serving_max_model_len
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.profile import profile_engine
from fluidpd.runtime.steplog import StepRecord
from fluidpd.runtime.worker_main import EngineService

torch.set_num_threads(1)
BLOCKS = 64  # 1,024 tokens of KV per worker


@pytest.fixture(scope="module")
def probe():
    config = EngineConfig(num_kv_blocks=BLOCKS)
    model, tok = load_model(config)
    engine = LLMEngine(config, model=model, tokenizer=tok)
    return engine, profile_engine(engine, lengths=(16, 32, 64), repeats=1)


@pytest.mark.slow
def test_max_model_len_is_capped_by_what_one_worker_holds(probe):
    engine, _ = probe
    n, why = serving_max_model_len(engine, None)
    assert n == BLOCKS * 16 and "capped" in why  # the whole arena (a prefill worker keeps room), not 8192
    assert serving_max_model_len(engine, BLOCKS * 16)[0] == BLOCKS * 16  # an override up to the whole KV
    with pytest.raises(ValueError, match="num-kv-blocks"):
        serving_max_model_len(engine, BLOCKS * 16 + 1)


def test_by_default_a_worker_serves_the_models_whole_context(probe):
    engine, _ = probe
    default = LLMEngine(EngineConfig(), model=engine.model, tokenizer=engine.tokenizer)
    context = engine.model.max_positions
    assert context == 8192 and default.blocks.num_blocks * 16 == context  # KV for one max-length request
    n, why = serving_max_model_len(default, None)
    assert n == context and why.startswith("the model's context")


def cluster(probe, policy: str, workers: int, max_model_len: int | None = None, **runtime_kw):
    _, profile = probe
    config = EngineConfig(num_kv_blocks=BLOCKS, max_model_len=max_model_len)
    runtime = RuntimeConfig(
        workers=workers,
        policy=policy,
        backend="inprocess",
        ttft_slo_s=30,
        tbt_slo_s=5,
        admit_ttft_factor=0,  # admission control is not the subject: a slow host must not 429
        scheduling=PolicyConfig(prefill_workers=1),
        **runtime_kw,
    )
    return build_coordinator(config, runtime, log=lambda m: None, profile=profile)


async def collect(stream) -> tuple[list[int], str | None, str | None]:
    toks, reason, error = [], None, None
    async for ev in stream:
        toks += ev.token_ids
        reason, error = ev.finish_reason or reason, ev.error or error
    return toks, reason, error


def submit(coord, rid: str, ids: list[int], n: int):
    return coord.submit(GenerationRequest(rid, ids, SamplingParams(max_tokens=n, ignore_eos=True)))


@pytest.mark.slow
@pytest.mark.parametrize("override", [None, BLOCKS * 16])
def test_a_request_at_the_advertised_limit_is_served_by_the_cluster(probe, override):
    coord = cluster(probe, "fluidpd", 3, override)
    limit = coord.max_model_len
    ids = [100 + i % 3000 for i in range(limit - 8)]

    async def go():
        await coord.start()
        try:
            with pytest.raises(ValueError, match="max_model_len"):
                submit(coord, "over", ids, 9)
            result = await asyncio.wait_for(collect(submit(coord, "at", ids, 8)), 900)
            return result, coord.cluster_state()
        finally:
            await coord.stop()

    (toks, reason, error), state = asyncio.run(go())
    assert (len(toks), reason, error) == (8, "length", None)
    assert state["failed"] is None and all(w["kv_blocks_used"] == 0 for w in state["workers"])


@pytest.mark.slow
def test_a_request_its_engine_refuses_fails_alone_and_the_cluster_carries_on(probe):
    coord = cluster(probe, "static-pd", 2)
    engine, _ = probe
    poison = 7777
    ids = [[poison, *range(200, 230)], list(range(300, 340)), list(range(400, 420))]
    expected = [o.token_ids for o in engine.generate(ids[1:], SamplingParams(max_tokens=6, ignore_eos=True))]

    async def go():
        await coord.start()
        prefill = coord.backends[0].engine
        real = prefill.add_request

        def refuse(prompt, params=None, request_id=None, **kw):
            if prompt[0] == poison:
                raise ValueError("simulated: the engine refuses this request")
            return real(prompt, params, request_id, **kw)

        prefill.add_request = refuse
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(collect(submit(coord, f"r{i}", p, 6)) for i, p in enumerate(ids))), 900
            )
            again = await asyncio.wait_for(collect(submit(coord, "again", ids[1], 6)), 900)
            return results, again, coord.healthy, coord.cluster_state()
        finally:
            await coord.stop()

    results, again, healthy, state = asyncio.run(go())
    assert results[0][1] == "error" and "refuses" in results[0][2] and not results[0][0]
    assert [r[0] for r in results[1:]] == expected and all(r[1] == "length" for r in results[1:])
    assert again[0] == expected[0] and healthy
    assert state["failed"] is None and all(w["kv_blocks_used"] == 0 for w in state["workers"])


@pytest.mark.slow
def test_a_failed_step_reaches_its_streams_without_internal_text(probe, caplog):
    """The exception (which may quote a worker's pid) goes to the server log, not to clients."""
    coord = cluster(probe, "colocated", 1)

    async def go():
        await coord.start()
        engine = coord.backends[0].engine
        real = engine.run_step

        def boom(plan):
            engine.run_step = real  # once
            raise RuntimeError("worker 0 (pid 4242) hit an internal fault at 0xdeadbeef")

        engine.run_step = boom
        try:
            first = await asyncio.wait_for(collect(submit(coord, "r0", list(range(200, 230)), 6)), 900)
            again = await asyncio.wait_for(collect(submit(coord, "r1", list(range(200, 230)), 6)), 900)
            return first, again
        finally:
            await coord.stop()

    with caplog.at_level("ERROR", logger="fluidpd.runtime"):
        (toks, reason, error), again = asyncio.run(go())
    assert reason == "error" and not toks and error == "the engine failed the step (see the server log)"
    assert "4242" in caplog.text  # the detail is logged server-side
    assert again[1] == "length" and len(again[0]) == 6


CHUNK = 128


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fluidpd", "colocated"])
def test_a_prompt_longer_than_a_chunk_is_prefilled_a_chunk_a_step(probe, policy, tmp_path):
    """No step prefills more than --prefill-chunk-tokens: a long prompt takes several steps, and its
    greedy tokens are the whole prompt's."""
    engine, _ = probe
    ids = [100 + (i * 7) % 3000 for i in range(5 * CHUNK + 40)]
    expected = engine.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    log = tmp_path / "steps.jsonl"
    coord = cluster(probe, policy, 3 if policy == "fluidpd" else 1, prefill_chunk_tokens=CHUNK, step_log=str(log))

    async def go():
        await coord.start()
        try:
            return await asyncio.wait_for(collect(submit(coord, "long", ids, 6)), 900)
        finally:
            await coord.stop()

    toks, reason, _ = asyncio.run(go())
    assert toks == expected and reason == "length"
    steps = [StepRecord.from_json(line) for line in log.read_text().splitlines()]
    prefills = [r.shape.prefill_tokens for r in steps if r.shape.prefill_tokens]
    assert max(prefills) <= CHUNK and sum(prefills) >= len(ids) - CHUNK  # (a cached prefix may skip a block)
    assert len(prefills) >= len(ids) // CHUNK


@pytest.mark.slow
def test_a_prompt_whose_prefill_hangs_every_worker_fails_alone_after_two_timeouts(probe, monkeypatch):
    """A request whose prefill step runs over --step-timeout-s on one worker, then on its next, fails
    visibly instead of taking worker after worker down; the cluster serves the next request."""
    poison_len = 77
    gate = threading.Event()
    run_step = EngineService.run_step

    def hangs_on_poison(self, plan):
        if any(self.engine.seqs[c.request_id].prompt_len == poison_len for c in plan.prefills):
            gate.wait()  # as an engine stuck in a step: until the test ends
        return run_step(self, plan)

    monkeypatch.setattr(EngineService, "run_step", hangs_on_poison)
    others = set(threading.enumerate())  # (a server another test started keeps its worker threads)
    coord = cluster(probe, "fluidpd", 3, step_timeout_s=10.0)

    async def go():
        await coord.start()
        try:
            poisoned = await asyncio.wait_for(
                collect(submit(coord, "poison", list(range(500, 500 + poison_len)), 4)), 900
            )
            after = await asyncio.wait_for(collect(submit(coord, "after", list(range(600, 640)), 4)), 900)
            return poisoned, after, coord.healthy, coord.cluster_state()
        finally:
            gate.set()
            await coord.stop()
            for t in set(threading.enumerate()) - others:  # the lost workers end their step (no torch at exit)
                if t.name.startswith(("fluidpd-worker-", "fluidpd-close-")):
                    await asyncio.to_thread(t.join)

    poisoned, after, healthy, state = asyncio.run(go())
    assert poisoned[1] == "error" and "step timeout on 2 workers" in poisoned[2] and not poisoned[0]
    assert (len(after[0]), after[1]) == (4, "length") and healthy
    assert [loss["reason"] for loss in state["losses"]] == ["a step ran over 10 s"] * 2
