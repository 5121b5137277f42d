"""Prefix caching on SmolLM2 (paged attention path): greedy outputs and logprobs with the cache equal
those without it, whichever way a request runs; the counters count first admissions only."""

from __future__ import annotations

import argparse
import pickle

import pytest
import torch
from engine_testdata import PROMPTS
from engine_tolerance import logits_tol

from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.engine import EngineConfig, PrefillChunk, SamplingParams, StepPlan
from fluidpd.engine.outputs import RequestOutput

BS = 16
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def enc(smol):
    return smol[1].encode


@pytest.fixture(scope="module")
def system(enc):
    """47 shared tokens: two full blocks and 15 tokens of a third."""
    ids = enc(PROMPTS[4])
    assert len(ids) == 47
    return ids


@pytest.fixture(scope="module")
def same(make_engine, system):
    """assert_same(on, off): equal tokens, logprobs within the rounding bound of two forwards."""
    eng = make_engine(num_kv_blocks=8, enable_prefix_caching=False)
    scale = eng.prompt_logits(system).abs().max().item()
    cfg = eng.model_config
    norm_tol = cfg.vocab_size * torch.finfo(torch.float32).eps

    def check(on, off):
        assert on.token_ids == off.token_ids
        # two forwards of different batch shapes: logits within 2 logits_tol, log_softmax within twice that
        tol = 4 * logits_tol(cfg, len(on.prompt_token_ids) + len(on.token_ids), torch.float32, scale) + norm_tol
        assert len(on.logprobs) == len(off.logprobs) == len(on.token_ids)
        for a, b in zip(on.logprobs, off.logprobs):
            assert abs(a.logprob - b.logprob) <= tol

    return check


def drain(eng) -> tuple[dict, dict]:
    """Step the built-in scheduler to the end: (request id -> RequestOutput, request id -> cached tokens reported)."""
    outs, cached = {}, {}
    while eng.has_unfinished():
        for o in eng.step():
            cached[o.request_id] = cached.get(o.request_id, 0) + o.num_cached_tokens
            if o.finished:
                outs[o.request_id] = o.output
    return outs, cached


def run(eng, prompt, params=PARAMS):
    rid = eng.add_request(prompt, params)
    outs, cached = drain(eng)
    return outs[rid], cached[rid]


def test_flag_and_default():
    p = argparse.ArgumentParser()
    add_flags(p, EngineConfig)
    assert flag_values(p.parse_args([]), EngineConfig)["enable_prefix_caching"] is True
    assert flag_values(p.parse_args(["--no-enable-prefix-caching"]), EngineConfig)["enable_prefix_caching"] is False
    assert EngineConfig().enable_prefix_caching


def test_next_turn_hits_the_previous_answer(make_engine, enc, system, same):
    """Turn 2 = turn 1's prompt + its answer + new text: it starts after the answer's full blocks."""
    results = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=16, enable_prefix_caching=on)
        first, c1 = run(eng, system)
        turn2 = first.prompt_token_ids + first.token_ids + enc(" Now say it in French.")
        second, c2 = run(eng, turn2)
        results[on] = (first, second, c1, c2, eng.stats())
    (f_on, s_on, c1, c2, st), (f_off, s_off, *_, st_off) = results[True], results[False]
    same(f_on, f_off)
    same(s_on, s_off)
    computed = len(system) + len(f_on.token_ids) - 1  # the last sampled token has no KV
    assert c1 == 0 and c2 == computed // BS * BS > len(system)  # hits blocks filled by decode
    assert s_on.num_cached_tokens == c2 and s_off.num_cached_tokens == 0
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (len(system) + len(s_on.prompt_token_ids), c2)
    assert st.num_cached_blocks == (len(s_on.prompt_token_ids) + len(s_on.token_ids) - 1) // BS
    assert st.num_evictable_blocks == st.num_cached_blocks and st.num_used_blocks == 0
    assert (st_off.prefix_cache_queries, st_off.num_cached_blocks, st_off.num_evictable_blocks) == (0, 0, 0)


def test_hit_ending_mid_block_batched_with_its_source(make_engine, enc, system, same):
    """Prompts sharing 47 tokens: the hit covers 32, the 15 shared tokens of the third block are recomputed."""
    prompts = [system + enc(q) for q in (" What is chlorophyll?", " Why are leaves green?", " Is it hot?")]
    outs = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=32, enable_prefix_caching=on)
        first, _ = run(eng, prompts[0])
        rids = [eng.add_request(p, PARAMS) for p in prompts[1:]]
        got, cached = drain(eng)
        outs[on] = [first] + [got[r] for r in rids], [0] + [cached[r] for r in rids]
    for a, b in zip(outs[True][0], outs[False][0]):
        same(a, b)
    assert outs[True][1] == [0, 32, 32] and outs[False][1] == [0, 0, 0]


def test_external_plans_reuse_exactly_num_cached(make_engine, enc, system, same):
    """FluidToken's plans: after a chunk with num_cached, num_computed == num_cached + num_tokens,
    whether the cache held those tokens (taken) or not (computed in the same step)."""
    p1, p2 = system + enc(" What is chlorophyll?"), system + enc(" Why are leaves green?")
    outs = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=32, enable_prefix_caching=on)
        first, _ = run(eng, p1)
        assert eng.cached_prefix_tokens(p2) == (32 if on else 0)
        assert eng.cached_prefix_blocks(p1[:32]) == (2 if on else 0)
        rid = eng.add_request(p2, PARAMS)
        seq = eng.request(rid)
        with pytest.raises(ValueError, match="uncomputed"):
            eng.run_step(StepPlan(prefills=[PrefillChunk(rid, len(p2) - 39, num_cached=40)]))
        res = eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 5, num_cached=40)]))
        assert seq.num_computed == 45 and res.outputs[0].num_cached_tokens == (32 if on else 0)
        assert res.num_prefill_tokens == (13 if on else 45)  # tokens actually computed
        with pytest.raises(ValueError, match="nothing computed"):
            eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 1, num_cached=16)]))
        eng.run_step(StepPlan(prefills=[PrefillChunk(rid, seq.num_uncomputed)]))
        while not seq.finished:
            eng.run_step(StepPlan(decodes=[rid]))
        st = eng.stats()
        assert (st.prefix_cache_queries, st.prefix_cache_hits) == ((len(p1) + len(p2), 32) if on else (0, 0))
        outs[on] = first, RequestOutput.of(seq, None)
    same(outs[True][0], outs[False][0])
    same(outs[True][1], outs[False][1])


def test_a_prompt_cached_whole_computes_only_its_last_token(make_engine, system, same):
    """A block-aligned prompt seen before (built-in scheduler and an external plan): its last block is
    copied, one token is computed, the output equals the uncached one and the cached block is unchanged."""
    prompt = system[:32]
    outs = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=16, enable_prefix_caching=on)
        first, _ = run(eng, prompt)
        kv = eng.arena.kv.clone()
        again, cached = run(eng, prompt)
        computed = eng.stats()
        rid = eng.add_request(prompt, PARAMS)
        res = eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 1, num_cached=31)]))
        planned, _ = drain(eng)
        outs[on] = first, again, planned[rid]
        if on:
            assert cached == 31 and res.num_prefill_tokens == 1 and res.outputs[0].num_cached_tokens == 31
            assert torch.equal(eng.arena.kv[:2], kv[:2])  # the source blocks were read, never written
            assert computed.num_used_blocks == 0 and computed.num_cached_blocks == (32 + 11) // BS
        else:
            assert cached == 0 and res.num_prefill_tokens == 32
    for a, b in zip(outs[True], outs[False]):
        same(a, b)


def test_hit_then_preemption_recomputes_from_the_cache_uncounted(make_engine, system, same):
    """A request admitted on a hit, preempted mid-decode: its recompute starts on its own cached
    blocks (decode-filled ones included), the counters stay at the first admission's hit."""
    outs = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=16, enable_prefix_caching=on)
        run(eng, system[:40], SamplingParams(max_tokens=1))
        rid = eng.add_request(system, PARAMS)
        seq = eng.request(rid)
        while seq.num_output_tokens < 6:
            eng.step()
        before = eng.stats()
        eng.scheduler.preempt(seq)
        assert seq.num_computed == 0 and seq.num_preemptions == 1
        eng.step()
        assert seq.num_computed == len(seq.token_ids) - 1  # whole prefix recomputed (or reused) in one step
        readmitted = eng.last_step.num_prefill_tokens
        out, _ = drain(eng)
        outs[on] = out[rid], before, eng.stats(), readmitted
    (on_out, before, after, readmitted), (off_out, *_, off_readmitted) = outs[True], outs[False]
    same(on_out, off_out)
    assert on_out.num_preemptions == 1 and on_out.num_cached_tokens == 32 and off_out.num_cached_tokens == 0
    n = len(system) + 6  # prompt + 6 outputs, recomputed (the last one was never computed)
    assert off_readmitted == n and readmitted == n - (n - 1) // BS * BS
    assert (after.prefix_cache_queries, after.prefix_cache_hits) == (before.prefix_cache_queries, 32)


def test_handoff_carries_only_the_blocks_the_destination_lacks(make_engine, enc, system, same):
    p1, p2 = system + enc(" What is chlorophyll?"), system + enc(" Why are leaves green?")
    ref, _ = run(make_engine(num_kv_blocks=32, enable_prefix_caching=False), p2)
    a, b = make_engine(num_kv_blocks=32), make_engine(num_kv_blocks=32)
    run(b, p1)  # the decode engine holds the shared system prompt's full blocks
    rid = a.add_request(p2, PARAMS)
    while not a.request(rid).is_decoding:
        a.step()
    tokens = a.request(rid).token_ids
    skip = b.cached_prefix_blocks(tokens)
    assert skip == 2
    lacking = make_engine(num_kv_blocks=32)
    payload = pickle.loads(pickle.dumps(a.export_kv(rid, skip_blocks=skip)))
    nb = -(-payload.num_computed // BS)
    assert payload.skip_blocks == 2 and payload.blocks.shape[0] == nb - 2
    with pytest.raises(ValueError, match=rf"{rid}.*holds only the first 0"):
        lacking.import_kv(payload)
    assert lacking.stats().num_used_blocks == 0
    queries, cached = b.stats().prefix_cache_queries, b.stats().num_cached_blocks
    rid_b = b.import_kv(payload)
    st = b.stats()
    assert st.prefix_cache_queries == queries and st.prefix_cache_hits == 0  # imports are not hits
    assert st.num_cached_blocks == cached + payload.num_computed // BS - 2  # imported full blocks cached
    outs, _ = drain(b)
    same(outs[rid_b], ref)
    a.add_request(p1, PARAMS, request_id="x")
    a.step()
    with pytest.raises(ValueError, match="skip_blocks 4 out of range"):
        a.export_kv("x", skip_blocks=4)  # 53 computed: 3 full blocks


def test_resize_keeps_cached_blocks_that_fit(make_engine, enc, system, same):
    """A shrink with live requests low and a finished request's cached blocks beyond the new end
    moves those blocks into free low ids; after growing back, its prompt hits them."""
    prompt = system + enc(" What is chlorophyll?")
    results = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=40, max_num_batched_tokens=16, enable_prefix_caching=on)
        filler = eng.add_request(list(range(1000, 1400)), SamplingParams(max_tokens=1))
        eng.step()  # admission reserves blocks 0-24; 16 tokens computed
        early = external(eng, prompt)  # blocks 25-28: three full, cached once it finishes
        eng.abort(filler)
        rids = [eng.add_request(enc(p), PARAMS) for p in (PROMPTS[1], PROMPTS[3])]
        for _ in range(4):
            eng.step()
        shrink = eng.resize_kv(12)
        for _ in range(3):
            eng.step()
        assert eng.resize_kv(40).moved_blocks == 0
        outs, _ = drain(eng)
        again, hit = run(eng, prompt)
        results[on] = [early, *(outs[r] for r in rids), again], hit, shrink.moved_blocks
    for a, b in zip(results[True][0], results[False][0]):
        same(a, b)
    assert results[True][1:] == (48, 3) and results[False][1:] == (0, 0)


def test_eviction_under_pressure(make_engine, enc, same):
    """A pool of 8 blocks, many distinct prompts: the oldest prompt's blocks are evicted, the last one's hit."""
    prompts = [enc(f"Item {i}: a short note about the number {i * 37} and its friends.") for i in range(6)]
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=1)
    results = {}
    for on in (True, False):
        eng = make_engine(num_kv_blocks=4, enable_prefix_caching=on)
        firsts = [run(eng, p * 2, params)[0] for p in prompts]
        last, hit_last = run(eng, prompts[-1] * 2, params)
        oldest, hit_oldest = run(eng, prompts[0] * 2, params)
        results[on] = [*firsts, last, oldest], hit_last, hit_oldest, eng.stats()
    for a, b in zip(results[True][0], results[False][0]):
        same(a, b)
    _, hit_last, hit_oldest, st = results[True]
    assert hit_last >= BS and hit_oldest == 0
    assert st.num_free_blocks == 4 and st.num_evictable_blocks == st.num_cached_blocks > 0


def external(eng, prompt):
    """Run a request to the end by external plans: one whole-prompt chunk, then decodes."""
    rid = eng.add_request(prompt, PARAMS)
    eng.run_step(StepPlan(prefills=[PrefillChunk(rid, len(prompt))]))
    while True:
        (o,) = eng.run_step(StepPlan(decodes=[rid])).outputs
        if o.finished:
            return o.output
