"""The serving runtime end to end: the shared policies drive real engines on the wall clock."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch
from rtbackend_help import FORCED_ONLY, MIGRATE_ALL

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

torch.set_num_threads(1)
pytestmark = pytest.mark.slow  # every test serves through a multi-worker coordinator

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.\nThe waves",
    "Paged attention keeps keys and values in fixed-size blocks. In short,",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the river,",
]
CONFIG = EngineConfig(num_kv_blocks=192, max_model_len=1024, max_num_seqs=16)
CACHE: dict = {}
LANES = 8  # streams kept in flight by the load of the forced-switch test


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs of one plain engine: what every policy must reproduce token for token."""
    model, tok = load_model(CONFIG)
    engine = LLMEngine(CONFIG, model=model, tokenizer=tok)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ids = [tok.encode(p) for p in PROMPTS]
    outs = engine.generate(ids, params)
    from fluidpd.runtime.profile import profile_engine

    CACHE["profile"] = profile_engine(engine, lengths=(16, 64, 256), repeats=2)
    return tok, ids, [o.token_ids for o in outs]


def coordinator(policy, workers, **kw):
    runtime = RuntimeConfig(
        workers=workers,
        policy=policy,
        backend="inprocess",
        admit_ttft_factor=0,  # admission control is not the subject: a slow host must not 429
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=16),
        **kw,
    )
    return build_coordinator(CONFIG, runtime, log=lambda m: None, profile=CACHE["profile"])


async def serve(coord, ids, max_tokens=12, hook=None):
    await coord.start()
    try:
        streams = [
            coord.submit(GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
            for i, p in enumerate(ids)
        ]
        if hook:
            await hook(coord)

        async def collect(s):
            toks, reason = [], None
            async for ev in s:
                toks += ev.token_ids
                reason = ev.finish_reason or reason
            return toks, reason

        return await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), timeout=900)
    finally:
        state = coord.cluster_state()
        await coord.stop()
        serve.last_state = state


@pytest.mark.parametrize("policy,workers", [("colocated", 2), ("static-pd", 2), ("fluidpd", 3)])
def test_every_policy_serves_the_same_greedy_tokens(reference, policy, workers):
    _, ids, expected = reference
    coord = coordinator(policy, workers, tbt_slo_s=0.5)
    results = asyncio.run(serve(coord, ids))
    assert [t for t, _ in results] == expected
    assert all(r == "length" for _, r in results)
    state = serve.last_state
    assert state["policy"] == policy and state["outstanding"] == 0
    assert all(w["kv_blocks_used"] == 0 and w["queue"] == 0 and w["decoding"] == 0 for w in state["workers"])
    for b in coord.backends:
        assert b.engine is None or b.engine.stats().num_used_blocks == 0


def test_a_control_tick_that_raises_is_logged_and_control_goes_on(reference, caplog):
    """One exception from the policy's tick must not end the control loop for good."""
    _, ids, expected = reference
    coord = coordinator("fluidpd", 2, tbt_slo_s=0.5)
    ticks = []

    async def break_one_tick(c):
        policy = c.cluster.policy
        real = policy.tick

        def tick(view):
            ticks.append(view.loop.now)
            if len(ticks) == 1:
                raise RuntimeError("a broken control tick")
            return real(view)

        policy.tick = tick

        async def three_ticks():
            while len(ticks) < 3:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(three_ticks(), timeout=300)  # ticks come every 10 ms: the bound is for a broken loop

    results = asyncio.run(serve(coord, ids, hook=break_one_tick))
    assert [t for t, _ in results] == expected
    assert len(ticks) >= 3 and "a broken control tick" in caplog.text


def test_step_log_records_every_step_with_its_shape_and_times(reference, tmp_path):
    from fluidpd.runtime.steplog import read_step_log

    _, ids, expected = reference
    path = tmp_path / "steps.jsonl"
    coord = coordinator("static-pd", 2, tbt_slo_s=0.5, step_log=str(path))
    results = asyncio.run(serve(coord, ids, max_tokens=6))
    assert [t for t, _ in results] == [e[:6] for e in expected]
    records = read_step_log(str(path))
    prefills = [r for r in records if r.kind == "prefill"]
    decodes = [r for r in records if r.kind == "decode"]
    assert {r.worker for r in prefills} == {0} and {r.worker for r in decodes} == {1}  # 1P:1D
    assert sum(r.shape.prefill_tokens for r in prefills) == sum(len(p) for p in ids)
    # every request's 5 decode tokens after the first (which the prefill made)
    assert sum(r.shape.decode_tokens for r in decodes) == 5 * len(ids)
    assert all(r.wall_s >= r.engine_s > 0 and r.engine_cpu_s > 0 and 1 <= r.busy <= 2 for r in records)
    assert [r.start_s for r in decodes] == sorted(r.start_s for r in decodes)


def test_forced_fluidrole_switch_under_load_loses_no_token(reference):
    _, ids, expected = reference
    coord = coordinator("fluidpd", 3, tbt_slo_s=0.5, fluid=FORCED_ONLY)

    async def switch(c):
        await asyncio.sleep(0.05)
        assert c.cluster_state()["outstanding"] > 0  # the switch starts under load
        c.force_role(1, "prefill")
        with pytest.raises(ValueError):
            c.force_role(1, "colocated")
        while not (ts := c.cluster_state()["transitions"]) or not ts[0]["done"]:  # the streams go on meanwhile
            await asyncio.sleep(0.05)

    results = asyncio.run(serve(coord, ids * 4, max_tokens=12, hook=switch))
    assert [t for t, _ in results] == expected * 4
    (t,) = serve.last_state["transitions"]
    assert t["done"] and t["to"] == "prefill" and set(t["durations_s"]) == {"drain", "remap", "dispatch", "route"}
    assert serve.last_state["workers"][1]["role"] == "prefill"


def test_a_hundred_forced_switches_under_streaming_load_lose_nothing(reference):
    """Streams keep arriving while the admin API switches a worker 100 times (each time one whose
    role has two serving workers): every stream gets the greedy reference tokens, none fails."""
    _, ids, expected = reference
    # every live decode of a draining worker migrates (none is "close enough to finish in place")
    coord = coordinator("fluidpd", 3, tbt_slo_s=0.5, fluid=MIGRATE_ALL)
    switches, results = 100, []

    async def go():
        await coord.start()
        pol, done = coord.cluster.policy, asyncio.Event()

        async def stream(i):
            s = coord.submit(
                GenerationRequest(f"s{i}", ids[i % len(ids)], SamplingParams(max_tokens=12, ignore_eos=True))
            )
            toks, err = [], None
            async for ev in s:
                toks += ev.token_ids
                err = ev.error or err
            results.append((i % len(ids), toks, err))

        async def load(lane: int):  # closed loop: a slow host gets fewer streams, never a backlog
            for i in itertools.count(lane, LANES):
                if done.is_set():
                    return
                await stream(i)

        async def switch():
            for _ in range(switches):
                while pol.switching():
                    await asyncio.sleep(0.005)
                ws = coord.cluster.workers
                roles = [w.role for w in ws]
                # of the two workers sharing a role, the busier one switches: a decode worker with live KV
                wid = max((w for w, r in enumerate(roles) if roles.count(r) == 2), key=lambda w: ws[w].num_decoding)
                coord.force_role(wid, "decode" if roles[wid].value == "prefill" else "prefill")
                await asyncio.sleep(0.02)
            while pol.switching():
                await asyncio.sleep(0.005)
            done.set()

        try:
            await asyncio.wait_for(asyncio.gather(switch(), *(load(k) for k in range(LANES))), timeout=3600)
            return coord.cluster_state(), pol.transitions
        finally:
            await coord.stop()

    state, transitions = asyncio.run(go())
    assert len(transitions) == switches and all(t.done for t in transitions)
    assert sum(len(t.migrated) for t in transitions) > 0  # live KV moved, not only idle switches
    assert results and all(err is None and toks == expected[k] for k, toks, err in results)
    assert state["outstanding"] == 0 and all(w["kv_blocks_used"] == 0 and w["routable"] for w in state["workers"])
    assert sorted(w["role"] for w in state["workers"]).count("decode") in (1, 2)


def test_bad_requests_are_refused_with_a_clear_error(reference):
    coord = coordinator("static-pd", 2)

    async def go():
        await coord.start()
        try:
            with pytest.raises(ValueError, match="max_model_len"):
                coord.submit(GenerationRequest("x", [1] * 1000, SamplingParams(max_tokens=100)))
            with pytest.raises(ValueError, match="empty"):
                coord.submit(GenerationRequest("y", [], SamplingParams(max_tokens=4)))
            with pytest.raises(ValueError, match="no role transitions"):
                coord.force_role(0, "decode")
        finally:
            await coord.stop()

    asyncio.run(go())
