"""End-to-end greedy behaviour of the engine on SmolLM2: every way of running a request must give
the tokens of the plain run (whole prefill, alone on its engine)."""

from __future__ import annotations

import pickle
import random

import pytest
from engine_testdata import MAX_TOKENS, PROMPTS

from fluidpd.engine import PrefillChunk, SamplingParams, StepPlan

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def test_capital_of_france_is_paris(make_engine):
    out = make_engine(num_kv_blocks=16).generate(["The capital of France is"], SamplingParams(max_tokens=8))[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("length", "stop")
    assert out.prompt_token_ids == [504, 3575, 282, 4649, 314]


def test_chat_prompt_answers(make_engine):
    eng = make_engine(num_kv_blocks=32)
    out = eng.generate(["What is the capital of France?"], SamplingParams(max_tokens=30), chat=True)[0]
    assert out.prompt_token_ids[:2] == [1, 9690]  # <|im_start|>system
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # ends with <|im_end|> (eos)
    assert out.token_ids[-1] == 2


def test_reference_is_deterministic_and_nontrivial(make_engine, reference):
    again = make_engine(num_kv_blocks=64).generate([PROMPTS[0]], GREEDY)[0].token_ids
    assert again == reference[0]
    assert all(len(r) == MAX_TOKENS for r in reference)
    assert len({tuple(r) for r in reference}) == len(PROMPTS)


def test_batched_with_other_requests_of_different_lengths(make_engine, reference):
    eng = make_engine(num_kv_blocks=128)
    outs = eng.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == reference


@pytest.mark.slow
def test_staggered_arrivals_mix_prefill_and_decode(make_engine, reference):
    """Requests arrive while others decode: steps mix prefill chunks with decodes."""
    eng = make_engine(num_kv_blocks=128, max_num_batched_tokens=24)
    rids, done, mixed = {}, {}, 0
    for i, p in enumerate(PROMPTS):
        rids[eng.add_request(p, GREEDY)] = i
        for _ in range(3):
            plan = eng.scheduler.schedule()
            mixed += bool(plan.prefills) and bool(plan.decodes)
            for o in eng.run_step(plan).outputs if plan else []:
                if o.finished:
                    done[rids[o.request_id]] = o.output.token_ids
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done[rids[o.request_id]] = o.output.token_ids
    assert mixed > 0
    assert [done[i] for i in range(len(PROMPTS))] == reference


@pytest.mark.slow
def test_chunked_prefill_random_chunk_sizes(make_engine, reference):
    """An external plan (as FluidToken builds) prefills in random chunks, then decodes."""
    rng = random.Random(7)
    eng = make_engine(num_kv_blocks=128)
    for i in (1, 4):
        rid = eng.add_request(PROMPTS[i], GREEDY)
        seq = eng.request(rid)
        while seq.num_uncomputed > 1 or not seq.is_decoding:
            n = min(rng.randint(1, 9), seq.num_uncomputed)
            res = eng.run_step(StepPlan(prefills=[PrefillChunk(rid, n)]))
            assert res.step_s > 0 and res.num_prefill_tokens == n
        out = None
        while out is None:
            (o,) = eng.run_step(StepPlan(decodes=[rid])).outputs
            out = o.output if o.finished else None
        assert out.token_ids == reference[i]


def test_chunked_prefill_by_token_budget(make_engine, reference):
    eng = make_engine(num_kv_blocks=128, max_num_batched_tokens=7)
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == reference


def test_handoff_prefill_on_a_decode_on_b(make_engine, reference):
    a, b = make_engine(num_kv_blocks=64), make_engine(num_kv_blocks=64)
    rid = a.add_request(PROMPTS[4], GREEDY)
    while not a.request(rid).is_decoding:  # prefill (+ first token) on A
        a.step()
    payload = pickle.loads(pickle.dumps(a.export_kv(rid)))  # as if sent to another process
    assert not a.has_unfinished() and a.stats().num_used_blocks == 0
    assert payload.num_computed == len(payload.token_ids) - 1 and len(payload.output_token_ids) == 1
    assert payload.blocks.shape[0] == -(-payload.num_computed // 16)
    rid_b = b.import_kv(payload)
    out = _run_to_end(b, rid_b)
    assert out.token_ids == reference[4]


def test_migration_mid_decode_between_engines(make_engine, reference):
    a, b = make_engine(num_kv_blocks=64), make_engine(num_kv_blocks=64)
    rids = [a.add_request(p, GREEDY) for p in PROMPTS[:3]]
    for _ in range(12):
        a.step()
    assert all(a.request(r).num_output_tokens > 3 for r in rids)
    moved = b.import_kv(a.export_kv(rids[1]))  # migrate one; the others stay on A
    outs = {o.output.request_id: o.output.token_ids for o in _drain(a) + _drain(b)}
    assert outs[rids[0]] == reference[0] and outs[rids[2]] == reference[2]
    assert outs[moved] == reference[1]


def test_preemption_by_recompute_in_a_tiny_pool(make_engine, reference):
    eng = make_engine(num_kv_blocks=6, max_num_seqs=8)  # 96 tokens of KV for ~115 needed
    outs = eng.generate(PROMPTS[:4], GREEDY)
    assert sum(o.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == reference[:4]


@pytest.mark.slow
def test_resize_kv_with_live_sequences(make_engine, reference):
    eng = make_engine(num_kv_blocks=64, scratch_bytes=64 * 737280)
    buf = eng.arena.buffer.data_ptr()
    filler = eng.add_request(list(range(1000, 1480)), GREEDY)  # takes the 30 lowest blocks
    eng.step()
    rids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    for _ in range(4):
        eng.step()
    eng.abort(filler)  # live blocks now sit above 30
    used = eng.stats().num_used_blocks
    r = eng.resize_kv(used + 2)  # shrink: KV -> scratch
    assert r.moved_blocks >= used - 2 and r.new_blocks == used + 2
    assert max(b for s in map(eng.request, rids) for b in s.block_table) < used + 2
    assert eng.arena.buffer.data_ptr() == buf  # same arena, re-sliced
    assert eng.stats().scratch_bytes > 64 * 737280
    for _ in range(3):
        eng.step()
    grown = eng.resize_kv(eng.arena.max_blocks)  # grow: scratch -> KV
    assert grown.moved_blocks == 0 and eng.stats().num_kv_blocks == eng.arena.max_blocks
    outs = {o.output.request_id: o.output.token_ids for o in _drain(eng)}
    assert [outs[r] for r in rids] == reference


def test_resize_kv_refuses_to_drop_live_blocks(make_engine):
    eng = make_engine(num_kv_blocks=32)
    eng.add_request(PROMPTS[4], GREEDY)
    eng.step()
    used = eng.stats().num_used_blocks
    with pytest.raises(ValueError, match="in use"):
        eng.resize_kv(used - 1)
    with pytest.raises(ValueError):
        eng.resize_kv(eng.arena.max_blocks + 1)
    assert eng.stats().num_kv_blocks == 32


def test_abort_frees_blocks(make_engine):
    eng = make_engine(num_kv_blocks=32)
    rid = eng.add_request(PROMPTS[1], GREEDY)
    eng.step()
    assert eng.stats().num_used_blocks > 0
    assert eng.abort(rid) and not eng.abort(rid)
    assert eng.stats().num_used_blocks == 0 and not eng.has_unfinished()


def _drain(eng):
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    return outs


def _run_to_end(eng, rid):
    for o in _drain(eng):
        if o.request_id == rid:
            return o.output
    raise AssertionError(f"{rid} did not finish")
