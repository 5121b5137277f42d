"""Sampling: seeds, top-k/top-p, stop strings and ids, logprobs, and seeded hand-off."""

from __future__ import annotations

import math

import pytest
import torch
from engine_testdata import PROMPTS
from engine_tolerance import logits_tol

from fluidpd.engine import SamplingParams
from fluidpd.engine.sampling import MAX_LOGPROBS, SamplingParamError, sample


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
    mixed = eng.generate(
        [PROMPTS[0], PROMPTS[3], PROMPTS[1]],
        [SamplingParams(max_tokens=6, temperature=1.0, seed=9), p, SamplingParams(max_tokens=14)],
    )[1].token_ids
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
    out = next(o.output for o in _drain(b) if o.request_id == rid_b)
    assert out.token_ids == whole


def test_top_k_1_and_tiny_top_p_are_greedy(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    assert _tokens(eng, PROMPTS[0], max_tokens=20, temperature=1.0, top_k=1, seed=1) == reference[0]
    assert _tokens(eng, PROMPTS[0], max_tokens=20, temperature=1.5, top_p=1e-6, seed=1) == reference[0]


def test_a_tiny_temperature_is_greedy():
    logits = torch.tensor([[5.0, 40.0, -3.0]])  # / 1.2e-38 overflows float32: softmax of inf is nan
    for t in (5e-324, 1.2e-38, 9e-6):
        p = SamplingParams(temperature=t, seed=0)
        assert p.greedy and sample(logits, [p], [p.make_generator()])[0] == [1]
    assert not SamplingParams(temperature=1e-5).greedy


def test_top_k_restricts_the_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, -1.0, -2.0]])
    g = torch.Generator().manual_seed(0)
    draws = {sample(logits, [SamplingParams(temperature=2.0, top_k=2)], [g])[0][0] for _ in range(200)}
    assert draws == {0, 1}
    draws = {sample(logits, [SamplingParams(temperature=2.0, top_p=0.5)], [g])[0][0] for _ in range(200)}
    assert draws <= {0, 1, 2} and len(draws) >= 2


def test_stop_string_cuts_text(make_engine):
    eng = make_engine(num_kv_blocks=32)
    full = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    assert full.text.startswith(" Paris.")
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop=["."], ignore_eos=True))[0]
    assert out.finish_reason == "stop" and out.text == " Paris"
    assert out.token_ids == full.token_ids[: len(out.token_ids)] and len(out.token_ids) < 20
    kept = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop="answer", include_stop_str_in_output=True))[0]
    assert kept.text.endswith("answer") and kept.finish_reason == "stop"


def test_stop_token_ids_and_max_tokens(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    stop_at = reference[0][3]
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop_token_ids=[stop_at]))[0]
    first = reference[0].index(stop_at)
    assert out.token_ids == reference[0][: first + 1] and out.finish_reason == "stop"
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert out.token_ids == reference[0][:3] and out.finish_reason == "length"


def test_logprobs_shape_and_normalisation(make_engine, reference):
    eng = make_engine(num_kv_blocks=32)
    out = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=6, logprobs=5, ignore_eos=True))[0]
    # log_softmax sums n = vocab fp32 terms (error <= n * eps / 2); the few other roundings of a
    # log-probability add eps / 2 * (logit range + log n), far less: n * eps bounds the total
    n = eng.model_config.vocab_size
    norm_tol = n * torch.finfo(torch.float32).eps
    assert len(out.logprobs) == 6
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and len(lp.top) == 5
        assert max(lp.top, key=lp.top.get) == tok  # greedy picks the top-1
        assert lp.logprob == lp.top[tok]  # the same fp32 value, read twice
        assert all(v <= 0 for v in lp.top.values())
        assert sum(math.exp(v) for v in lp.top.values()) <= 1 + norm_tol
    ids = out.prompt_token_ids + out.token_ids[:1]
    logits = eng.prompt_logits(ids)
    logp = torch.log_softmax(logits[-2], -1)
    assert torch.exp(logp.double()).sum().item() == pytest.approx(1.0, abs=norm_tol)
    # another forward (other batch shapes): the two logits differ by <= 2 logits_tol (each is within
    # logits_tol of the exact ones), |d log_softmax| <= 2 max |d logits|; plus rounding (norm_tol)
    tol = 4 * logits_tol(eng.model_config, len(ids), torch.float32, logits[-2].abs().max().item()) + norm_tol
    assert out.logprobs[0].logprob == pytest.approx(logp[out.token_ids[0]].item(), abs=tol)
    assert out.token_ids == reference[0][:6]


@pytest.mark.parametrize(
    "field, bad",
    [
        ("max_tokens", -3),
        ("max_tokens", 2.0),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", math.nan),
        ("top_k", -2),
        ("top_k", 1.5),
        ("seed", 1 << 64),
        ("seed", -(1 << 63) - 1),
        ("seed", 1.0),
        ("stop", [""]),
        ("stop", ""),
        ("stop", [1]),
        ("stop", None),
        ("stop_token_ids", ["1"]),
        ("stop_token_ids", [1.5]),
        ("ignore_eos", 1),
        ("include_stop_str_in_output", None),
        ("logprobs", -1),
        ("logprobs", MAX_LOGPROBS + 1),
        ("logprobs", 1.0),
        ("n", 0),
        ("n", 17),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("repetition_penalty", 0.0),
        ("min_p", 1.5),
        ("min_tokens", -1),
        ("logit_bias", {1: 101.0}),
        ("logit_bias", {"x": 1.0}),
        ("prompt_logprobs", MAX_LOGPROBS + 1),
    ],
)
def test_sampling_params_validation_names_the_field(field, bad):
    with pytest.raises(SamplingParamError, match=field) as err:
        SamplingParams(**{field: bad})
    assert err.value.param == field and isinstance(err.value, ValueError)


def test_sampling_params_accepts_the_edges_and_normalises():
    p = SamplingParams(
        max_tokens=1, temperature=2, top_p=1, top_k=-1, seed=-1, stop="x", stop_token_ids=[3], logprobs=MAX_LOGPROBS
    )
    assert (p.temperature, p.top_p, p.seed, p.stop, p.stop_token_ids) == (2.0, 1.0, (1 << 64) - 1, ("x",), (3,))
    assert SamplingParams(seed=(1 << 64) - 1).seed == (1 << 64) - 1
    assert SamplingParams(logprobs=0).logprobs == 0 and SamplingParams().greedy


def _drain(eng):
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    return outs


def test_draws_follow_the_distribution_and_never_pick_a_zero():
    from fluidpd.engine.sampling import draw

    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(1)
    counts = torch.bincount(torch.tensor([draw(probs, g) for _ in range(4000)]), minlength=6).float()
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts / 4000, probs, atol=0.03)  # 4000 draws: sd of a share <= 0.008
    assert draw(torch.tensor([0.0, 0.0, 1.0, 0.0]), g) == 2
    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert [draw(probs, a) for _ in range(50)] == [draw(probs, b) for _ in range(50)]  # a seed replays
