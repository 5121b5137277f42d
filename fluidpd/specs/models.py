"""Model architecture specs: exact parameter counts, weight and KV-cache sizes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fluidpd.core.registry import Registry

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)


def _check_dtype(dtype: str, what: str = "dtype") -> None:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown {what} {dtype!r}; expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """An LLM architecture (decoder-only transformer) at a given weight and KV-cache precision."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool  # SwiGLU (3 matrices) vs OPT's 2-matrix ReLU MLP
    qkv_bias: bool  # bias on the q/k/v projections (Qwen2, OPT)
    max_context: int
    dtype: str = "bf16"
    kv_dtype: str | None = None  # None: same as dtype
    dense_bias: bool = False  # bias on o_proj and the MLP projections (OPT)
    norm_bias: bool = False  # LayerNorm with bias (OPT) instead of RMSNorm
    pos_embeddings: int = 0  # rows of a learned position table (OPT: max_context + 2)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        kv_dtype = self.dtype if self.kv_dtype is None else self.kv_dtype
        object.__setattr__(self, "kv_dtype", kv_dtype)
        _check_dtype(kv_dtype, "kv_dtype")
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "vocab", "max_context"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")

    # --- parameter counts -------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        """Weights of the q/k/v/o projections of one layer (no biases)."""
        q_out = self.n_heads * self.head_dim
        kv_out = self.n_kv_heads * self.head_dim
        return self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of the MLP projections of one layer (no biases)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: all layers' projections plus the LM head."""
        return self.n_layers * (self.attn_params_per_layer + self.mlp_params_per_layer) + self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Exact parameter count: embeddings, LM head, projections, biases and norms."""
        h, i = self.hidden, self.intermediate
        per_norm = 2 * h if self.norm_bias else h
        per_layer = self.attn_params_per_layer + self.mlp_params_per_layer + 2 * per_norm
        if self.qkv_bias:
            per_layer += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        if self.dense_bias:
            per_layer += h + ((2 * i if self.gated_mlp else i) + h)
        embed = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.n_layers * per_layer + embed + self.pos_embeddings * h + per_norm

    # --- sizes and costs ----------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def weight_bytes(self) -> int:
        """All parameters stored at `dtype` (FP8 checkpoints that keep the LM head in bf16 are ignored)."""
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def flops_per_token(self) -> int:
        """Dense matmul FLOPs of one token's forward pass (2 per multiplied weight, no embedding lookup)."""
        return 2 * self.matmul_params

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of QK^T plus PV for one (query, key) pair across all layers and heads."""
        return 4 * self.n_layers * self.n_heads * self.head_dim


def _llama(name, layers, hidden, heads, kv, inter, vocab, ctx, tied=False, qkv_bias=False, head_dim=None):
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
    )


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
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    _opt("opt-13b", 40, 5120, 40),
    _opt("opt-66b", 64, 9216, 72),
    _opt("opt-175b", 96, 12288, 96),
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, qkv_bias=True),
    _llama("smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, tied=True),
):
    MODELS.add(_m.name, _m)
MODEL_NAMES: tuple[str, ...] = MODELS.names()


def get_model(name: str, dtype: str = "bf16", kv_dtype: str | None = None) -> ModelSpec:
    """Catalog model by CLI name, at weight `dtype` and KV `kv_dtype` (default: same as dtype)."""
    base = MODELS.get(name.lower())
    _check_dtype(dtype)
    if kv_dtype is not None:
        _check_dtype(kv_dtype, "kv_dtype")
    return dataclasses.replace(base, dtype=dtype, kv_dtype=kv_dtype or dtype)
