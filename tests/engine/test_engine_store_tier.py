"""The engine's second KV tier on SmolLM2: a prompt evicted from a small arena is loaded back from the
node-shared store (on this engine or another on the same store) with the same greedy answer and
logprobs; a block that fails its checksum is recomputed; the step reports the tiers' traffic."""

from __future__ import annotations

import uuid

import pytest
from engine_testdata import PROMPTS

from fluidpd.engine import PrefillChunk, SamplingParams, StepPlan
from fluidpd.engine.kvstore.shm import SharedKVStore, default_dir

BS = 16
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=1)


@pytest.fixture
def store_path():
    p = default_dir() / f"fluidpd-test-kv-{uuid.uuid4().hex[:8]}"
    yield str(p)
    SharedKVStore.unlink(p)


@pytest.fixture(scope="module")
def prompt(smol):
    ids = smol[1].encode(" ".join(PROMPTS) * 4)[:200]
    assert len(ids) == 200
    return ids


def _others(n: int) -> list[list[int]]:
    return [[1000 + 300 * k + i for i in range(200)] for k in range(n)]


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert all(abs(x.logprob - y.logprob) < 1e-3 for x, y in zip(a.logprobs, b.logprobs))


def test_an_evicted_prompt_comes_back_from_the_store(make_engine, store_path, prompt):
    ref = make_engine(num_kv_blocks=32, enable_prefix_caching=False).generate([prompt], PARAMS)[0]
    eng = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    first = eng.generate([prompt], PARAMS)[0]
    eng.generate(_others(3), PARAMS)  # 39 blocks through a 32-block arena: the prompt's are evicted
    assert eng.cached_prefix_tokens(prompt) == 0
    again = eng.generate([prompt], PARAMS)[0]
    assert again.num_cached_tokens == (len(prompt) - 1) // BS * BS
    _same(first, ref)
    _same(again, ref)
    st = eng.stats()
    assert st.prefix_cache_store_hits == again.num_cached_tokens and st.kv_store_blocks >= 12 + 3 * 12
    # another engine (another worker of the node) on the same store hits it too
    other = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    _same(other.generate([prompt], PARAMS)[0], ref)
    assert other.stats().prefix_cache_store_hits == (len(prompt) - 1) // BS * BS
    eng.close()
    other.close()


def test_a_block_that_fails_its_check_is_recomputed(make_engine, store_path, prompt):
    ref = make_engine(num_kv_blocks=32, enable_prefix_caching=False).generate([prompt], PARAMS)[0]
    eng = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    eng.generate([prompt], PARAMS)
    store = eng.tier.store
    hashes = eng.blocks.hashes(prompt, 12, [])
    store._data[store._slots_of([hashes[5]])[hashes[5]], 7] ^= 0x40  # host memory went bad under block 5
    fresh = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    out = fresh.generate([prompt], PARAMS)[0]
    _same(out, ref)  # blocks 5.. recomputed, never served
    assert out.num_cached_tokens == 5 * BS and fresh.tier.store.stats.checksum_failures == 1
    eng.close()
    fresh.close()


def test_a_planned_hit_loads_from_the_store_and_the_step_reports_it(make_engine, store_path, prompt):
    eng = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    eng.generate([prompt], PARAMS)
    other = make_engine(num_kv_blocks=32, kv_store=store_path, kv_store_bytes=64 << 20)
    rid = other.add_request(prompt, PARAMS)
    cached = 10 * BS  # the coordinator planned 10 cached blocks (none in this arena)
    res = other.run_step(StepPlan(prefills=[PrefillChunk(rid, len(prompt) - cached, cached)]))
    (out,) = res.outputs
    assert out.num_cached_tokens == out.num_loaded_tokens == cached and len(out.new_token_ids) == 1
    act = res.kv_tiers
    assert act is not None and act.loaded_blocks == 10 and act.loaded_bytes == 10 * other.arena.block_bytes
    assert act.reuse_gaps_s["store"] and len(act.reuse_gaps_s["store"]) == 10
    eng.close()
    other.close()
