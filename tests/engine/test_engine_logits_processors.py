"""vLLM's logits processors (penalties, logit_bias, min_tokens, bad words, min_p) against transformers' own
on the same logits and token histories, the decoding state rebuilt from tokens, and their effect on a run."""

from __future__ import annotations

import pytest
import torch
from engine_testdata import PROMPTS

from fluidpd.engine import SamplingParams
from fluidpd.engine import sampling as sampling_mod
from fluidpd.engine.decoding_state import DecodingState
from fluidpd.engine.sampling import sample
from fluidpd.engine.sequence import Sequence
from fluidpd.engine.stopping import stop_reason

lp = pytest.importorskip("transformers.generation.logits_process")

VOCAB = 512
EOS = (2,)


def _logits(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * 4


def _history(seed: int, n: int, vocab: int = 40) -> list[int]:
    """Tokens drawn from a small range, so that many repeat."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _processed(params: SamplingParams, prompt: list[int], output: list[int], row: torch.Tensor) -> torch.Tensor:
    state = DecodingState(params, prompt + output, len(prompt), EOS)
    return state.process(row.clone())


def _hf(proc, ids: list[int], row: torch.Tensor) -> torch.Tensor:
    return proc(torch.tensor([ids], dtype=torch.long), row.clone()[None])[0]


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_transformers_over_prompt_and_output(penalty):
    for seed in range(4):
        prompt, output, row = _history(seed, 30), _history(seed + 100, 12), _logits(seed)
        got = _processed(SamplingParams(repetition_penalty=penalty), prompt, output, row)
        want = _hf(lp.RepetitionPenaltyLogitsProcessor(penalty), prompt + output, row)
        torch.testing.assert_close(got, want)
        assert not torch.equal(got, row)


@pytest.mark.parametrize("frequency, presence", [(0.7, 0.0), (0.0, 1.5), (-0.5, 2.0), (2.0, -2.0)])
def test_frequency_and_presence_penalties_follow_the_openai_formula(frequency, presence):
    prompt, output, row = _history(1, 25), _history(2, 30), _logits(3)
    got = _processed(SamplingParams(frequency_penalty=frequency, presence_penalty=presence), prompt, output, row)
    want = row.clone()
    for j in range(VOCAB):  # mu[j] -= c[j] * alpha_frequency + float(c[j] > 0) * alpha_presence
        c = output.count(j)
        want[j] -= c * frequency + float(c > 0) * presence
    torch.testing.assert_close(got, want)
    only_prompt = set(prompt) - set(output)
    assert only_prompt and all(got[t] == row[t] for t in only_prompt)  # the prompt is not counted


def test_min_tokens_matches_transformers_min_new_tokens():
    prompt, row = _history(4, 10), _logits(5)
    row[2] = row[7] = 50.0  # EOS and a stop id are the likeliest
    params = SamplingParams(min_tokens=3, stop_token_ids=[7], max_tokens=8)
    hf = lp.MinNewTokensLengthLogitsProcessor(len(prompt), 3, [*EOS, 7])
    for n in range(6):
        output = _history(6, n)
        got = _processed(params, prompt, output, row)
        torch.testing.assert_close(got, _hf(hf, prompt + output, row))
        assert (int(got.argmax()) in (2, 7)) == (n >= 3)


def test_bad_words_match_transformers_on_the_output():
    words = [(5,), (10, 11), (12, 13, 14), (20, 21, 22, 23)]
    params = SamplingParams(bad_words_token_ids=words)
    hf = lp.NoBadWordsLogitsProcessor([list(w) for w in words])
    prompt = [1, 20, 21, 22]
    outputs = [[], [10], [3, 10], [12, 13], [13, 12, 13], [12], [21, 22], [20, 21, 22], [10, 11, 12, 13, 14, 10]]
    for i, output in enumerate(outputs):
        row = _logits(10 + i)
        got = _processed(params, prompt, output, row)
        torch.testing.assert_close(got, _hf(hf, output, row))
    assert _processed(params, prompt, [], row)[23] == row[23]  # vLLM: the prompt does not complete a word
    banned = _processed(params, prompt, [3, 10], row)
    assert banned[5] == banned[11] == float("-inf") and banned[14] == row[14]


def test_logit_bias_matches_transformers_sequence_bias():
    bias = {3: 5.5, 17: -100.0, 400: 0.25, 511: -3.0}
    row = _logits(7)
    got = _processed(SamplingParams(logit_bias=bias), [1, 2], [3], row)
    hf = lp.SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    torch.testing.assert_close(got, _hf(hf, [1, 2, 3], row))


@pytest.mark.parametrize("min_p, top_k, temperature", [(0.05, 0, 1.0), (0.2, 0, 0.7), (0.01, 20, 1.3), (0.5, 5, 1.0)])
def test_min_p_and_top_k_match_transformers(monkeypatch, min_p, top_k, temperature):
    seen = []
    monkeypatch.setattr(sampling_mod, "draw", lambda probs, g: seen.append(probs) or 0)
    row = _logits(8, 4096)
    params = SamplingParams(temperature=temperature, min_p=min_p, top_k=top_k, seed=1)
    sample(row[None], [params], [params.make_generator()])
    hf = lp.LogitsProcessorList([lp.TemperatureLogitsWarper(temperature), lp.MinPLogitsWarper(min_p)])
    if top_k:
        hf.append(lp.TopKLogitsWarper(top_k))
    want = torch.softmax(hf(torch.zeros(1, 1, dtype=torch.long), row.clone()[None])[0], dim=-1)
    torch.testing.assert_close(seen[0], want)
    assert 0 < int((want > 0).sum()) < row.numel()


def test_every_processor_together_in_vllm_order():
    words, bias = [(9,), (30, 31)], {4: 3.0, 31: 2.0, 6: -1.5}
    params = SamplingParams(
        repetition_penalty=1.4,
        frequency_penalty=0.3,
        presence_penalty=0.6,
        logit_bias=bias,
        min_tokens=40,
        stop_token_ids=[8],
        bad_words_token_ids=words,
    )
    prompt, output, row = _history(11, 20), [*_history(12, 15), 30], _logits(13)
    got = _processed(params, prompt, output, row)
    hf = lp.LogitsProcessorList(
        [
            lp.NoBadWordsLogitsProcessor([list(w) for w in words]),
            lp.MinNewTokensLengthLogitsProcessor(len(prompt), 40, [*EOS, 8]),
            lp.SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()]),
            lp.RepetitionPenaltyLogitsProcessor(1.4),
        ]
    )
    want = hf(torch.tensor([prompt + output]), row.clone()[None])[0]
    for j in set(output):
        want[j] -= output.count(j) * 0.3 + 0.6
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("distinct", [40, VOCAB])  # VOCAB: more new tokens than the state made room for
def test_state_rebuilt_from_tokens_equals_the_one_built_incrementally(distinct):
    params = SamplingParams(
        max_tokens=4,
        repetition_penalty=1.2,
        frequency_penalty=0.5,
        presence_penalty=-0.4,
        min_tokens=5,
        bad_words_token_ids=[(3, 4)],
    )
    prompt, output = _history(20, 16), [*_history(21, 60, distinct), 3]
    tokens = list(prompt)
    live = DecodingState(params, tokens, len(prompt), EOS)
    for i, t in enumerate(output):
        if i % 7 == 0:
            live.process(_logits(i))  # the dense tensors exist and are updated from here on
        tokens.append(t)
        live.accept(t)
    rebuilt = DecodingState(params, list(tokens), len(prompt), EOS)
    assert live.counts == rebuilt.counts and sum(live.counts.values()) == len(output)
    row = _logits(99)
    assert torch.equal(live.process(row.clone()), rebuilt.process(row.clone()))


def test_logprobs_stay_the_models_own():
    row = _logits(30)
    params = SamplingParams(logit_bias={int(row.argmax()): -100.0}, logprobs=2)
    state = DecodingState(params, [1, 2, 3], 3, EOS)
    (tok,), (lpr,) = sample(row[None].clone(), [params], [None], [state])
    raw = torch.log_softmax(row, dim=-1)
    assert tok != int(row.argmax())
    assert lpr.logprob == pytest.approx(float(raw[tok]))
    assert list(lpr.top) == torch.topk(raw, 2).indices.tolist()


class _Chars:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


@pytest.mark.parametrize("min_tokens, stops_at, text", [(0, 2, "x"), (3, 4, "xyx"), (5, 6, "xyxyx")])
def test_stop_strings_are_not_checked_before_min_tokens(min_tokens, stops_at, text):
    x, y = ord("x") - ord("a"), ord("y") - ord("a")
    seq = Sequence("r", [0], 1, SamplingParams(stop=["y"], min_tokens=min_tokens, max_tokens=10))
    for n in range(1, 9):
        seq.token_ids.append(y if n % 2 == 0 else x)
        reason = stop_reason(seq, seq.token_ids[-1], set(EOS), _Chars(), 100)
        if reason:
            break
    assert (n, reason, seq.stop_text) == (stops_at, "stop", text)


# ---------------------------------------------------------------------- a real engine (SmolLM2)

REPETITIVE = "one two three one two three one two three one two three one two three"
SHORT_ANSWER = [{"role": "user", "content": "What is 2+2? Answer with a number only."}]


def _run(eng, prompt, chat=False, **kw):
    return eng.generate([prompt], SamplingParams(**kw), chat=chat)[0]


def test_a_large_negative_logit_bias_moves_greedy_off_its_token(make_engine):
    eng = make_engine(num_kv_blocks=32)
    plain = _run(eng, PROMPTS[0], max_tokens=6, ignore_eos=True).token_ids
    biased = _run(eng, PROMPTS[0], max_tokens=6, ignore_eos=True, logit_bias={plain[0]: -100.0}).token_ids
    assert biased[0] != plain[0]
    assert plain[0] not in biased
    boosted = _run(eng, PROMPTS[0], max_tokens=3, ignore_eos=True, logit_bias={1234: 100.0}).token_ids
    assert boosted == [1234, 1234, 1234]


def test_min_tokens_holds_off_an_early_eos(make_engine):
    eng = make_engine(num_kv_blocks=32)
    early = _run(eng, SHORT_ANSWER, chat=True, max_tokens=24)
    assert early.finish_reason == "stop" and len(early.token_ids) < 12 and early.token_ids[-1] in eng.eos_token_ids
    held = _run(eng, SHORT_ANSWER, chat=True, max_tokens=24, min_tokens=12)
    assert len(held.token_ids) >= 12
    assert not set(held.token_ids[:12]) & set(eng.eos_token_ids)
    assert held.token_ids[: len(early.token_ids) - 1] == early.token_ids[:-1]  # the same until the EOS


def test_repetition_presence_and_bad_words_change_a_repetitive_greedy_output(make_engine):
    eng = make_engine(num_kv_blocks=32)
    kw = dict(max_tokens=12, ignore_eos=True)
    plain = _run(eng, REPETITIVE, **kw).token_ids
    assert _run(eng, REPETITIVE, **kw).token_ids == plain
    assert _run(eng, REPETITIVE, repetition_penalty=1.5, **kw).token_ids != plain
    assert _run(eng, REPETITIVE, presence_penalty=2.0, **kw).token_ids != plain
    one = plain[0]
    banned = _run(eng, REPETITIVE, bad_words_token_ids=[(one,)], **kw).token_ids
    assert one not in banned
    pair = (plain[0], plain[1])
    no_pair = _run(eng, REPETITIVE, bad_words_token_ids=[pair], **kw).token_ids
    assert all(tuple(no_pair[i : i + 2]) != pair for i in range(len(no_pair) - 1))
