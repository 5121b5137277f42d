"""Gemma 2 and Gemma 3 GGUFs as llama.cpp writes and reads them: their norm names, norm weights and
the attention metadata, as ModelConfig fields.

convert_hf_to_gguf.py names Gemma's four norms of a layer `blk.N.attn_norm` (input_layernorm),
`blk.N.post_attention_norm`, `blk.N.ffn_norm` (pre_feedforward_layernorm) and `blk.N.post_ffw_norm`,
and adds 1 to every `*norm.weight` (Gemma2Model / Gemma3Model.modify_tensors: llama.cpp's RMSNorm
scales by the weight, Gemma's by 1 + w), q/k norms included; the loader subtracts it again, so the
checkpoint holds the Hugging Face w (the model adds the 1 back). Q/K rows are not permuted.

What llama.cpp's llama-model.cpp takes from the metadata, and what it fixes:
- gemma2: `attention.sliding_window` (default 4096), `attn_logit_softcapping` (default 50),
  `final_logit_softcapping` (default 30); layers alternate sliding / global, 0 sliding
  (`set_swa_pattern(2)`).
- gemma3: sliding windows only where `attention.sliding_window` is present and > 0, then every 6th
  layer global (`set_swa_pattern(6)`: layer i slides iff (i + 1) % 6 != 0) with RoPE base 10000,
  unscaled (`rope_freq_base_train_swa = 10000`); `rope.freq_base` and the linear `rope.scaling.*`
  are the global layers'; `final_logit_softcapping` if present (default none); no attention cap.
- both: where a file has `attention.sliding_window_pattern` (gguf-py's key: a period n as above, or
  one bool per layer, true = sliding) it is honoured here; llama.cpp's gemma2/gemma3 fix the period.
- the score scale is not in the file: see `gemma_query_pre_attn_scalar`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from fluidpd.engine.architectures import FULL, SLIDING
from fluidpd.engine.model_config import ModelConfig

GEMMA_NORMS = {  # llama.cpp's name of a Gemma layer norm -> the checkpoint's (where not GGUF_NAMES')
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_NORM = re.compile(r"blk\.(\d+)\.(post_attention_norm|ffn_norm|post_ffw_norm)\.weight$")
SWA_PERIOD = {"gemma2": 2, "gemma3": 6}  # llama.cpp's set_swa_pattern: every n-th layer global
BIG_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp's LLM_TYPE_27B of each, by n_layer


def gemma_hf_name(name: str) -> str | None:
    """The checkpoint name of a Gemma layer norm llama.cpp names otherwise than Llama's, or None."""
    m = _NORM.match(name)
    return f"model.layers.{m[1]}.{GEMMA_NORMS[m[2]]}.weight" if m else None


def gemma_norm(arr: np.ndarray, name: str) -> np.ndarray:
    """The Hugging Face weight w of a norm the converter stored as 1 + w (other tensors as they are)."""
    return np.asarray(arr, dtype=np.float32) - 1.0 if name.endswith("norm.weight") else arr


def gemma_query_pre_attn_scalar(arch: str, num_layers: int, hidden: int, heads: int, head_dim: int) -> int:
    """The d of the scores' 1 / sqrt(d) scale, as llama.cpp fixes it (the GGUF does not carry it): hidden /
    heads for the 27B models (gemma2 with 46 layers, gemma3 with 62; their query_pre_attn_scalar, 144 and 168),
    head_dim otherwise (every other released Gemma 2 / 3: query_pre_attn_scalar = head_dim = 256)."""
    return hidden // heads if BIG_27B_LAYERS.get(arch) == num_layers else head_dim


def _layer_types(arch: str, n: int, pattern: Any) -> tuple[str, ...]:
    if isinstance(pattern, list):
        if len(pattern) != n:
            raise ValueError(f"GGUF sliding_window_pattern names {len(pattern)} layers, the model has {n}")
        return tuple(SLIDING if p else FULL for p in pattern)
    period = SWA_PERIOD[arch] if pattern is None else int(pattern)
    return tuple(SLIDING if period == 0 or (i + 1) % period else FULL for i in range(n))


def gemma_config(cfg: ModelConfig, g: Callable[..., Any]) -> dict[str, Any]:
    """The ModelConfig fields of Gemma 2/3 (`cfg.architecture`) from `{arch}.*` metadata (`g(key, default)`)."""
    arch, n = cfg.architecture, cfg.num_layers
    window = int(g("attention.sliding_window", 4096 if arch == "gemma2" else 0) or 0)
    types = _layer_types(arch, n, g("attention.sliding_window_pattern")) if window else (FULL,) * n
    scalar = gemma_query_pre_attn_scalar(arch, n, cfg.hidden_size, cfg.num_heads, cfg.head_dim)
    return {
        "sliding_window": window,
        "layer_types": types,
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": float(g("attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0,
        "final_logit_softcapping": float(g("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0)),
        "rope_local_theta": 10000.0 if arch == "gemma3" else 0.0,
    }
