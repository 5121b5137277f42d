"""Dummy (random) weights in a preset's, a GGUF's or a config.json's shape: no checkpoint needed."""

from __future__ import annotations

import os
from typing import Any

import torch

from fluidpd.engine.architectures import FULL, SLIDING
from fluidpd.engine.gguf_file import GGUFFile
from fluidpd.engine.loaders.checkpoint import LOADERS, Checkpoint
from fluidpd.engine.loaders.gguf import gguf_model_config
from fluidpd.engine.model_config import ModelConfig, read_hf_config
from fluidpd.engine.model_source import DUMMY_PRESETS
from fluidpd.engine.moe import moe_tensor_names

__all__ = ["DUMMY_PRESETS", "dummy_config", "load_dummy", "random_tensors", "tiny_config", "weight_shapes"]

_GEMMA = dict(
    head_dim=32, tie_word_embeddings=True, sliding_window=8, layer_types=(SLIDING, FULL), query_pre_attn_scalar=24
)
TINY_QUIRKS: dict[str, dict[str, Any]] = {  # what each architecture's real configs do that the base shape does not
    "mixtral": dict(num_experts=4, num_experts_per_tok=2, rope_theta=1e6),
    "qwen3_moe": dict(
        head_dim=32, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=False
    ),
    "qwen3": dict(head_dim=32, rope_theta=1e6),  # head_dim independent of hidden / heads
    "qwen2": dict(attention_bias=True, rope_theta=1e6),
    # windows of 8 tokens (a prompt of the tests outgrows them), scale and caps where they change the result
    "gemma2": dict(**_GEMMA, attn_logit_softcapping=0.2, final_logit_softcapping=1.0),
    "gemma3": dict(**_GEMMA, rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_local_theta=1e4),
    "mistral": dict(architecture="llama", sliding_window=8),  # every layer windowed: older KV is freed
}


def tiny_config(architecture: str, vocab_size: int = 128) -> ModelConfig:
    """A 2-layer model of `architecture` (64 hidden, 4 heads over 2 KV heads) with its quirks: the
    shape the engine is checked against transformers in."""
    base: dict[str, Any] = dict(
        architecture=architecture,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    return ModelConfig(**{**base, **TINY_QUIRKS.get(architecture, {})})


def dummy_config(model: str, overrides: dict[str, Any]) -> tuple[ModelConfig, str | None]:
    """A dummy model's shape: a preset name, "smollm2" (the GGUF's shape), or a config.json/dir."""
    tok = None
    if model in DUMMY_PRESETS:
        hf = dict(DUMMY_PRESETS[model])
    elif model.endswith(".gguf"):
        hf = gguf_model_config(GGUFFile(model)).to_hf()
        tok = model
    else:
        hf = read_hf_config(model)
        d = model if os.path.isdir(model) else os.path.dirname(model)
        tok = d if os.path.isfile(os.path.join(d, "tokenizer.json")) else None
    hf.update(overrides)
    return ModelConfig.from_hf(hf), tok


def _layer_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """One layer's tensor shapes under the checkpoint's names (prefix `p`), in a fixed order."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
        p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
        p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
        p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
        p + "mlp.gate_proj.weight": (i, h),
        p + "mlp.up_proj.weight": (i, h),
        p + "mlp.down_proj.weight": (h, i),
    }
    if cfg.num_experts:  # the dense MLP's place: a router and the experts
        for x in ("gate_proj", "up_proj", "down_proj"):
            del shapes[p + f"mlp.{x}.weight"]
        ie = cfg.expert_intermediate_size
        router, *experts = moe_tensor_names(cfg, p)
        shapes[router] = (cfg.num_experts, h)
        for gate, up, down in zip(experts[::3], experts[1::3], experts[2::3], strict=True):
            shapes.update({gate: (ie, h), up: (ie, h), down: (h, ie)})
    if cfg.fused_projections:  # one tensor each for q|k|v and gate|up, rows in that order
        for fused, parts in (
            ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
            ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
        ):
            shapes[p + fused + ".weight"] = (sum(shapes.pop(p + x + ".weight")[0] for x in parts), h)
    if cfg.gemma:
        shapes.update({p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)})
    if cfg.qk_norm:
        shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    if cfg.attention_bias:
        shapes.update(
            {
                p + "self_attn.q_proj.bias": (cfg.num_heads * d,),
                p + "self_attn.k_proj.bias": (cfg.num_kv_heads * d,),
                p + "self_attn.v_proj.bias": (cfg.num_kv_heads * d,),
            }
        )
    return shapes


def random_tensors(cfg: ModelConfig, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random weights with the checkpoint's names (std 0.02, norms near 1), reproducible by seed."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        t = torch.empty(shape, dtype=torch.float32)
        if name.endswith("norm.weight"):  # Gemma's scale is 1 + w
            t.uniform_(*((-0.2, 0.2) if cfg.gemma else (0.8, 1.2)), generator=g)
        else:
            t.normal_(0.0, 0.02, generator=g)
        out[name] = t.to(dtype)
    return out


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of `cfg`'s checkpoint by its name, with its shape."""
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        shapes.update(_layer_shapes(cfg, f"model.layers.{n}."))
    return shapes


@LOADERS.register("dummy")
def load_dummy(
    model: str, dtype: torch.dtype = torch.float32, *, seed: int = 0, overrides: dict[str, Any] | None = None
) -> Checkpoint:
    """Random weights (`random_tensors`) in the shape `dummy_config` gives."""
    cfg, tok = dummy_config(model, overrides or {})
    return Checkpoint(
        cfg,
        random_tensors(cfg, dtype, seed),
        tokenizer_source=tok,
        meta={"format": "dummy", "model": model, "seed": seed},
    )
