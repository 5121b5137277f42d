"""Shared fixtures for the engine tests: SmolLM2 loaded once per session, engines share its weights."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)

from engine_testdata import MAX_TOKENS, PROMPTS  # noqa: E402

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, load_model  # noqa: E402


@pytest.fixture(scope="session")
def smol():
    """(model, tokenizer) of SmolLM2-135M-Instruct (GGUF, fp32, unquantised: the reference path), loaded once."""
    return load_model(EngineConfig(quantization="none"))


@pytest.fixture(scope="session")
def make_engine(smol):
    model, tok = smol

    def make(**kw) -> LLMEngine:
        return LLMEngine(EngineConfig(**{"quantization": "none", **kw}), model=model, tokenizer=tok)

    return make


@pytest.fixture(scope="session")
def reference(make_engine):
    """Greedy outputs of PROMPTS, each alone on a fresh engine with whole-prompt prefill."""
    eng = make_engine(num_kv_blocks=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [eng.generate([p], params)[0].token_ids for p in PROMPTS]


@pytest.fixture(scope="session")
def hf_smol():
    """transformers' LlamaForCausalLM from the same GGUF (test-only dependency)."""
    transformers = pytest.importorskip("transformers")
    from fluidpd.engine.loaders import smollm2_gguf

    path = smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    return model.eval()
