"""GGUF files written as llama.cpp's convert_hf_to_gguf.py writes them, from a checkpoint's tensors (HF names)."""

from __future__ import annotations

import re
from collections.abc import Callable

import gguf
import numpy as np
import torch

from fluidpd.engine.model_config import ModelConfig

Q = gguf.GGMLQuantizationType
GGUF_ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe"}  # llama.cpp's architecture, where not the HF name
HF_TO_GGUF = {
    "embed_tokens": "token_embd",
    "norm": "output_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GEMMA_TO_GGUF = {  # Gemma's four norms a layer: llama.cpp's ffn_norm is the one before the MLP
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
EXPERT_PROJ = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
_ROUTER = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate\.weight$")
_EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation (what the loader must undo)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str, gemma: bool = False) -> str:
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[1] == "layers":
        rest = ".".join(parts[3:-1])
        return f"blk.{parts[2]}.{(gemma and GEMMA_TO_GGUF.get(rest)) or HF_TO_GGUF[rest]}.{parts[-1]}"
    return f"{HF_TO_GGUF[parts[1]]}.{parts[-1]}"


def gguf_tensors(
    tensors: dict[str, torch.Tensor], cfg: ModelConfig, permuted: bool, stacked: bool = True
) -> dict[str, np.ndarray]:
    """The tensors under llama.cpp's names: Q/K rows permuted where `permuted`, the router as ffn_gate_inp and
    each projection of every expert stacked into one [n_expert, rows, cols] ffn_*_exps (expert e at index e),
    or, without `stacked`, as the older per-expert ffn_*.E."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, t in tensors.items():
        a = t.float().numpy()
        if cfg.gemma and name.endswith("norm.weight"):  # Gemma2Model / Gemma3Model.modify_tensors: 1 + w
            a = a + 1
        if permuted and name.endswith("q_proj.weight"):
            a = permute(a, cfg.num_heads)
        elif permuted and name.endswith("k_proj.weight"):
            a = permute(a, cfg.num_kv_heads)
        if m := _ROUTER.match(name):
            out[f"blk.{m[1]}.ffn_gate_inp.weight"] = a
        elif m := _EXPERT.match(name):
            layer, e, proj = m[1], int(m[2]), EXPERT_PROJ[m[3]]
            if stacked:
                experts.setdefault(f"blk.{layer}.ffn_{proj}_exps.weight", {})[e] = a
            else:
                out[f"blk.{layer}.ffn_{proj}.{e}.weight"] = a
        else:
            out[gguf_name(name, cfg.gemma)] = a
    for name, by_expert in experts.items():
        out[name] = np.stack([by_expert[e] for e in range(len(by_expert))])
    return out


def write_gguf(
    path,
    tensors: dict[str, torch.Tensor],
    qtype=Q.F32,
    *,
    cfg: ModelConfig,
    arch: str | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
    **kw,
) -> None:
    """`tensors` (of a `cfg` model) as llama.cpp's GGUF of `arch` (default: cfg's) with linear weights in `qtype`;
    norms and the router stay F32 (as the converter and llama-quantize keep them). `extra` adds metadata;
    `kw`: `gguf_tensors`'."""
    arch = arch or GGUF_ARCH.get(cfg.architecture, cfg.architecture)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.architecture != "gemma2":  # Gemma2Model.set_gguf_parameters writes no RoPE base (llama.cpp: 10000)
        w.add_rope_freq_base(cfg.rope_theta)
    w.add_vocab_size(cfg.vocab_size)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if cfg.num_experts:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if cfg.architecture == "qwen3_moe":
            w.add_expert_feed_forward_length(cfg.expert_intermediate_size)
    if cfg.gemma:
        gemma_metadata(w, cfg)
    if extra is not None:
        extra(w)
    permuted = arch in ("llama", "mistral")  # convert_hf_to_gguf.py permutes Q/K rows for these only
    for name, a in gguf_tensors(tensors, cfg, permuted, **kw).items():
        if a.ndim == 1 or qtype == Q.F32 or name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma_metadata(w: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """What Gemma2Model / Gemma3Model.set_gguf_parameters add: the window, gemma2's caps, gemma3's linear RoPE
    scaling; and where `cfg`'s layer types are not llama.cpp's fixed period (2, 6), gguf-py's per-layer
    sliding_window_pattern (true = sliding), which the converter does not write."""
    w.add_sliding_window(cfg.sliding_window)
    if cfg.architecture == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_scaling["factor"])
    period = 2 if cfg.architecture == "gemma2" else 6
    fixed = tuple("sliding_attention" if (i + 1) % period else "full_attention" for i in range(cfg.num_layers))
    if cfg.layer_types != fixed:
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
