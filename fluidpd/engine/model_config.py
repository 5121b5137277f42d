"""ModelConfig: the shape of a Llama-family decoder, and its Hugging Face config.json spelling."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from fluidpd.engine.architectures import (
    ARCHITECTURES,
    FULL,
    FUSED_PROJECTIONS,
    GEMMA,
    HF_ARCHITECTURES,
    HF_MODEL_TYPES,
    HF_NAMES,
    MOE,
    QK_NORM,
    ROPE_TYPES,
    SLIDING,
)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    num_experts: int = 0  # a sparse MoE MLP in every layer (0: dense)
    num_experts_per_tok: int = 0  # k of the router's top k
    moe_intermediate_size: int = 0  # one expert's (0: intermediate_size, as Mixtral's)
    norm_topk_prob: bool = True  # the top k router weights renormalised to sum to 1 (Mixtral; Qwen3-MoE's flag)
    sliding_window: int = 0  # tokens a sliding layer attends to, its own included (0: none)
    layer_types: tuple[str, ...] = ()  # SLIDING or FULL per layer (empty: every layer SLIDING if a window is set)
    query_pre_attn_scalar: int = 0  # attention scores scaled by its -1/2 power (0: head_dim's)
    attn_logit_softcapping: float = 0.0  # scores -> cap * tanh(scores / cap) before the softmax (0: none)
    final_logit_softcapping: float = 0.0  # the same on the logits
    rope_local_theta: float = 0.0  # RoPE base of the sliding layers, unscaled (Gemma 3; 0: as the full layers)

    @property
    def qk_norm(self) -> bool:
        """Each query and key head is RMS-normalised (its own weight over head_dim) before RoPE."""
        return self.architecture in QK_NORM

    @property
    def fused_projections(self) -> bool:
        """The checkpoint holds q|k|v as one `qkv_proj` and gate|up as one `gate_up_proj` (Phi-3)."""
        return self.architecture in FUSED_PROJECTIONS

    @property
    def gemma(self) -> bool:
        return self.architecture in GEMMA

    def window(self, layer: int) -> int:
        """Tokens layer `layer` attends to, its own included (0: every earlier token)."""
        if not self.sliding_window:
            return 0
        return self.sliding_window if not self.layer_types or self.layer_types[layer] == SLIDING else 0

    @property
    def kv_window(self) -> int:
        """The window of every layer where every layer has one (KV older than it is never read again), else 0."""
        return min(self.window(i) for i in range(self.num_layers))

    @property
    def plain_attention(self) -> bool:
        """softmax(q k / sqrt(head_dim)) over every earlier token in every layer: what the paged kernel computes."""
        scale = self.query_pre_attn_scalar in (0, self.head_dim)
        return scale and not self.sliding_window and not self.attn_logit_softcapping

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def __post_init__(self) -> None:
        if self.architecture not in set(ARCHITECTURES.values()):
            raise ValueError(f"unknown architecture {self.architecture!r}: supported {sorted(ARCHITECTURES)}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if (self.architecture in MOE) != (self.num_experts > 0):
            raise ValueError(f"{self.architecture}: num_experts must be > 0 exactly for a mixture of experts")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.num_experts_per_tok}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_types and (len(self.layer_types) != self.num_layers or set(self.layer_types) - {SLIDING, FULL}):
            raise ValueError(f"layer_types must name {SLIDING!r} or {FULL!r} for each of the {self.num_layers} layers")
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {rope_type!r}: supported {ROPE_TYPES}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face config.json dict (transformers 4.x or 5.x spelling)."""
        arch = _hf_architecture(cfg)
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        local = rope.pop(SLIDING, None)  # Gemma 3 in transformers 5: RoPE per layer type
        rope = dict(rope.pop(FULL, None) or rope)
        theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type != "default":
            scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            **_moe_from_hf(arch, cfg),
            **_attention_from_hf(arch, cfg, local),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers reads back as the same model."""
        d: dict[str, Any] = {
            "architectures": [HF_NAMES[self.architecture]],
            "model_type": HF_MODEL_TYPES.get(self.architecture, self.architecture),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if self.eos_token_ids else None,
        }
        if self.architecture != "qwen2":  # Qwen2's q/k/v biases are implied
            d["attention_bias"] = self.attention_bias
        if self.architecture == "phi3":
            d["pad_token_id"] = None  # Phi3Config's default (32000) names a token of the real vocabulary
        d |= self._moe_to_hf()
        if self.sliding_window and self.architecture == "llama":
            d |= {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
        if self.sliding_window:
            d |= {"sliding_window": self.sliding_window}
        if self.layer_types:
            d["layer_types"] = list(self.layer_types)
        if self.gemma:
            self._gemma_to_hf(d)
        return d

    def _moe_to_hf(self) -> dict[str, Any]:
        """The MoE fields of `to_hf` (none for a dense model)."""
        if self.architecture == "mixtral":
            return {"num_local_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok}
        if self.architecture != "qwen3_moe":
            return {}
        return {
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.expert_intermediate_size,
            "norm_topk_prob": self.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }

    def _gemma_to_hf(self, d: dict[str, Any]) -> None:
        """`to_hf`'s `d` in Gemma's spelling: its activation, score scale and soft-capping; Gemma 3's RoPE per
        layer type."""
        d |= {
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": int(self.query_pre_attn_scalar or self.head_dim),
            "attn_logit_softcapping": self.attn_logit_softcapping or None,
            "final_logit_softcapping": self.final_logit_softcapping or None,
        }
        del d["hidden_act"]
        if self.architecture == "gemma3":
            full = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
            local = {"rope_type": "default", "rope_theta": self.rope_local_theta or self.rope_theta}
            d |= {"rope_parameters": {FULL: full, SLIDING: local}}
            del d["rope_theta"], d["rope_scaling"]

    def num_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        qkv = h * d * (self.num_heads + 2 * self.num_kv_heads)
        bias = d * (self.num_heads + 2 * self.num_kv_heads) if self.attention_bias else 0
        norms = (4 if self.gemma else 2) * h + (2 * d if self.qk_norm else 0)
        mlp = 3 * h * self.intermediate_size
        if self.num_experts:  # every expert, and the router
            mlp = self.num_experts * (3 * h * self.expert_intermediate_size + h)
        layer = qkv + bias + self.num_heads * d * h + mlp + norms
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h


def _moe_from_hf(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The MoE fields of a config.json (none for a dense model)."""
    if arch == "mixtral":
        return {"num_experts": int(cfg["num_local_experts"]), "num_experts_per_tok": int(cfg["num_experts_per_tok"])}
    if arch != "qwen3_moe":
        return {}
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise ValueError("Qwen3-MoE with dense layers (mlp_only_layers, decoder_sparse_step > 1) is not supported")
    return {
        "num_experts": int(cfg["num_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
    }


def _attention_from_hf(arch: str, cfg: dict[str, Any], local_rope: dict | None) -> dict[str, Any]:
    """Sliding windows, score scale and soft-capping of a config.json (Gemma 2/3, Mistral's window)."""
    n = int(cfg["num_hidden_layers"])
    if arch in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
        raise ValueError(f"{arch} with use_sliding_window is not supported")
    windowed = arch in GEMMA or arch in ("phi3", "mixtral") or (arch == "llama" and _is_mistral(cfg))
    window = int(cfg.get("sliding_window") or 0) if windowed else 0  # (transformers' Llama ignores the key)
    types = tuple(cfg.get("layer_types") or ())
    if arch in GEMMA and not types:  # config.json written before transformers stored layer_types
        every = 2 if arch == "gemma2" else int(cfg.get("sliding_window_pattern", 6))
        types = tuple(SLIDING if (i + 1) % every else FULL for i in range(n))
    if arch not in GEMMA:
        return {"sliding_window": window, "layer_types": types if window else ()}
    local = (local_rope or {}).get("rope_theta", cfg.get("rope_local_base_freq"))
    return {
        "sliding_window": window,
        "layer_types": types,
        "query_pre_attn_scalar": int(cfg.get("query_pre_attn_scalar") or cfg["head_dim"]),
        "attn_logit_softcapping": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_logit_softcapping": float(cfg.get("final_logit_softcapping") or 0.0),
        "rope_local_theta": float(local or (10000.0 if arch == "gemma3" else 0.0)),
    }


def _is_mistral(cfg: dict[str, Any]) -> bool:
    return "MistralForCausalLM" in (cfg.get("architectures") or []) or cfg.get("model_type") == "mistral"


def _hf_architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in HF_ARCHITECTURES:
            return HF_ARCHITECTURES[a]
    mt = cfg.get("model_type")
    if not archs and mt in ARCHITECTURES:
        return ARCHITECTURES[mt]
    raise ValueError(f"unknown architecture {archs or mt!r} in config.json; supported: {sorted(HF_ARCHITECTURES)}")


def read_hf_config(path: str) -> dict[str, Any]:
    file = path if path.endswith(".json") else os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"config.json not found: {file!r}")
    with open(file) as f:
        return json.load(f)
