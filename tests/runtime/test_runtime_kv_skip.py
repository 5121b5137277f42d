"""A hand-off sends only the KV blocks the decode worker lacks, on real engines: a follow-up turn
whose context the decode worker still holds moves fewer tokens than its prompt; when that worker's
engine dropped the blocks behind the coordinator's back, the move falls back to the whole KV.
Either way the greedy answer is the single-engine one."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.server.metrics import ServerMetrics

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(900)  # a hang guard, far above the work on a loaded host
CONFIG = EngineConfig(num_kv_blocks=96, max_model_len=512, max_num_seqs=8)
FIRST = "Paged attention keeps keys and values in fixed-size blocks, so a server can share them. In short,"
FOLLOW_UP = "\nWhy does that help a chat session?"
TURN1, TURN2 = 24, 8  # tokens each turn generates
KV_BYTES = "fluidpd:kv_transfer_bytes_total{"


@pytest.fixture(scope="module")
def engine():
    """One plain engine: the reference answers, and the profile the coordinators plan with."""
    from fluidpd.runtime.profile import profile_engine

    model, tok = load_model(CONFIG)
    eng = LLMEngine(CONFIG, model=model, tokenizer=tok)
    eng.profile = profile_engine(eng, lengths=(16, 64, 256), repeats=1)
    return eng


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def static_pd(profile):
    """1 prefill worker (0) and 1 decode worker (1): every request is handed off to worker 1."""
    runtime = RuntimeConfig(
        workers=2,
        policy="static-pd",
        backend="inprocess",
        admit_ttft_factor=0,
        heartbeat_timeout_s=120,  # a loaded host must not lose a worker: loss is not the subject
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=8),
    )
    return build_coordinator(CONFIG, runtime, log=lambda m: None, profile=profile)


async def answer(coord, rid: str, ids: list[int], n: int) -> list[int]:
    toks: list[int] = []
    async for ev in coord.submit(GenerationRequest(rid, ids, greedy(n))):
        assert ev.error is None, ev.error
        toks += ev.token_ids
    return toks


def session(engine, drop_cache: bool):
    """Turn 1, then turn 2 on turn 1's prompt + answer + a follow-up; with `drop_cache` the decode
    worker's engine loses its cached blocks in between (the coordinator does not know).
    Returns both answers, the KV tokens turn 2's hand-off moved (the coordinator's count) and the
    blocks its engines exported, the fallbacks, turn 2's prompt and the final KV-move counters."""
    tok = engine.tokenizer
    coord = static_pd(engine.profile)
    first = tok.encode(FIRST)

    async def run():
        await coord.start()
        try:
            a1 = await answer(coord, "t1", first, TURN1)
            if drop_cache:  # a real re-slice of worker 1's arena, down to one block and back
                decode = coord.backends[1]
                blocks = (await asyncio.wrap_future(decode.submit("stats"))).num_kv_blocks
                await asyncio.wrap_future(decode.submit("resize_kv", 1))
                await asyncio.wrap_future(decode.submit("resize_kv", blocks))
            second = first + a1 + tok.encode(FOLLOW_UP)
            before = coord.cluster_state()["kv_moves"]
            a2 = await answer(coord, "t2", second, TURN2)
            after = coord.cluster_state()["kv_moves"]
            for b in coord.backends:
                assert (await asyncio.wrap_future(b.submit("stats"))).num_used_blocks == 0  # nothing leaked
            page = ServerMetrics(coord, "smol").render().decode()  # what /metrics serves
            after["metric"] = float(next(x for x in page.splitlines() if x.startswith(KV_BYTES)).rsplit(" ", 1)[1])
            sent = (after["sent_bytes"] - before["sent_bytes"]) // engine.arena.block_bytes  # blocks
            return a1, a2, after["tokens"] - before["tokens"], sent, after["fallbacks"], second, after
        finally:
            await coord.stop()

    return asyncio.run(run())


def reference(engine, ids: list[int], n: int) -> list[int]:
    return engine.generate([ids], greedy(n))[0].token_ids


def test_a_follow_up_moves_only_the_blocks_the_decode_worker_lacks(engine):
    a1, a2, moved, sent, fallbacks, second, state = session(engine, drop_cache=False)
    first = engine.tokenizer.encode(FIRST)
    assert a1 == reference(engine, first, TURN1)
    assert a2 == reference(engine, second, TURN2)
    bs = CONFIG.block_size
    held = (len(first) + TURN1 - 1) // bs  # turn 1's stored KV on the decode worker, in full blocks
    assert held >= 2
    assert moved == len(second) - held * bs < len(second)  # turn 2's stored KV is its prompt
    assert sent == -(-len(second) // bs) - held  # the source exported only the blocks worker 1 lacked
    assert fallbacks == 0
    assert state["bytes"] == pytest.approx(state["tokens"] * engine.arena.block_bytes / bs)
    assert state["metric"] == pytest.approx(state["bytes"]) and state["bytes"] > 0


def test_a_move_whose_skipped_blocks_were_evicted_sends_them_all(engine):
    a1, a2, moved, sent, fallbacks, second, _ = session(engine, drop_cache=True)
    assert a1 == reference(engine, engine.tokenizer.encode(FIRST), TURN1)
    assert a2 == reference(engine, second, TURN2)
    bs = CONFIG.block_size
    assert fallbacks == 1
    assert moved == len(second)  # the whole prompt's KV travelled
    held, blocks = (len(engine.tokenizer.encode(FIRST)) + TURN1 - 1) // bs, -(-len(second) // bs)
    assert sent == (blocks - held) + blocks  # the refused partial payload, then the whole one
