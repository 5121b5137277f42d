"""ModelConfig: the shape of a Llama-family decoder, and its Hugging Face config.json spelling."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

ARCHITECTURES = {  # GGUF general.architecture / HF model_type -> our family member
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe",
}
HF_NAMES = {  # our family member -> the HF `architectures` name config.json is written with
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
HF_ARCHITECTURES = {name: arch for arch, name in HF_NAMES.items()} | {"MistralForCausalLM": "llama"}
QK_NORM = frozenset({"qwen3", "qwen3_moe"})  # RMSNorm of each query and key head before RoPE
MOE = frozenset({"mixtral", "qwen3_moe"})  # a sparse mixture-of-experts MLP (fluidpd.engine.moe)
FUSED_PROJECTIONS = frozenset({"phi3"})  # checkpoints hold self_attn.qkv_proj and mlp.gate_up_proj
ROPE_TYPES = ("default", "linear", "llama3")


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

    @property
    def qk_norm(self) -> bool:
        """Each query and key head is RMS-normalised (its own weight over head_dim) before RoPE."""
        return self.architecture in QK_NORM

    @property
    def fused_projections(self) -> bool:
        """The checkpoint holds q|k|v as one `qkv_proj` and gate|up as one `gate_up_proj` (Phi-3)."""
        return self.architecture in FUSED_PROJECTIONS

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
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {rope_type!r}: supported {ROPE_TYPES}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face config.json dict (transformers 4.x or 5.x spelling)."""
        arch = _hf_architecture(cfg)
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
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
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers reads back as the same model."""
        d: dict[str, Any] = {
            "architectures": [HF_NAMES[self.architecture]],
            "model_type": self.architecture,
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
        if self.architecture == "mixtral":
            d |= {"num_local_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok}
        elif self.architecture == "qwen3_moe":
            d |= {
                "num_experts": self.num_experts,
                "num_experts_per_tok": self.num_experts_per_tok,
                "moe_intermediate_size": self.expert_intermediate_size,
                "norm_topk_prob": self.norm_topk_prob,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            }
        return d

    def num_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        qkv = h * d * (self.num_heads + 2 * self.num_kv_heads)
        bias = d * (self.num_heads + 2 * self.num_kv_heads) if self.attention_bias else 0
        norms = 2 * h + (2 * d if self.qk_norm else 0)
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
