"""Mixture-of-experts GGUFs as llama.cpp writes them: the expert metadata and the router / expert tensors
under the checkpoint names `fluidpd.engine.moe` reads.

convert_hf_to_gguf.py writes Mixtral as architecture "llama" with `llama.expert_count` and Qwen3-MoE as
"qwen3moe" (plus `qwen3moe.expert_feed_forward_length`); the router as `blk.N.ffn_gate_inp` and each
projection of every expert stacked into one [n_expert, rows, cols] tensor, `blk.N.ffn_{gate,up,down}_exps`
(expert e at index e). GGUFs converted before llama.cpp stacked them name each expert's projection
`blk.N.ffn_{gate,up,down}.E`. llama.cpp renormalises the top-k router weights for both architectures
(`build_moe_ffn(..., norm_w=true)`, whatever Qwen3-MoE's `norm_topk_prob`), so a file without
`{arch}.expert_weights_norm` gets `norm_topk_prob=True`; a file that has the key gets what it says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.moe import MOE_NAMES

_ROUTER = re.compile(r"blk\.(\d+)\.ffn_gate_inp\.weight$")
_STACKED = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_PER_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")
SOFTMAX_GATING = 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def gguf_moe_fields(family: str, g: Callable[..., Any], ff: int) -> dict[str, Any]:
    """ModelConfig's MoE fields from `{arch}.expert_*` metadata (`g(key, default)`); none for a dense model."""
    experts = int(g("expert_count", 0) or 0)
    if not experts:
        return {}
    if int(g("expert_shared_count", 0) or 0):
        raise ValueError("GGUF with shared experts is not supported")
    if int(g("expert_gating_func", SOFTMAX_GATING)) != SOFTMAX_GATING:
        raise ValueError("GGUF expert gating other than softmax is not supported")
    used = int(g("expert_used_count", 0) or 0)
    if not used:
        raise ValueError("GGUF has expert_count but no expert_used_count")
    norm = g("expert_weights_norm")
    out: dict[str, Any] = {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "norm_topk_prob": True if norm is None else bool(norm),
    }
    if family == "qwen3_moe":  # llama.cpp's fallback when the key is missing: n_ff / n_expert_used
        out["moe_intermediate_size"] = int(g("expert_feed_forward_length") or ff // used)
    return out


def gguf_moe_names(cfg: ModelConfig, name: str) -> list[str] | None:
    """Checkpoint names of a GGUF MoE tensor: the router's, one expert's projection, or, for a stacked
    `*_exps` tensor, every expert's in expert order. None for any other tensor."""
    if not cfg.num_experts:
        return None
    router, expert, projections = MOE_NAMES[cfg.architecture]
    proj = dict(zip(("gate", "up", "down"), projections, strict=True))
    if m := _ROUTER.match(name):
        return [f"model.layers.{m[1]}.{router}"]
    if m := _STACKED.match(name):
        return [f"model.layers.{m[1]}.{expert.format(e)}{proj[m[2]]}.weight" for e in range(cfg.num_experts)]
    if m := _PER_EXPERT.match(name):
        return [f"model.layers.{m[1]}.{expert.format(int(m[3]))}{proj[m[2]]}.weight"]
    return None


def is_expert(name: str) -> bool:
    """Whether checkpoint tensor `name` is an expert's projection (a linear weight; the router is not)."""
    return ".experts." in name
