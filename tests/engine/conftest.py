"""Shared fixtures for the engine tests: SmolLM2 loaded once per session, engines share its weights; and
`--device` (cpu, cuda, cuda:N), the device tests/engine/test_engine_on_device.py runs on (the GPU check's
`engine` part passes it; the suite runs them on the CPU)."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)

from engine_testdata import MAX_TOKENS, PROMPTS  # noqa: E402

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, load_model  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    # Read at startup where this directory (or a file in it) is on the command line; a run of the whole
    # suite loads this conftest later and gets the default.
    parser.addoption("--device", default="cpu", help="torch device of the engine's device tests (cpu, cuda, cuda:N)")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device the engine's device tests build their engines and references on (`--device`)."""
    return str(request.config.getoption("device"))


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
