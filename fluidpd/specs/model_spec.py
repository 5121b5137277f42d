"""ModelSpec: one decoder-only architecture's exact parameter counts, weight and KV-cache sizes."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)


def check_dtype(dtype: str, what: str = "dtype") -> None:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown {what} {dtype!r}; expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only LLM architecture (dense or mixture of experts) at a given weight and KV precision."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's width (a sparse model's config value, unused when every layer is sparse)
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool  # SwiGLU / GeGLU (3 matrices) vs OPT's 2-matrix ReLU MLP
    qkv_bias: bool  # bias on the q/k/v projections (Qwen2, OPT)
    max_context: int
    dtype: str = "bf16"
    kv_dtype: str | None = None  # None: same as dtype
    dense_bias: bool = False  # bias on o_proj and the MLP projections (OPT)
    norm_bias: bool = False  # LayerNorm with bias (OPT) instead of RMSNorm
    pos_embeddings: int = 0  # rows of a learned position table (OPT: max_context + 2)
    layer_norms: int = 2  # hidden-sized norms per layer (Gemma 3: 4, before and after attention and MLP)
    qk_norm: bool = False  # an RMSNorm weight of head_dim on the queries and one on the keys (Qwen3, Gemma 3)
    n_experts: int = 0  # a sparse mixture of experts as every layer's MLP (0: dense)
    experts_per_token: int = 0  # k of the router's top k
    expert_intermediate: int = 0  # one expert's MLP width (0: `intermediate`, as Mixtral's)
    sliding_window: int = 0  # KV positions a windowed layer keeps and attends to (0: none)
    sliding_layers: int = 0  # how many of the n_layers are windowed

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        kv_dtype = self.dtype if self.kv_dtype is None else self.kv_dtype
        object.__setattr__(self, "kv_dtype", kv_dtype)
        check_dtype(kv_dtype, "kv_dtype")
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "vocab", "max_context"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if self.n_experts < 0 or self.expert_intermediate < 0:
            raise ValueError("n_experts and expert_intermediate must be >= 0")
        if self.n_experts and not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(f"experts_per_token must be in [1, {self.n_experts}], got {self.experts_per_token}")
        if not self.n_experts and (self.experts_per_token or self.expert_intermediate):
            raise ValueError("experts_per_token and expert_intermediate need n_experts > 0")
        if not 0 <= self.sliding_layers <= self.n_layers or self.sliding_window < 0:
            raise ValueError(f"sliding_layers must be in [0, {self.n_layers}] and sliding_window >= 0")
        if bool(self.sliding_window) != bool(self.sliding_layers):
            raise ValueError("a sliding window needs windowed layers, and windowed layers a window")

    # --- parameter counts -------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        """Weights of the q/k/v/o projections of one layer (no biases)."""
        q_out = self.n_heads * self.head_dim
        kv_out = self.n_kv_heads * self.head_dim
        return self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden

    @property
    def expert_width(self) -> int:
        """The MLP width one token runs through: an expert's, or the dense MLP's."""
        return self.expert_intermediate or self.intermediate

    @property
    def expert_params(self) -> int:
        """Weights of one MLP (one expert of a sparse layer) of one layer, no biases."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.expert_width

    @property
    def router_params(self) -> int:
        """Weights of one layer's router (hidden x n_experts; 0 for a dense model)."""
        return self.hidden * self.n_experts

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of one layer's MLP: the dense MLP, or every expert and the router (no biases)."""
        if self.n_experts:
            return self.n_experts * self.expert_params + self.router_params
        return self.expert_params

    @property
    def active_mlp_params_per_layer(self) -> int:
        """Weights of one layer's MLP that one token multiplies: the dense MLP, or k experts and the router."""
        if self.n_experts:
            return self.experts_per_token * self.expert_params + self.router_params
        return self.expert_params

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: every layer's projections (active experts only) plus the LM head."""
        return (
            self.n_layers * (self.attn_params_per_layer + self.active_mlp_params_per_layer) + self.vocab * self.hidden
        )

    @property
    def params(self) -> int:
        """Exact parameter count: embeddings, LM head, projections (every expert), biases and norms."""
        h, i = self.hidden, self.intermediate
        per_norm = 2 * h if self.norm_bias else h
        per_layer = self.attn_params_per_layer + self.mlp_params_per_layer + self.layer_norms * per_norm
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        if self.qkv_bias:
            per_layer += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        if self.dense_bias:
            per_layer += h + ((2 * i if self.gated_mlp else i) + h)
        embed = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.n_layers * per_layer + embed + self.pos_embeddings * h + per_norm

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all but the experts its router does not pick (all of a dense model)."""
        idle = self.n_experts - self.experts_per_token
        return self.params - self.n_layers * idle * self.expert_params

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts per layer that `tokens` tokens route to, each picking k of E
        uniformly: E * (1 - (1 - k/E)^tokens) (k for one token, nearly E for many; 0 if dense)."""
        if not self.n_experts:
            return 0.0
        return self.n_experts * (1.0 - (1.0 - self.experts_per_token / self.n_experts) ** tokens)

    # --- sizes and costs ----------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def weight_bytes(self) -> int:
        """All parameters, every expert included, at `dtype` (FP8 checkpoints with a bf16 LM head are ignored)."""
        return self.params * self.dtype_bytes

    @property
    def expert_weight_bytes(self) -> int:
        """The experts' share of `weight_bytes`: every expert of every layer (0 for a dense model)."""
        return self.n_layers * self.n_experts * self.expert_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes (windowed layers too:
        a token's KV before its window slides past it)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_dtype_bytes

    def kv_bytes(self, n_tokens: int) -> int:
        """KV of one sequence of `n_tokens` tokens: every global layer holds all of them, a windowed
        layer at most `sliding_window` (also the KV of the last `n_tokens` of a longer sequence)."""
        per_layer = self.kv_bytes_per_token // self.n_layers
        windowed = min(n_tokens, self.sliding_window) if self.sliding_layers else 0
        return per_layer * ((self.n_layers - self.sliding_layers) * n_tokens + self.sliding_layers * windowed)

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token's forward pass (2 per multiplied weight: active experts, no embedding lookup)."""
        return 2 * self.matmul_params

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of QK^T plus PV for one (query, key) pair across all layers and heads."""
        return 4 * self.n_layers * self.n_heads * self.head_dim
