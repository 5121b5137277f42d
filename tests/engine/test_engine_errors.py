"""Bad input gets a clear error, and leaves the engine usable."""

from __future__ import annotations

import pytest

from fluidpd.engine import EngineConfig, NoFreeBlocksError, PrefillChunk, SamplingParams, StepPlan
from fluidpd.engine.kv_transfer import KVLayout


def test_prompt_longer_than_context_window(make_engine):
    eng = make_engine(num_kv_blocks=8, max_model_len=64)
    with pytest.raises(ValueError, match="longer than max_model_len 64"):
        eng.add_request(list(range(100, 165)))
    eng.add_request(list(range(100, 164)), SamplingParams(max_tokens=5))  # exactly fits: 1 token
    (out,) = list(_drain(eng))
    assert out.output.finish_reason == "length" and len(out.output.token_ids) == 1


def test_prompt_larger_than_kv_pool(make_engine):
    with pytest.raises(ValueError, match="KV blocks"):
        make_engine(num_kv_blocks=2).add_request(list(range(100, 140)))


def test_max_tokens_and_other_inputs(make_engine):
    eng = make_engine(num_kv_blocks=8)
    with pytest.raises(ValueError, match="max_tokens"):
        eng.add_request("hi", SamplingParams(max_tokens=-1))
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([])
    with pytest.raises(ValueError, match="out of range"):
        eng.add_request([1, 2, 10**6])
    rid = eng.add_request("hi", request_id="x")
    with pytest.raises(ValueError, match="already"):
        eng.add_request("hi", request_id="x")
    assert eng.abort(rid)


def test_engine_config_validation():
    for bad in (
        dict(block_size=0),
        dict(max_num_seqs=0),
        dict(dtype="int8"),
        dict(load_format="onnx"),
        dict(max_num_batched_tokens=-1),
        dict(device="cuda:banana"),
        dict(scratch_bytes=-1),
    ):
        with pytest.raises(ValueError):
            EngineConfig(**bad)
    with pytest.raises(ValueError, match="cannot hold"):
        EngineConfig(num_kv_blocks=10, arena_bytes=100).arena_layout(1000)
    assert EngineConfig(arena_bytes=10_000, scratch_bytes=1_000).arena_layout(1000) == (9, 10_000)


def test_bad_step_plans(make_engine):
    eng = make_engine(num_kv_blocks=8)
    rid = eng.add_request("The capital of France is")
    with pytest.raises(KeyError):
        eng.run_step(StepPlan(decodes=["nope"]))
    with pytest.raises(ValueError, match="not decoding"):
        eng.run_step(StepPlan(decodes=[rid]))
    with pytest.raises(ValueError, match="uncomputed"):
        eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 99)]))
    with pytest.raises(ValueError, match="twice"):
        eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 2), PrefillChunk(rid, 3)]))
    res = eng.run_step(StepPlan(prefills=[PrefillChunk(rid, 5)]))  # still usable
    assert res.outputs[0].new_token_ids and res.num_prefill_tokens == 5


def test_plan_larger_than_free_blocks(make_engine):
    eng = make_engine(num_kv_blocks=2)
    a = eng.add_request(list(range(100, 120)))
    b = eng.add_request(list(range(200, 220)))
    with pytest.raises(NoFreeBlocksError):
        eng.run_step(StepPlan(prefills=[PrefillChunk(a, 20), PrefillChunk(b, 20)]))
    assert eng.stats().num_used_blocks == 0  # nothing half-allocated


def test_import_checks_layout_and_room(make_engine):
    a, b = make_engine(num_kv_blocks=8), make_engine(num_kv_blocks=1)
    rid = a.add_request(list(range(100, 140)), SamplingParams(max_tokens=4))
    a.step()
    payload = a.export_kv(rid, release=False)
    assert a.has_unfinished()
    with pytest.raises(NoFreeBlocksError):
        b.import_kv(payload)
    payload.layout = KVLayout(1, 1, 1, 16, "torch.float32")
    with pytest.raises(ValueError, match="layout"):
        a.import_kv(payload, request_id="copy")


def test_text_prompt_without_tokenizer(tmp_path):
    from fluidpd.engine import LLMEngine

    eng = LLMEngine(
        EngineConfig(
            model="smollm2-135m",
            load_format="dummy",
            num_kv_blocks=2,
            model_overrides=dict(num_hidden_layers=1),
            max_model_len=32,
        )
    )
    with pytest.raises(ValueError, match="no tokenizer"):
        eng.add_request("hello")


def _drain(eng):
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    return outs
