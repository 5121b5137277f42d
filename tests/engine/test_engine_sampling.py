"""Sampling: seeds, top-k/top-p, stop strings and ids, logprobs, and seeded hand-off."""
from __future__ import annotations

import math

import pytest
import torch

from engine_testdata import PROMPTS
from fluidpd.engine import SamplingParams
from fluidpd.engine.sampling import sample


def _tokens(eng, prompt, **kw):
    return eng.generate([prompt], SamplingParams(ignore_eos=True, **kw))[0].token_ids


def test_same_seed_same_tokens_other_seed_other_tokens(make_engine):
    eng = make_engine(num_kv_blocks=32)
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95)
    a = _tokens(eng, PROMPTS[1], seed=123, **kw)
    b = _tokens(eng, PROMPTS[1], seed=123, **kw)
    c = _tokens(eng, PROMPTS[1], seed=321, **kw)
    assert a == b
    assert a != c


def test_seeded_request_is_independent_of_batch(make_engine):
    eng = make_engine(num_kv_blocks=64)
    p = SamplingParams(max_tokens=10, temperature=0.8, top_k=50, seed=5, ignore_eos=True)
    alone = eng.generate([PROMPTS[3]], p)[0].token_ids
    mixed = eng.generate([PROMPTS[0], PROMPTS[3], PROMPTS[1]],
                         [SamplingParams(max_tokens=6, temperature=1.0, seed=9), p,
                          SamplingParams(max_tokens=14)])[1].token_ids
    assert alone == mixed


def test_seeded_sampling_continues_identically_after_handoff(make_engine):
    a, b = make_engine(num_kv_blocks=32), make_engine(num_kv_blocks=32)
    p = SamplingParams(max_tokens=14, temperature=1.0, seed=77, ignore_eos=True)
    whole = a.generate([PROMPTS[0]], p)[0].token_ids
    rid = a.add_request(PROMPTS[0], p)
    for _ in range(5):
        a.step()
    payload = a.export_kv(rid)
    assert payload.generator_state is not None
    rid_b = b.import_kv(payload)
    out = [o.output for o in _drain(b) if o.request_id == rid_b][0]
    assert out.token_ids == whole


def test_top_k_1_and_tiny_top_p_are_greedy(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    assert _tokens(eng, PROMPTS[0], max_tokens=20, temperature=1.0, top_k=1, seed=1) == reference[0]
    assert _tokens(eng, PROMPTS[0], max_tokens=20, temperature=1.5, top_p=1e-6, seed=1) == reference[0]


def test_top_k_restricts_the_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, -1.0, -2.0]])
    g = torch.Generator().manual_seed(0)
    draws = {sample(logits, [SamplingParams(temperature=5.0, top_k=2)], [g])[0][0] for _ in range(200)}
    assert draws == {0, 1}
    draws = {sample(logits, [SamplingParams(temperature=5.0, top_p=0.5)], [g])[0][0] for _ in range(200)}
    assert draws <= {0, 1, 2} and len(draws) >= 2


def test_stop_string_cuts_text(make_engine):
    eng = make_engine(num_kv_blocks=32)
    full = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    assert full.text.startswith(" Paris.")
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop=["."], ignore_eos=True))[0]
    assert out.finish_reason == "stop" and out.text == " Paris"
    assert out.token_ids == full.token_ids[:len(out.token_ids)] and len(out.token_ids) < 20
    kept = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop="answer",
                                                     include_stop_str_in_output=True))[0]
    assert kept.text.endswith("answer") and kept.finish_reason == "stop"


def test_stop_token_ids_and_max_tokens(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    stop_at = reference[0][3]
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop_token_ids=[stop_at]))[0]
    first = reference[0].index(stop_at)
    assert out.token_ids == reference[0][:first + 1] and out.finish_reason == "stop"
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert out.token_ids == reference[0][:3] and out.finish_reason == "length"


def test_logprobs_shape_and_normalisation(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=6, logprobs=5, ignore_eos=True))[0]
    assert len(out.logprobs) == 6
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and len(lp.top) == 5
        assert max(lp.top, key=lp.top.get) == tok                 # greedy picks the top-1
        assert lp.logprob == pytest.approx(max(lp.top.values()))
        assert all(v <= 0 for v in lp.top.values())
        assert sum(math.exp(v) for v in lp.top.values()) <= 1 + 1e-5
    logits = eng.prompt_logits(out.prompt_token_ids + out.token_ids[:1])
    logp = torch.log_softmax(logits[-2], -1)
    assert torch.exp(logp).sum().item() == pytest.approx(1.0, abs=1e-5)
    assert out.logprobs[0].logprob == pytest.approx(logp[out.token_ids[0]].item(), abs=1e-4)
    assert out.token_ids == reference[0][:6]


def test_sampling_params_validation():
    for bad in (dict(max_tokens=0), dict(max_tokens=-3), dict(temperature=-0.1), dict(top_p=0.0),
                dict(top_p=1.5), dict(top_k=-2), dict(logprobs=-1), dict(stop=[""])):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams().greedy and SamplingParams(stop="x").stop == ("x",)


def _drain(eng):
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    return outs
