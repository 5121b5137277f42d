"""The node-shared KV store under the real runtime (worker processes): a follow-up turn whose prefix
left every arena is loaded from the store with the same greedy answer, the World's view of the store
matches the engines', its traffic reaches the metrics, a killed worker's sessions still hit the store,
and the store's file goes when the server stops."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from rtbackend_help import served_setup, smol

from fluidpd.core.blockhash import block_hashes
from fluidpd.engine.kvstore.shm import SharedKVStore
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

pytestmark = pytest.mark.slow
BS = 16
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def setup():
    return served_setup(1, 4)


async def _ask(coord, rid: str, ids: list[int]) -> tuple[list[int], int]:
    toks, cached = [], 0
    async for ev in coord.submit(GenerationRequest(rid, ids, PARAMS)):
        assert ev.error is None, ev.error
        toks += ev.token_ids
        cached = ev.cached_tokens if ev.cached_tokens is not None else cached
    return toks, cached


def test_a_follow_up_turn_loads_its_prefix_from_the_node_store_even_after_its_worker_died(setup):
    config, profile, _, _ = setup
    config = replace(config, num_kv_blocks=40, max_model_len=512)
    runtime = RuntimeConfig(
        workers=2, policy="colocated", backend="process", admit_ttft_factor=0, kv_offloading_size=0.05
    )
    coord = build_coordinator(config, runtime, log=lambda m: None, profile=profile)
    path = Path(coord.kv_store)
    ref = smol().reference
    turn1 = [1000 + i for i in range(200)]
    strangers = [[5000 + 400 * k + i for i in range(300)] for k in range(4)]

    async def go():
        await coord.start()
        try:
            a, cached = await _ask(coord, "t1", turn1)
            assert cached == 0
            for k, s in enumerate(strangers):  # 300-token prompts through 40-block arenas: turn 1's blocks leave
                await _ask(coord, f"s{k}", s)
            turn2 = turn1 + a + [3000 + i for i in range(40)]
            hashes = block_hashes(turn2, BS)
            assert all(w.cache.match(hashes, 12) == 0 for w in coord.cluster.workers)  # no arena holds it
            b, cached2 = await _ask(coord, "t2", turn2)
            snap1 = coord.metrics_snapshot()
            written = block_hashes(turn2 + b, BS)[: (len(turn2) + len(b) - 1) // BS]
            store = SharedKVStore(path, 0, ref.arena.block_bytes, repr(ref.kv_layout))
            while store.match(written) < len(written):  # the writer thread copies turn 2's blocks out
                await asyncio.sleep(0.05)
            store.close()
            holder = max(coord.cluster.workers, key=lambda w: w.cache.match(hashes, 99))
            os.kill(coord.backends[holder.id].pid, signal.SIGKILL)  # the worker that holds turn 2 now
            for _ in range(6000):
                if coord.cluster.losses and coord.status()["status"] == "ok":
                    break
                await asyncio.sleep(0.1)
            turn3 = turn2 + b + [3500 + i for i in range(20)]
            c, cached3 = await _ask(coord, "t3", turn3)
            return (turn2, b, cached2), (turn3, c, cached3), snap1, coord.cluster_state(), coord.metrics_snapshot()
        finally:
            await coord.stop()

    (turn2, b, cached2), (turn3, c, cached3), snap1, state, snap = asyncio.run(go())
    expect = ref.generate([turn2, turn3], PARAMS)
    assert b == expect[0].token_ids and c == expect[1].token_ids  # the store's KV gives the same greedy answer
    n = PARAMS.max_tokens
    assert cached2 == (len(turn2) - 40 - 1) // BS * BS  # every full block turn 1 left (prompt and answer)
    store_hits = sum(w["prefix_cache_store_hits"] for w in snap1["workers"])
    assert store_hits == cached2  # all of it loaded from the store, none from an arena
    assert len(state["losses"]) == 1 and state["outstanding"] == 0
    assert cached3 == (len(turn2) + n - 1) // BS * BS  # the dead worker's session: every block of turn 2 hit
    ks = state["kv_store"]
    assert ks["loaded_blocks"] * BS == cached2 + cached3 and ks["checksum_failures"] == 0
    assert ks["offloaded_blocks"] > 0 and 0 < ks["used_blocks"] <= ks["capacity_blocks"]
    assert all(w["prefix_cache"]["corrections"] == 0 for w in state["workers"])  # the World's view was right
    assert snap["kv_tiers"].reuse_gap["store"].count == ks["loaded_blocks"]
    assert not path.exists()  # stop removed the store's file
