"""The model catalogue: the architectures the simulator and the latency model know, by CLI name.

Shapes are the released checkpoints' Hugging Face config.json values; `params` matches their
safetensors totals (tests/specs/test_specs_models.py).
"""

from __future__ import annotations

import dataclasses

from fluidpd.core.registry import Registry
from fluidpd.specs.model_spec import DTYPE_BYTES, DTYPES, ModelSpec, check_dtype

__all__ = ["DTYPES", "DTYPE_BYTES", "MODELS", "MODEL_NAMES", "ModelSpec", "get_model"]


def _llama(name, layers, hidden, heads, kv, inter, vocab, ctx, tied=False, qkv_bias=False, head_dim=None, **extra):
    return ModelSpec(
        name,
        layers,
        hidden,
        heads,
        kv,
        head_dim or hidden // heads,
        inter,
        vocab,
        tied_embeddings=tied,
        gated_mlp=True,
        qkv_bias=qkv_bias,
        max_context=ctx,
        **extra,
    )


def _qwen3(name, layers, hidden, heads, kv, inter, **moe):
    """Qwen3 and Qwen3-MoE: head_dim 128 whatever the hidden size, q/k norms, 151,936 tokens, untied."""
    return _llama(name, layers, hidden, heads, kv, inter, 151936, 40960, head_dim=128, qk_norm=True, **moe)


def _opt(name, layers, hidden, heads, ctx=2048):
    return ModelSpec(
        name,
        layers,
        hidden,
        heads,
        heads,
        hidden // heads,
        4 * hidden,
        50272,
        tied_embeddings=True,
        gated_mlp=False,
        qkv_bias=True,
        max_context=ctx,
        dense_bias=True,
        norm_bias=True,
        pos_embeddings=ctx + 2,
    )


MODELS: Registry[ModelSpec] = Registry("model")
for _m in (
    _llama("llama-3.3-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),  # the same shape as 3.3's
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    _opt("opt-13b", 40, 5120, 40),
    _opt("opt-66b", 64, 9216, 72),
    _opt("opt-175b", 96, 12288, 96),
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, qkv_bias=True),
    _llama("smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, tied=True),
    _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288),
    _qwen3("qwen3-32b", 64, 5120, 64, 8, 25600),
    # every layer sparse (decoder_sparse_step 1, no mlp_only_layers); norm_topk_prob true
    _qwen3("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, n_experts=128, experts_per_token=8, expert_intermediate=768),
    _qwen3("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, n_experts=128, experts_per_token=8, expert_intermediate=1536),
    # v0.1's config.json has "sliding_window": null (Mistral-7B v0.1's 4096 is not Mixtral's): full attention
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, n_experts=8, experts_per_token=2),
    # text model only (the SigLIP vision tower is not counted); GeGLU; sliding_window_pattern 6:
    # every 6th layer global, the other 52 of 62 windowed to 1,024 tokens
    _llama(
        "gemma-3-27b",
        62,
        5376,
        32,
        16,
        21504,
        262208,
        131072,
        tied=True,
        head_dim=128,
        qk_norm=True,
        layer_norms=4,
        sliding_window=1024,
        sliding_layers=62 - 62 // 6,
    ),
):
    MODELS.add(_m.name, _m)
MODEL_NAMES: tuple[str, ...] = MODELS.names()


def get_model(name: str, dtype: str = "bf16", kv_dtype: str | None = None) -> ModelSpec:
    """Catalog model by CLI name, at weight `dtype` and KV `kv_dtype` (default: same as dtype)."""
    base = MODELS.get(name.lower())
    check_dtype(dtype)
    if kv_dtype is not None:
        check_dtype(kv_dtype, "kv_dtype")
    return dataclasses.replace(base, dtype=dtype, kv_dtype=kv_dtype or dtype)
