"""Weight loading: GGUF (dequantisation, llama.cpp's Q/K permutation), config parsing, errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf_testdata import Q, permute, write_gguf

from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.architectures import FULL, SLIDING
from fluidpd.engine.loaders import resolve_model
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.loaders.gguf import gguf_to_hf_name, load_gguf, unpermute_qk
from fluidpd.engine.model_config import ModelConfig

CFG = replace(
    tiny_config("llama", vocab_size=64),
    rms_norm_eps=2.0**-17,  # exact in the GGUF's float32
    max_position_embeddings=128,
    tie_word_embeddings=True,
)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert np.array_equal(unpermute_qk(permute(w, 8), 8), w)
    assert not np.array_equal(permute(w, 8), w)


def test_gguf_names():
    assert gguf_to_hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert gguf_to_hf_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert gguf_to_hf_name("output.weight") == "lm_head.weight"
    assert gguf_to_hf_name("blk.0.unknown.weight") is None


def quantisation_error_bound(ref: torch.Tensor, qtype) -> torch.Tensor:
    """Per element, the most |dequantised - ref| can be after `write_gguf` stored `ref` as `qtype`."""
    if ref.ndim == 1 or qtype == Q.F32:  # written as F32: exact
        return torch.zeros_like(ref, dtype=torch.float64)
    x = ref.double()
    u16, u32 = torch.finfo(torch.float16).eps / 2, torch.finfo(torch.float32).eps / 2
    if qtype == Q.F16:  # round to nearest; half a subnormal step below 2**-14
        return u16 * x.abs() + torch.finfo(torch.float16).tiny * u16
    if qtype == Q.BF16:  # round to nearest even (gguf.quants.BF16)
        return torch.finfo(torch.bfloat16).eps / 2 * x.abs()
    blocks = x.reshape(-1, 32)  # 32 values of a row share a scale d (fp16)
    amax = blocks.abs().amax(-1, keepdim=True)
    if qtype == Q.Q8_0:  # q = round(x / d) in [-127, 127], d = amax / 127
        d = amax / 127
        grid = d / 2 + 127 * u16 * d
    elif qtype == Q.Q4_0:  # q in [-8, 7], d = amax / 8: the other sign's
        d = amax / 8  # extreme (8d) is clipped to 7d, a whole step
        grid = d + 8 * u16 * d
    else:  # Q4_1: q in [0, 15], x = q * d + min (both fp16)
        d = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15
        grid = d / 2 + 15 * u16 * d + u16 * blocks.amin(-1, keepdim=True).abs()
    # fp32 rounding: x / d may cross a half step (3 u32 * |q| * d <= 6 u32 * amax), q * d (+ min) 2 u32 * amax
    return (grid + 8 * u32 * amax).expand_as(blocks).reshape(ref.shape)


@pytest.mark.parametrize(
    "qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_1, Q.Q4_0], ids=["F32", "F16", "BF16", "Q8_0", "Q4_1", "Q4_0"]
)
def test_gguf_dequantises_and_unpermutes(tmp_path, qtype):
    tensors = random_tensors(CFG, torch.float32, seed=1)
    write_gguf(tmp_path / "m.gguf", tensors, qtype, cfg=CFG)
    ck = load_gguf(str(tmp_path / "m.gguf"))
    assert ck.config == CFG
    assert set(ck.tensors) == set(tensors)
    for name, ref in tensors.items():
        got = ck.tensors[name]
        assert got.shape == ref.shape and got.dtype == torch.float32
        assert ((got.double() - ref.double()).abs() <= quantisation_error_bound(ref, qtype)).all(), name


QWEN3 = replace(
    tiny_config("qwen3", vocab_size=64),
    rms_norm_eps=2.0**-20,  # exact in the GGUF's float32
    max_position_embeddings=128,
    tie_word_embeddings=True,
)
PHI3 = replace(QWEN3, architecture="phi3", head_dim=16, rope_theta=10000.0)
MIXTRAL = replace(tiny_config("mixtral", vocab_size=64), rms_norm_eps=2.0**-20, max_position_embeddings=128)
QWEN3_MOE = replace(  # norm_topk_prob: llama.cpp renormalises Qwen3-MoE's top k (as the released models do)
    tiny_config("qwen3_moe", vocab_size=64),
    rms_norm_eps=2.0**-20,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    norm_topk_prob=True,
)

# Gemma in the shapes llama.cpp fixes what the GGUF does not carry: scores scaled by head_dim^-1/2 (not a 27B),
# gemma2's layers alternating sliding / global, gemma3's every 6th global; a window of 4 under the 8-token
# prompt, caps exact in float32 that change the logits
GEMMA2 = replace(
    tiny_config("gemma2", vocab_size=64),
    rms_norm_eps=2.0**-20,
    max_position_embeddings=128,
    sliding_window=4,
    query_pre_attn_scalar=32,
    attn_logit_softcapping=0.25,
)
GEMMA3 = replace(
    tiny_config("gemma3", vocab_size=64),
    rms_norm_eps=2.0**-20,
    max_position_embeddings=128,
    num_layers=6,
    layer_types=(SLIDING,) * 5 + (FULL,),
    sliding_window=4,
    query_pre_attn_scalar=32,
)


@pytest.mark.parametrize(
    "cfg",
    [CFG, QWEN3, PHI3, MIXTRAL, QWEN3_MOE, GEMMA2, GEMMA3],
    ids=["llama", "qwen3", "phi3", "mixtral", "qwen3_moe", "gemma2", "gemma3"],
)
def test_gguf_with_llama_cpp_names_matches_its_safetensors(tmp_path, cfg):
    """llama.cpp's GGUF of each architecture: llama's permuted Q/K rows, qwen3's attn_q_norm /
    attn_k_norm and head_dim from key_length, phi3's fused attn_qkv and ffn_up (gate|up), Mixtral
    as llama with expert_count, qwen3moe's expert_feed_forward_length, the router as ffn_gate_inp and
    every expert stacked into ffn_*_exps, Gemma's post_attention_norm / ffn_norm / post_ffw_norm holding
    1 + w, its window and caps (gemma2) and linear RoPE scaling (gemma3) in the metadata; the tensors
    read back exactly (each expert under its own index, Gemma's norms as w) and the engine's logits
    equal the safetensors checkpoint's."""
    import json

    from safetensors.torch import save_file

    tensors = random_tensors(cfg, torch.float32, seed=4)
    if cfg.gemma:  # norms on a 2**-12 grid: 1 + w, and the loader's (1 + w) - 1, exact in float32
        tensors = {n: (t * 4096).round() / 4096 if n.endswith("norm.weight") else t for n, t in tensors.items()}
    write_gguf(tmp_path / "m.gguf", tensors, cfg=cfg)
    ck = load_gguf(str(tmp_path / "m.gguf"))
    assert ck.config == cfg and set(ck.tensors) == set(tensors)
    assert all(torch.equal(ck.tensors[n], t) for n, t in tensors.items())
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(tensors, str(tmp_path / "st" / "model.safetensors"))
    ids = [3, 9, 27, 1, 40, 22, 8, 63]
    a = LLMEngine(EngineConfig(model=str(tmp_path / "m.gguf"), num_kv_blocks=8)).prompt_logits(ids)
    b = LLMEngine(EngineConfig(model=str(tmp_path / "st"), num_kv_blocks=8)).prompt_logits(ids)
    assert torch.equal(a, b)


def test_unknown_gguf_architecture(tmp_path):
    write_gguf(tmp_path / "g.gguf", random_tensors(CFG, torch.float32, seed=1), cfg=CFG, arch="gpt2")
    with pytest.raises(ValueError, match="unknown architecture 'gpt2'"):
        LLMEngine(EngineConfig(model=str(tmp_path / "g.gguf")))


def test_unknown_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown architecture"):
        LLMEngine(EngineConfig(model=str(tmp_path)))


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="model not found"):
        LLMEngine(EngineConfig(model=str(tmp_path / "nope.gguf")))
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path), "auto")  # empty directory
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        LLMEngine(EngineConfig(model=str(tmp_path)))
    with pytest.raises(FileNotFoundError):
        LLMEngine(EngineConfig(model="no-such-preset", load_format="dummy"))


def test_hf_config_v4_and_v5_spellings():
    base = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    v4 = ModelConfig.from_hf(
        {
            **base,
            "rope_theta": 5e5,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    v5 = ModelConfig.from_hf(
        {
            **base,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    assert v4 == v5 and v4.rope_theta == 5e5 and v4.head_dim == 4
    with pytest.raises(ValueError, match="rope scaling"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.from_hf({**base, "num_key_value_heads": 3, "num_attention_heads": 4})
