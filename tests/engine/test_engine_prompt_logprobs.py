"""Prompt logprobs: every prompt token's logprob (and rank, and top-k) from the prefill chunks that compute it,
whatever the chunking; max_tokens=0 scores the prompt and samples nothing; no cached prefix is taken."""

from __future__ import annotations

import pytest
import torch

from fluidpd.engine import SamplingParams
from fluidpd.engine.plan import PrefillChunk, StepPlan

TEXT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome."


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(num_kv_blocks=64, max_model_len=256, enable_prefix_caching=True)


def _reference(engine, ids):
    logp = torch.log_softmax(engine.prompt_logits(ids).float(), dim=-1)
    return logp


def test_scoring_a_prompt_samples_nothing_and_matches_its_logits(engine):
    ids = engine.tokenizer.encode(TEXT)
    logp = _reference(engine, ids)
    out = engine.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=3))[0]
    assert out.token_ids == [] and out.finish_reason == "length"
    plp = out.prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    for i, lp in enumerate(plp[1:], 1):
        assert lp.token_id == ids[i]
        assert lp.logprob == pytest.approx(logp[i - 1, ids[i]].item(), abs=1e-4)
        assert lp.rank == 1 + int((logp[i - 1] > logp[i - 1, ids[i]]).sum())
        assert list(lp.top) == logp[i - 1].topk(3).indices.tolist()


@pytest.mark.parametrize("chunks", [[5, 7], [1, 1, 9], [16, 1]])
def test_chunked_prefill_scores_the_same_tokens(engine, chunks):
    ids = engine.tokenizer.encode(TEXT)
    whole = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs
    rid = engine.add_request(ids, SamplingParams(max_tokens=1, prompt_logprobs=0))
    got = []
    for n in [*chunks, len(ids) - sum(chunks)]:
        got += engine.run_step(StepPlan(prefills=[PrefillChunk(rid, n)])).outputs[0].prompt_logprobs
    assert got[0] is None and len(got) == len(whole)
    assert [g.token_id for g in got[1:]] == ids[1:]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(got[1:], whole[1:])) < 2e-3


def test_a_cached_prompt_is_scored_whole_again(engine):
    ids = engine.tokenizer.encode(TEXT)
    engine.generate([ids], SamplingParams(max_tokens=1))  # now cached
    assert engine.cached_prefix_tokens(ids) > 0
    out = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0 and len(out.prompt_logprobs) == len(ids)
