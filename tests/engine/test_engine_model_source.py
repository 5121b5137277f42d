"""A model's tokenizer without its weights: `load_tokenizer` (what a serving process reads, no torch)
gives the tokenizer `load_model` gives the engine, for every kind of model source."""

from __future__ import annotations

import json

import pytest
import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.loaders.dummy import random_tensors
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.model_loading import load_model
from fluidpd.engine.model_source import load_tokenizer

SHAPE = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
ONE_LAYER = {"num_hidden_layers": 1}
TEXT = "The capital of France is 12345 <|im_start|>hi"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def signature(tok) -> tuple | None:
    if tok is None:
        return None
    chat = tok.encode_chat(CHAT) if tok.chat_template else None
    return tok.encode(TEXT), tok.bos_token_id, tok.eos_token_ids, tok.add_bos, tok.vocab_size, chat


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, smol) -> dict[str, str]:
    """A safetensors directory with SmolLM2's tokenizer.json and chat template, and one without a tokenizer."""
    from safetensors.torch import save_file

    tok = smol[1]
    with_tok, bare = tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("bare")
    for d in (with_tok, bare):
        (d / "config.json").write_text(json.dumps(SHAPE))
        save_file(random_tensors(ModelConfig.from_hf(SHAPE), torch.float32, 0), str(d / "model.safetensors"))
    tok.tk.save(str(with_tok / "tokenizer.json"))
    (with_tok / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": tok.chat_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
    )
    return {"with": str(with_tok), "bare": str(bare)}


def test_the_ggufs_own_tokenizer(smol):
    assert signature(load_tokenizer(EngineConfig())) == signature(smol[1])  # the engine tests' load_model


@pytest.mark.parametrize(
    ("case", "has_one"),
    [
        pytest.param(  # the GGUF's shape and tokenizer (parsed three times: slow)
            dict(model="smollm2", load_format="dummy", model_overrides=ONE_LAYER), True, marks=pytest.mark.slow
        ),
        (dict(model="smollm2-135m", load_format="dummy", model_overrides=ONE_LAYER), False),  # a preset
        pytest.param(
            dict(model="smollm2-135m", load_format="dummy", model_overrides=ONE_LAYER, tokenizer="smollm2"),
            True,
            marks=pytest.mark.slow,
        ),
        (dict(model="with"), True),  # safetensors + tokenizer.json
        (dict(model="with", load_format="dummy"), True),  # its config.json's shape, its tokenizer.json
        (dict(model="with/config.json", load_format="dummy"), True),
        (dict(model="bare"), False),  # no tokenizer beside it
        (dict(model="bare", tokenizer="with"), True),
    ],
)
def test_load_tokenizer_gives_what_load_model_gives(checkpoints, case, has_one):
    case = dict(case)
    for key in ("model", "tokenizer"):
        head, _, tail = str(case.get(key, "")).partition("/")
        if head in checkpoints:
            case[key] = checkpoints[head] + (f"/{tail}" if tail else "")
    config = EngineConfig(quantization="none", **case)
    expected = signature(load_model(config)[1])
    assert (expected is not None) == has_one
    assert signature(load_tokenizer(config)) == expected
