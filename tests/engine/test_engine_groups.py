"""n > 1 requests (one prompt, n sampled sequences) as one request group in the engine: one prefill,
shared KV blocks, per-choice RNG and stop conditions, moved and restarted whole."""

from __future__ import annotations

from engine_testdata import PROMPTS

from fluidpd.engine import PrefillChunk, SamplingParams, StepPlan

PROMPT = PROMPTS[0]
N = 4


def _greedy(n: int = 1, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n)


def _seeded(n: int = 1, seed: int = 7, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n, seed=seed, temperature=1.0)


def _collect(outs, tokens: dict[int, list[int]]) -> bool:
    """Add each output's tokens to its choice; True once the group has left the engine."""
    done = False
    for o in outs:
        tokens.setdefault(o.index, []).extend(o.new_token_ids)
        done = done or o.group_finished
    return done


def _prefill(eng, rid: str):
    n = eng.seqs[rid].num_uncomputed
    return eng.run_step(StepPlan(prefills=[PrefillChunk(rid, n)]))


def _decode_to_end(eng, rid: str, tokens: dict[int, list[int]]) -> None:
    while rid in eng.groups:
        _collect(eng.run_step(StepPlan(decodes=[rid])).outputs, tokens)


def test_greedy_group_is_n_equal_outputs_from_one_prefill(make_engine):
    eng = make_engine(num_kv_blocks=64)
    ref = eng.generate([PROMPT], _greedy())[0].token_ids
    free = eng.blocks.num_free
    rid = eng.add_request(PROMPT, _greedy(N))
    prompt_len = eng.seqs[rid].prompt_len
    prefilled, done, outs = 0, False, []
    while not done:
        step = eng.step()
        prefilled += eng.last_step.num_prefill_tokens
        outs += step
        done = any(o.group_finished for o in step)
    assert prefilled == prompt_len  # the prompt was computed once, not once per choice
    out = next(o for o in outs if o.group_finished).output
    assert [o.index for o in out.outputs] == list(range(N))
    assert [o.token_ids for o in out.outputs] == [ref] * N
    assert all(o.finish_reason == "length" for o in out.outputs)
    assert eng.blocks.num_free == free
    assert not eng.seqs and not eng.groups


def test_seeded_group_equals_separate_requests_seeded_s_to_s_plus_3(make_engine):
    eng = make_engine(num_kv_blocks=64)
    group = eng.generate([PROMPT], _seeded(N, seed=11))[0]
    apart = eng.generate([PROMPT] * N, [_seeded(seed=11 + j) for j in range(N)])
    assert [o.token_ids for o in group.outputs] == [o.token_ids for o in apart]
    assert len({tuple(o.token_ids) for o in group.outputs}) > 1  # they did sample apart


def test_fork_shares_the_prompts_full_blocks_and_frees_them_all(make_engine):
    eng = make_engine(num_kv_blocks=64, block_size=4)
    free = eng.blocks.num_free
    rid = eng.add_request(PROMPT, _greedy(N))
    prompt_len = eng.seqs[rid].prompt_len
    assert prompt_len % 4  # a partial last block: copied for all but the first choice
    _prefill(eng, rid)
    assert eng.blocks.num_free == free - -(-prompt_len // 4)  # before the fork: the prompt's blocks only
    tokens: dict[int, list[int]] = {}
    _collect(eng.run_step(StepPlan(decodes=[rid])).outputs, tokens)
    kids = eng.groups[rid].live()
    full = prompt_len // 4
    shared = kids[0].block_table[:full]
    assert all(k.block_table[:full] == shared for k in kids)
    assert all(eng.blocks.pool.refs[b] == N for b in shared)
    assert len({k.block_table[full] for k in kids}) == N  # each its own partial block
    _decode_to_end(eng, rid, tokens)
    assert eng.blocks.num_free == free


def _moved_run(make_engine, params, move_after: int | None) -> dict[int, list[int]]:
    """Prefill on engine A, `move_after` decode steps there, then export/import to B and decode to the
    end (None: no move, to the end on A)."""
    a, b = make_engine(num_kv_blocks=64), make_engine(num_kv_blocks=64)
    free_a, free_b = a.blocks.num_free, b.blocks.num_free
    rid = a.add_request(PROMPT, params, request_id="g")
    tokens: dict[int, list[int]] = {}
    _collect(_prefill(a, rid).outputs, tokens)
    if move_after is None:
        _decode_to_end(a, rid, tokens)
        assert a.blocks.num_free == free_a
        return tokens
    for _ in range(move_after):
        _collect(a.run_step(StepPlan(decodes=[rid])).outputs, tokens)
    payload = a.export_kv(rid)
    assert a.blocks.num_free == free_a and not a.seqs
    rid = b.import_kv(payload)
    _decode_to_end(b, rid, tokens)
    assert b.blocks.num_free == free_b
    return tokens


def test_group_moves_before_and_after_the_fork(make_engine):
    params = _seeded(N, seed=3)
    unmoved = _moved_run(make_engine, params, None)
    assert sorted(unmoved) == list(range(N)) and all(len(t) == 8 for t in unmoved.values())
    before = _moved_run(make_engine, params, 0)  # the prompt's KV with the pending first tokens
    after = _moved_run(make_engine, params, 3)  # the distinct blocks once, each choice's table
    assert before == unmoved
    assert after == unmoved


def test_exported_group_before_the_fork_carries_the_prompt_once(make_engine):
    a = make_engine(num_kv_blocks=64, block_size=4)
    rid = a.add_request(PROMPT, _greedy(N))
    prompt_len = a.seqs[rid].prompt_len
    _prefill(a, rid)
    payload = a.export_kv(rid)
    assert payload.blocks.shape[0] == -(-prompt_len // 4)
    assert payload.group.primary == -1 and len(payload.group.children) == N
    assert all(len(c.output_ids) == 1 for c in payload.group.children)


def test_restart_with_produced_tokens_continues_each_choice(make_engine):
    eng = make_engine(num_kv_blocks=64)
    full = eng.generate([PROMPT], _greedy(3, max_tokens=10))[0]
    ref = [o.token_ids for o in full.outputs]
    free = eng.blocks.num_free
    produced = [ref[0][:4], None, ref[2][:4]]  # choice 1 already finished: it stays finished
    rid = eng.add_request(PROMPT, _greedy(3, max_tokens=10), produced=produced)
    prompt_len = eng.seqs[rid].prompt_len
    tokens: dict[int, list[int]] = {}
    res = eng.run_step(StepPlan(prefills=[PrefillChunk(rid, prompt_len + 8)]))
    prefilled = res.num_prefill_tokens
    _collect(res.outputs, tokens)
    while rid in eng.groups:
        res = eng.run_step(StepPlan(decodes=[rid]))
        prefilled += res.num_prefill_tokens
        _collect(res.outputs, tokens)
    assert prefilled == prompt_len + 8  # the prompt once, then each live choice's own tokens
    assert sorted(k for k, v in tokens.items() if v) == [0, 2]
    assert tokens[0] == ref[0][4:] and tokens[2] == ref[2][4:]
    assert eng.blocks.num_free == free


def test_abort_a_group_frees_every_block(make_engine):
    eng = make_engine(num_kv_blocks=64)
    free = eng.blocks.num_free
    rid = eng.add_request(PROMPT, _greedy(N))
    _prefill(eng, rid)
    eng.run_step(StepPlan(decodes=[rid]))
    assert eng.abort(rid)
    assert eng.blocks.num_free == free and not eng.seqs and not eng.groups


def test_groups_in_a_tiny_pool_preempt_and_still_match(make_engine):
    """The built-in scheduler preempts choices by recompute when the pool runs short; each still gives
    the greedy tokens, and every block comes back."""
    ref = make_engine(num_kv_blocks=64).generate(PROMPTS[:2], _greedy(max_tokens=24))
    eng = make_engine(num_kv_blocks=16, block_size=4, max_num_batched_tokens=32)
    free = eng.blocks.num_free
    outs = eng.generate(PROMPTS[:2], _greedy(3, max_tokens=24))
    assert [[o.token_ids for o in out.outputs] for out in outs] == [[r.token_ids] * 3 for r in ref]
    assert sum(o.num_preemptions for out in outs for o in out.outputs) > 0
    assert eng.blocks.num_free == free
