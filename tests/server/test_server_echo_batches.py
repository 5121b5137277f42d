"""Batches of prompts, echo and prompt logprobs (lm-evaluation-harness's loglikelihood path) through a real server."""

from __future__ import annotations

import math

import pytest

PROMPTS = ["The capital of France is", "One, two, three,", "def add(a, b):"]


@pytest.fixture(scope="module")
def reference_logprobs():
    """Each prompt token's log-probability from the engine's own full-prompt logits (a separate engine)."""
    import torch

    from fluidpd.engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(model="smollm2", max_model_len=256, num_kv_blocks=32))

    def ref(ids: list[int]) -> list[float]:
        logp = torch.log_softmax(engine.prompt_logits(ids).float(), dim=-1)
        return [logp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]

    return ref


def test_a_batch_of_prompts_gives_one_choice_each_as_if_sent_alone(served, client, model):
    kw = dict(model=model, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    batch = client.completions.create(prompt=PROMPTS, **kw)
    alone = [client.completions.create(prompt=p, **kw) for p in PROMPTS]
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 15


def test_a_batch_of_token_id_prompts_streams_every_choice_to_its_end(served, client, model):
    tok = served.runtime.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    kw = dict(model=model, prompt=ids, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    texts, finished = ["", "", ""], []
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finished.append(ch.index)
    assert sorted(finished) == [0, 1, 2]
    assert texts == [c.text for c in whole.choices]


def test_echo_with_max_tokens_0_scores_the_prompt_as_the_engine_does(served, client, model, reference_logprobs):
    tok = served.runtime.tokenizer
    prompt = PROMPTS[0]
    r = client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = r.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    ids = tok.encode(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = reference_logprobs(ids)
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], want)) < 2e-3
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)


def test_lm_eval_loglikelihood_request_echoes_prompt_ids_and_one_token(served, client, model, reference_logprobs):
    """lm-eval's local-completions loglikelihood call: token ids, echo, logprobs=1, max_tokens=1, temperature 0."""
    ids = served.runtime.tokenizer.encode(PROMPTS[1])
    r = client.completions.create(model=model, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1 : len(ids)], reference_logprobs(ids))) < 2e-3
    greedy = [t == max(top.values()) for t, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:])]
    assert greedy[-1]  # the sampled (greedy) token is its own top-1


def test_streamed_echo_leads_with_the_prompt(client, model):
    chunks = list(client.completions.create(model=model, prompt=PROMPTS[2], max_tokens=3, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPTS[2])
    whole = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.startswith(PROMPTS[2]) and len(whole) > len(PROMPTS[2])


def test_vllm_prompt_logprobs_rank_the_prompt_tokens(served, client, model, reference_logprobs):
    ids = served.runtime.tokenizer.encode(PROMPTS[0])
    r = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=1, extra_body={"prompt_logprobs": 2})
    plp = r.model_extra["choices"][0]["prompt_logprobs"] if "choices" in r.model_extra else None
    plp = plp or r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for i, entry in enumerate(plp[1:], 1):
        own = entry[str(ids[i])]
        assert own["rank"] >= 1 and math.isclose(own["logprob"], reference_logprobs(ids)[i - 1], abs_tol=2e-3)
        top = sorted((e for e in entry.values()), key=lambda e: e["rank"])[:2]
        assert [e["rank"] for e in top] == [1, 2] or own["rank"] <= 2


def test_scoring_with_n_above_1_is_a_400_naming_n(served):
    import httpx

    body = {"prompt": PROMPTS[0], "max_tokens": 0, "echo": True, "n": 2}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_the_openapi_schema_says_what_is_accepted(served):
    import httpx

    schemas = httpx.get(served.url + "/openapi.json", timeout=60).json()["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"], schemas["ChatCompletionRequest"]
    assert completion["additionalProperties"] is False and chat["additionalProperties"] is False
    for name in ("n", "echo", "prompt_logprobs", "presence_penalty", "logit_bias", "response_format", "min_p"):
        assert name in completion["properties"], name
    for name in ("tools", "tool_choice", "parallel_tool_calls", "structured_outputs", "guided_json"):
        assert name in chat["properties"], name
    assert completion["properties"]["n"]["maximum"] == 16
