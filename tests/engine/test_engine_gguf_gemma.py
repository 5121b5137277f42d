"""Gemma 2 / Gemma 3 GGUFs as llama.cpp writes and reads them: the norm names, what llama.cpp takes from the
metadata (and its defaults), the layer pattern, the score scale it fixes.

(The GGUF == safetensors tensors and logits of both: test_engine_weights; their Q8_0 / Q4_1 linears through
the gguf kernel: test_engine_quantization.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gguf_testdata import write_gguf

from fluidpd.engine.architectures import FULL, SLIDING
from fluidpd.engine.loaders.dummy import dummy_config, random_tensors, tiny_config
from fluidpd.engine.loaders.gguf import gguf_hf_names, load_gguf
from fluidpd.engine.loaders.gguf_gemma import gemma_config, gemma_query_pre_attn_scalar

S, F = SLIDING, FULL


@pytest.mark.parametrize(
    "arch, layers, hidden, heads, head_dim, want",
    [
        ("gemma2", 26, 2304, 8, 256, 256),  # 2B: head_dim (hidden / heads = 288)
        ("gemma2", 42, 3584, 16, 256, 256),  # 9B
        ("gemma2", 46, 4608, 32, 128, 144),  # 27B: hidden / heads, its query_pre_attn_scalar
        ("gemma3", 26, 1152, 4, 256, 256),  # 1B
        ("gemma3", 48, 3840, 16, 256, 256),  # 12B (hidden / heads = 240)
        ("gemma3", 62, 5376, 32, 128, 168),  # 27B
        ("gemma3", 46, 5376, 32, 128, 128),  # 46 layers is gemma2's 27B, not gemma3's
    ],
)
def test_score_scale_is_llama_cpps(arch, layers, hidden, heads, head_dim, want):
    assert gemma_query_pre_attn_scalar(arch, layers, hidden, heads, head_dim) == want


def _fields(arch: str, layers: int, meta: dict):
    cfg = replace(tiny_config(arch), num_layers=layers, layer_types=())
    return gemma_config(cfg, lambda key, default=None: meta.get(key, default))


def test_metadata_and_llama_cpps_defaults():
    """gemma2 without the keys: window 4096, caps 50 / 30, layers alternating from a sliding one; gemma3:
    a window only where the key is > 0, then every 6th layer global, local RoPE base 10000, no attention cap
    whatever the file says, a final cap only where the file has one."""
    f = _fields("gemma2", 4, {})
    assert (f["sliding_window"], f["attn_logit_softcapping"], f["final_logit_softcapping"]) == (4096, 50.0, 30.0)
    assert f["layer_types"] == (S, F, S, F) and f["rope_local_theta"] == 0.0 and f["query_pre_attn_scalar"] == 32
    f = _fields("gemma2", 2, {"attention.sliding_window": 16, "attn_logit_softcapping": 2.0})
    assert (f["sliding_window"], f["attn_logit_softcapping"], f["final_logit_softcapping"]) == (16, 2.0, 30.0)
    f = _fields("gemma3", 7, {"attention.sliding_window": 512, "attn_logit_softcapping": 2.0})
    assert f["layer_types"] == (S,) * 5 + (F, S) and f["sliding_window"] == 512 and f["rope_local_theta"] == 1e4
    assert f["attn_logit_softcapping"] == 0.0 and f["final_logit_softcapping"] == 0.0
    assert _fields("gemma3", 2, {"final_logit_softcapping": 30.0})["final_logit_softcapping"] == 30.0
    for meta in ({}, {"attention.sliding_window": 0}):  # no window: every layer global
        f = _fields("gemma3", 3, meta)
        assert f["sliding_window"] == 0 and f["layer_types"] == (F, F, F)


def test_sliding_window_pattern_key_is_honoured():
    """gguf-py's {arch}.attention.sliding_window_pattern: a period (0: every layer sliding) or a bool per layer."""
    window = {"attention.sliding_window": 8}
    assert _fields("gemma3", 4, {**window, "attention.sliding_window_pattern": 2})["layer_types"] == (S, F, S, F)
    assert _fields("gemma2", 3, {**window, "attention.sliding_window_pattern": 0})["layer_types"] == (S, S, S)
    pattern = [False, True, True]
    assert _fields("gemma2", 3, {**window, "attention.sliding_window_pattern": pattern})["layer_types"] == (F, S, S)
    with pytest.raises(ValueError, match="names 2 layers"):
        _fields("gemma2", 3, {**window, "attention.sliding_window_pattern": [True, False]})


def test_gemma_norm_names():
    """llama.cpp's ffn_norm is Gemma's norm before the MLP (Llama's post_attention_layernorm elsewhere)."""
    gemma, llama = tiny_config("gemma2"), tiny_config("llama")
    assert gguf_hf_names(gemma, "blk.1.ffn_norm.weight") == ["model.layers.1.pre_feedforward_layernorm.weight"]
    assert gguf_hf_names(gemma, "blk.1.post_attention_norm.weight") == [
        "model.layers.1.post_attention_layernorm.weight"
    ]
    assert gguf_hf_names(gemma, "blk.0.post_ffw_norm.weight") == ["model.layers.0.post_feedforward_layernorm.weight"]
    assert gguf_hf_names(gemma, "blk.0.attn_norm.weight") == ["model.layers.0.input_layernorm.weight"]
    assert gguf_hf_names(llama, "blk.1.ffn_norm.weight") == ["model.layers.1.post_attention_layernorm.weight"]


def test_converter_file_gets_llama_cpps_pattern_and_a_pattern_key_overrides_it(tmp_path):
    """tiny gemma3 (2 layers, the second global): a file as the converter writes it (no pattern key) reads as
    llama.cpp does, both layers sliding; with a per-layer pattern, as written; the dummy loader gets the same
    shape from the GGUF."""
    cfg = replace(tiny_config("gemma3"), query_pre_attn_scalar=32, rms_norm_eps=2.0**-20)
    tensors = random_tensors(cfg, torch.float32, seed=8)
    write_gguf(tmp_path / "conv.gguf", tensors, cfg=replace(cfg, layer_types=(S, S)))
    assert load_gguf(str(tmp_path / "conv.gguf")).config == replace(cfg, layer_types=(S, S))
    write_gguf(tmp_path / "pat.gguf", tensors, cfg=cfg)  # (S, F) is not llama.cpp's: the writer adds the key
    ck = load_gguf(str(tmp_path / "pat.gguf"))
    assert ck.config == cfg
    assert dummy_config(str(tmp_path / "pat.gguf"), {})[0] == cfg
    norm = "model.layers.0.self_attn.q_norm.weight"  # q/k norms: 1 + w in the file too
    assert (ck.tensors[norm] - tensors[norm]).abs().max() < 1e-6
