"""n > 1 requests through the runtime: one world Request, choices streamed by index, one prefill whose
KV crosses a P/D hand-off once, and a lost worker under a group (it restarts elsewhere, none repeated)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rtbackend_help import MIGRATE_ALL

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

torch.set_num_threads(1)
pytestmark = pytest.mark.slow  # each test serves through a coordinator of in-process engines

PROMPT = "Paged attention keeps keys and values in fixed-size blocks. In short, it"  # 17 tokens: a partial block
CONFIG = EngineConfig(num_kv_blocks=192, max_model_len=1024, max_num_seqs=16)
MAX_TOKENS = 12
CACHE: dict = {}


@pytest.fixture(scope="module")
def reference():
    """The prompt's ids and its greedy n = 1 tokens on a plain engine."""
    model, tok = load_model(CONFIG)
    engine = LLMEngine(CONFIG, model=model, tokenizer=tok)
    ids = tok.encode(PROMPT)
    out = engine.generate([ids], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    from fluidpd.runtime.profile import profile_engine

    CACHE["profile"] = profile_engine(engine, lengths=(16, 64, 256), repeats=2)
    return ids, list(out.token_ids)


def coordinator(policy: str, workers: int, **kw):
    runtime = RuntimeConfig(
        workers=workers,
        policy=policy,
        **kw,
        backend="inprocess",
        admit_ttft_factor=0,
        tbt_slo_s=0.5,
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=16),
    )
    return build_coordinator(CONFIG, runtime, log=lambda m: None, profile=CACHE["profile"])


async def serve(coord, ids, n: int, fault=None):
    """Stream one n-choice request (and an n = 1 one beside it); per choice (tokens, finish reasons)."""
    await coord.start()
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, n=n)
        group = coord.submit(GenerationRequest("g", ids, params))
        single = coord.submit(GenerationRequest("s", ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)))
        choices: dict[int, list[int]] = {}
        reasons: dict[int, list[str]] = {}
        faulted = []

        async def collect_group():
            async for ev in group:
                choices.setdefault(ev.index, []).extend(ev.token_ids)
                if ev.finish_reason is not None:
                    reasons.setdefault(ev.index, []).append(ev.finish_reason)
                if fault is not None and not faulted and sum(map(len, choices.values())) >= 2 * n:
                    faulted.append(fault(coord))

        async def collect_single():
            return [t async for ev in single for t in ev.token_ids]

        _, alone = await asyncio.wait_for(asyncio.gather(collect_group(), collect_single()), timeout=900)
        state = coord.cluster_state()
        used = [b.engine.stats().num_used_blocks for b in coord.backends if b.engine is not None]
        serve.sent_blocks = coord.cluster.kv_bytes_sent // coord.backends[0].engine.arena.block_bytes
        return choices, reasons, alone, state, used, faulted
    finally:
        await coord.stop()


@pytest.mark.parametrize("policy,workers", [("colocated", 1), ("static-pd", 2)])
def test_group_streams_n_choices_equal_to_a_single_greedy_request(reference, policy, workers):
    ids, expected = reference
    coord = coordinator(policy, workers)
    choices, reasons, alone, state, used, _ = asyncio.run(serve(coord, ids, 3))
    assert alone == expected
    assert choices == {0: expected, 1: expected, 2: expected}
    assert reasons == {0: ["length"], 1: ["length"], 2: ["length"]}  # one finish event per choice
    assert state["outstanding"] == 0
    assert all(w["kv_blocks_used"] == 0 and w["decoding"] == 0 for w in state["workers"])
    assert used and all(u == 0 for u in used)
    assert len(ids) % CONFIG.block_size  # (a fork before the hand-off would send a copy of it per choice)
    if policy == "static-pd":  # each request's prompt KV crossed once, the group's too: the decode worker forks
        assert 1 <= serve.sent_blocks <= 2 * -(-len(ids) // CONFIG.block_size)


def test_a_lost_worker_under_a_group_restarts_it_elsewhere(reference):
    ids, expected = reference
    coord = coordinator("colocated", 2)

    def lose(c):
        wid = c.cluster.live[0].request.worker  # the group's (request 0) worker
        c.cluster.worker_down(wid, "test: lost")
        return wid

    choices, reasons, alone, state, used, faulted = asyncio.run(serve(coord, ids, 4, lose))
    assert faulted and state["losses"][0]["worker"] == faulted[0]
    assert alone == expected
    assert [len(choices[j]) for j in range(4)] == [MAX_TOKENS] * 4, choices
    assert choices == dict.fromkeys(range(4), expected)  # none lost, none repeated
    assert reasons == {j: ["length"] for j in range(4)}
    assert state["outstanding"] == 0
    assert state["losses"][0]["restarted"] >= 1
    assert all(w["kv_blocks_used"] == 0 and w["decoding"] == 0 for w in state["workers"])
    assert used and all(u == 0 for u in used)  # every engine serving at the end (the replacement too)


def test_a_fluidrole_switch_migrates_a_decoding_group_whole(reference):
    ids, expected = reference
    coord = coordinator("fluidpd", 3, fluid=MIGRATE_ALL)
    moved = []

    def switch(c):
        req = c.cluster.live[0].request  # the group
        if c.cluster.workers[req.worker].role.value != "decode":
            return None
        c.force_role(req.worker, "prefill")
        moved.append(req)
        return req.worker

    choices, reasons, alone, state, used, _ = asyncio.run(serve(coord, ids, 3, switch))
    assert moved and moved[0].migrations >= 1  # its KV moved, every choice with it
    assert alone == expected
    assert choices == dict.fromkeys(range(3), expected)
    assert reasons == {j: ["length"] for j in range(3)}
    assert all(w["kv_blocks_used"] == 0 for w in state["workers"])
    assert used and all(u == 0 for u in used)
