"""The decode program (one C call for a decode-only step's layers) against the layer-by-layer path it replaces."""

from __future__ import annotations

import pytest
import torch
from engine_testdata import PROMPTS

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, StepPlan, load_model
from fluidpd.engine.decode_program import DecodeProgram
from fluidpd.engine.kernels import KernelUnavailable


@pytest.fixture(scope="module")
def gguf():
    return load_model(EngineConfig())  # the default: GGUF blocks, fused ops, paged attention


def _decode(model, tok, program, kv_dtype: str, prompts: list[list[int]], steps: int, threads: int):
    """Logits of `steps` decode steps over `prompts` (prefilled first), the KV pages after, and the steps the
    program ran; `program` is the model's program or None (the layer-by-layer path)."""
    saved, model.program = model.program, program
    ran, logits = [], []
    forward = model.forward
    if program is not None:
        runs = program.runs
        program.runs = lambda n, meta: ran.append(runs(n, meta)) or ran[-1]  # type: ignore[method-assign]
    torch.set_num_threads(threads)
    try:
        eng = LLMEngine(EngineConfig(num_kv_blocks=64, kv_cache_dtype=kv_dtype), model=model, tokenizer=tok)
        rids = [eng.add_request(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
        while any(not eng.request(r).is_decoding for r in rids):
            eng.step()
        ran.clear()
        model.forward = lambda *a: logits.append(forward(*a)) or logits[-1]  # type: ignore[method-assign]
        for _ in range(steps):
            eng.run_step(StepPlan(decodes=list(rids)))
        return torch.cat(logits), eng.arena.kv.clone(), ran
    finally:
        torch.set_num_threads(1)
        del model.forward
        model.program = saved
        if program is not None:
            del program.runs


@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
@pytest.mark.parametrize("rows,threads", [(1, 1), (1, 2), (4, 3)])
def test_a_decode_step_in_one_call_is_bit_identical_to_the_layers(gguf, kv_dtype, rows, threads):
    model, tok = gguf
    assert isinstance(model.program, DecodeProgram)
    prompts = [tok.encode(p) for p in PROMPTS[:rows]]
    ref_logits, ref_kv, _ = _decode(model, tok, None, kv_dtype, prompts, 3, threads)
    logits, kv, ran = _decode(model, tok, model.program, kv_dtype, prompts, 3, threads)
    assert ran == [True] * 3  # every step went through the program
    assert torch.equal(logits, ref_logits)
    assert torch.equal(kv, ref_kv)  # the K/V it wrote, and nothing else


def test_the_program_runs_only_where_every_piece_is_a_c_kernel(gguf, smol):
    model, tok = gguf
    assert DecodeProgram.for_model(smol[0]) is None  # float32 weights: torch linears
    eng = LLMEngine(EngineConfig(num_kv_blocks=64), model=model, tokenizer=tok)
    ids = tok.encode(PROMPTS[0])
    rid = eng.add_request(ids, SamplingParams(max_tokens=4))
    seq = eng.seqs[rid]
    eng._reserve_room([(seq, len(ids), [])])
    _, _, prefill, _, _ = eng.runner.prepare([(seq, len(ids))])
    assert not model.program.runs(len(ids), prefill)  # a prefill chunk
    seq.num_computed = len(ids) - 1
    _, _, decode, _, _ = eng.runner.prepare([(seq, 1)])
    assert model.program.runs(1, decode)
    with torch.profiler.profile():
        assert not model.program.runs(1, decode)  # a profiled step shows its ops
    eng.abort(rid)


def test_a_program_that_cannot_be_built_leaves_the_layers(gguf, monkeypatch):
    def unavailable(name, march="native"):
        raise KernelUnavailable("no compiler")

    monkeypatch.setattr("fluidpd.engine.decode_program.load", unavailable)
    with pytest.warns(RuntimeWarning, match="layer by layer: no compiler"):
        assert DecodeProgram.for_model(gguf[0]) is None
