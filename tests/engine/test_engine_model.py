"""Model numerics against transformers (same weights): SmolLM2 GGUF, Qwen2 (qkv bias), Llama 3
rope scaling; safetensors loading; dummy weights; bf16."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from engine_testdata import MAX_TOKENS, PROMPTS
from engine_tolerance import logits_tol

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.model_config import ModelConfig


@pytest.mark.slow
def test_logits_match_transformers_prefill_and_decode(make_engine, hf_smol):
    eng = make_engine(num_kv_blocks=16, kv_cache_dtype="float32")  # the subject is fp32 arithmetic: fp32 KV
    ids = eng.tokenizer.encode(PROMPTS[4])
    with torch.no_grad():  # same weights, exact in fp64
        ref = copy.deepcopy(hf_smol).double()(torch.tensor([ids])).logits[0]
    prefill = eng.prompt_logits(ids)  # one chunk
    decode = eng.prompt_logits(ids, [len(ids) - 6] + [1] * 6)  # then 6 decode steps
    tol = logits_tol(eng.model_config, len(ids), torch.float32, ref.abs().max().item())
    assert (prefill - ref).abs().max().item() <= tol
    assert (decode[-6:] - ref[-6:]).abs().max().item() <= tol
    assert torch.equal(prefill.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
def test_greedy_matches_transformers_generate(make_engine, hf_smol):
    eng = make_engine(num_kv_blocks=16, kv_cache_dtype="float32")  # fp32 end to end, as transformers runs
    ours = eng.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0].token_ids
    ids = eng.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        out = hf_smol.generate(
            torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False, pad_token_id=2, eos_token_id=None
        )
    assert out[0, len(ids) :].tolist() == ours


def _tiny(arch: str, **kw) -> ModelConfig:
    return replace(tiny_config(arch, vocab_size=96), **kw)


def _hf_model(cfg: ModelConfig, tensors: dict[str, torch.Tensor]):
    transformers = pytest.importorskip("transformers")
    hf_cfg = cfg.to_hf()
    if cfg.architecture == "qwen2":
        conf, cls = transformers.Qwen2Config(**hf_cfg), transformers.Qwen2ForCausalLM
    elif cfg.architecture == "qwen3":
        conf, cls = transformers.Qwen3Config(**hf_cfg), transformers.Qwen3ForCausalLM
    elif cfg.architecture == "phi3":
        conf, cls = transformers.Phi3Config(**hf_cfg), transformers.Phi3ForCausalLM
    else:
        conf, cls = transformers.LlamaConfig(**hf_cfg), transformers.LlamaForCausalLM
    model = cls(conf).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all("lm_head" in m or "rotary" in m for m in missing), (missing, unexpected)
    return model


def _save_checkpoint(path, cfg: ModelConfig, tensors) -> None:
    from safetensors.torch import save_file

    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    names = sorted(tensors)
    half = len(names) // 2  # two shards
    save_file({n: tensors[n].contiguous() for n in names[:half]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n].contiguous() for n in names[half:]}, str(path / "model-00002-of-00002.safetensors"))


def _engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), num_kv_blocks=32, **{"quantization": "none", **kw}))


IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 26, 50, 8, 90, 1, 45, 19, 77, 30]


@pytest.mark.parametrize(
    "arch,kw",
    [
        ("llama", {}),
        ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
        (
            "llama",
            dict(
                rope_scaling=dict(
                    rope_type="llama3",
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=16,
                )
            ),
        ),
        ("llama", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
        ("qwen3", dict(head_dim=32, tie_word_embeddings=True, rope_theta=1e6)),  # head_dim != hidden / heads
        ("phi3", {}),
    ],
    ids=["llama", "qwen2-bias", "llama3-rope", "linear-rope", "qwen3-qk-norm", "phi3-fused"],
)
def test_tiny_models_match_transformers(tmp_path, arch, kw):
    cfg = _tiny(arch, **kw)
    tensors = random_tensors(cfg, torch.float32, seed=3)
    if cfg.attention_bias:
        assert "model.layers.0.self_attn.q_proj.bias" in tensors
    if cfg.qk_norm:
        assert "model.layers.0.self_attn.k_norm.weight" in tensors
    if cfg.fused_projections:
        assert (
            "model.layers.0.self_attn.qkv_proj.weight" in tensors and "model.layers.0.mlp.up_proj.weight" not in tensors
        )
    _save_checkpoint(tmp_path / "ckpt", cfg, tensors)
    eng = _engine(tmp_path / "ckpt", kv_cache_dtype="float32")  # exact fp32 arithmetic against fp64: fp32 KV
    assert eng.model_config == cfg
    with torch.no_grad():  # same weights, exact in fp64
        ref = _hf_model(cfg, tensors).double()(torch.tensor([IDS])).logits[0]
    ours = eng.prompt_logits(IDS, [7, 5, 1, 1, 3, 1, 1, 1])
    assert (ours - ref).abs().max().item() <= logits_tol(cfg, len(IDS), torch.float32, ref.abs().max().item())


def test_safetensors_checkpoint_matches_dummy_forward(tmp_path):
    cfg = _tiny("llama")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(cfg.to_hf()))
    dummy = _engine(tmp_path / "cfg" / "config.json", load_format="dummy", seed=11)
    _save_checkpoint(tmp_path / "ckpt", cfg, random_tensors(cfg, torch.float32, seed=11))
    loaded = _engine(tmp_path / "ckpt")
    a, b = dummy.prompt_logits(IDS), loaded.prompt_logits(IDS)
    assert torch.equal(a, b)
    assert not torch.equal(a, _engine(tmp_path / "cfg", load_format="dummy", seed=12).prompt_logits(IDS))


def test_dummy_preset_shapes_and_overrides():
    eng = LLMEngine(
        EngineConfig(
            model="llama-3.2-1b",
            load_format="dummy",
            num_kv_blocks=4,
            model_overrides=dict(num_hidden_layers=1, vocab_size=512, intermediate_size=256),
            max_model_len=128,
        )
    )
    mc = eng.model_config
    assert (mc.num_layers, mc.hidden_size, mc.num_kv_heads, mc.vocab_size) == (1, 2048, 8, 512)
    assert mc.rope_scaling["rope_type"] == "llama3"
    out = eng.generate([[1, 2, 3, 4]], None)[0]
    assert len(out.token_ids) == 16 and out.text is None


def test_bf16_runs_and_tracks_fp32(tmp_path):
    cfg = _tiny("llama")
    _save_checkpoint(tmp_path / "ckpt", cfg, random_tensors(cfg, torch.float32, seed=4))
    f32 = _engine(tmp_path / "ckpt", kv_cache_dtype="float32").prompt_logits(IDS)  # fp32 throughout
    eng = _engine(tmp_path / "ckpt", dtype="bfloat16")
    assert eng.arena.buffer.dtype == torch.bfloat16 and eng.model.lm_head.weight.dtype == torch.bfloat16
    bf = eng.prompt_logits(IDS, [10, 1, 1, 8])
    assert bf.dtype == torch.float32
    scale = f32.abs().max().item()  # each is within its own dtype's bound of the exact logits
    tol = logits_tol(cfg, len(IDS), torch.bfloat16, scale) + logits_tol(cfg, len(IDS), torch.float32, scale)
    assert (bf - f32).abs().max().item() <= tol
