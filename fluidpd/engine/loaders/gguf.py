"""GGUF files (llama.cpp): metadata to ModelConfig, tensors dequantised (or kept as shipped) under HF names."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fluidpd.engine.architectures import ARCHITECTURES
from fluidpd.engine.gguf_file import GGUFFile
from fluidpd.engine.loaders.checkpoint import LOADERS, Checkpoint
from fluidpd.engine.loaders.gguf_gemma import gemma_config, gemma_hf_name, gemma_norm
from fluidpd.engine.loaders.gguf_moe import gguf_moe_fields, gguf_moe_names, is_expert
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.quantized import BLOCK_BYTES, QuantizedTensor

GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
GGUF_ARCHITECTURES = {"qwen3moe": "qwen3_moe"}  # llama.cpp's names that are not a Hugging Face model_type
GGUF_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", "model.layers.{}.self_attn.q_proj.{}"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", "model.layers.{}.self_attn.k_proj.{}"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", "model.layers.{}.self_attn.v_proj.{}"),
    (r"blk\.(\d+)\.attn_qkv\.weight", "model.layers.{}.self_attn.qkv_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", "model.layers.{}.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.attn_q_norm\.weight", "model.layers.{}.self_attn.q_norm.weight"),
    (r"blk\.(\d+)\.attn_k_norm\.weight", "model.layers.{}.self_attn.k_norm.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", "model.layers.{}.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", "model.layers.{}.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", "model.layers.{}.mlp.down_proj.weight"),
]
_GGUF_RE = [(re.compile(p + r"$"), n) for p, n in GGUF_NAMES]


def gguf_to_hf_name(name: str) -> str | None:
    for pat, fmt in _GGUF_RE:
        m = pat.match(name)
        if m:
            return fmt.format(*m.groups())
    return None


def gguf_hf_names(cfg: ModelConfig, name: str) -> list[str] | None:
    """Checkpoint names of GGUF tensor `name` (one per expert for a stacked `*_exps` tensor), or None."""
    moe = gguf_moe_names(cfg, name)
    if moe is not None:
        return moe
    hf = (cfg.gemma and gemma_hf_name(name)) or gguf_to_hf_name(name)  # Gemma's four norms a layer
    if hf is not None and cfg.fused_projections and hf.endswith(".mlp.up_proj.weight"):  # Phi-3's ffn_up: gate|up
        hf = hf.replace(".up_proj.", ".gate_up_proj.")
    return None if hf is None else [hf]


def gguf_field(reader: GGUFFile, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def gguf_model_config(reader: GGUFFile) -> ModelConfig:
    arch = gguf_field(reader, "general.architecture")
    family = GGUF_ARCHITECTURES.get(arch) or ARCHITECTURES.get(arch)
    if family is None:
        raise ValueError(
            f"unknown architecture {arch!r} in GGUF (general.architecture); "
            f"supported: {sorted(ARCHITECTURES | GGUF_ARCHITECTURES)}"
        )
    g = lambda key, default=None: gguf_field(reader, f"{arch}.{key}", default)
    if family == "llama" and g("expert_count"):  # llama.cpp writes Mixtral as llama with experts
        family = "mixtral"
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    kv_heads = g("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ValueError("GGUF with per-layer head_count_kv is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = g("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = next(t for t in reader.tensors if t.name == "token_embd.weight").shape[1]
    scaling = None
    stype = g("rope.scaling.type")
    if stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise ValueError(f"unsupported rope scaling type {stype!r} in GGUF")
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    names = {t.name for t in reader.tensors}
    ff = int(g("feed_forward_length"))
    cfg = ModelConfig(
        architecture=family,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=ff,
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(g("attention.key_length") or g("rope.dimension_count") or hidden // heads),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(g("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        **gguf_moe_fields(family, g, ff),
    )
    return replace(cfg, **gemma_config(cfg, g)) if cfg.gemma else cfg


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's HF->GGUF Q/K row permutation (interleaved -> half-split RoPE)."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(t) -> np.ndarray:
    from gguf.quants import dequantize

    kind = t.tensor_type.name
    if kind not in GGUF_TYPES:
        raise ValueError(f"GGUF tensor {t.name}: type {kind} not supported (supported: {GGUF_TYPES})")
    arr = dequantize(t.data, t.tensor_type)
    return arr.reshape([int(x) for x in reversed(t.shape)])


def shipped_blocks(t, name: str, tied: bool) -> bool:
    """Whether tensor `t` (HF `name`) is a linear weight the `gguf` linear layer reads as shipped."""
    linear = name.endswith("_proj.weight") or is_expert(name) or name == "lm_head.weight"
    return (linear or (tied and name == "model.embed_tokens.weight")) and t.tensor_type.name in BLOCK_BYTES


def torch_weight(arr: np.ndarray, t, name: str, cfg: ModelConfig, permuted: bool, raw: bool, dtype: torch.dtype):
    """One checkpoint tensor from GGUF `t`'s data `arr` (dequantised, or its blocks where `raw`), Q/K unpermuted."""
    arr = gemma_norm(arr, name) if cfg.gemma else arr  # the converter's 1 + w back to w
    if permuted and ".q_proj." in name:
        arr = unpermute_qk(arr, cfg.num_heads)
    elif permuted and ".k_proj." in name:
        arr = unpermute_qk(arr, cfg.num_kv_heads)
    if raw:
        rows = arr.shape[0]
        data = torch.from_numpy(np.array(arr, dtype=np.uint8).reshape(rows, -1))  # a copy: not the mmap
        return QuantizedTensor(t.tensor_type.name, (rows, int(t.shape[0])), data)
    if not arr.flags.writeable or arr.dtype != np.float32:  # F32 tensors are views of the mmap
        arr = np.array(arr, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)


@LOADERS.register("gguf")
def load_gguf(
    path: str,
    dtype: torch.dtype = torch.float32,
    *,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    keep_quantized: bool = False,
) -> Checkpoint:
    """Dequantised tensors under HF names, Q/K rows unpermuted; the tokenizer from the same reader.

    `keep_quantized`: Q4_1 / Q8_0 linear weights, experts' included (and a tied embedding), stay as
    shipped, as `QuantizedTensor`s (their blocks, rows unpermuted alike), for `--quantization gguf`.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path!r}")
    reader = GGUFFile(path)
    cfg = gguf_model_config(reader)
    permuted = gguf_field(reader, "general.architecture") in ("llama", "mistral")
    tensors: dict[str, torch.Tensor | QuantizedTensor] = {}
    rope_freqs = None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            rope_freqs = torch.from_numpy(dequantize_tensor(t).astype(np.float32).copy())
            continue
        names = gguf_hf_names(cfg, t.name)
        if names is None:
            continue
        raw = keep_quantized and shipped_blocks(t, names[0], cfg.tie_word_embeddings)
        arr = np.asarray(t.data) if raw else dequantize_tensor(t)
        parts = list(arr) if arr.ndim == 3 else [arr]  # a stacked *_exps tensor: one part per expert
        if len(parts) != len(names):
            raise ValueError(f"GGUF tensor {t.name} holds {len(parts)} experts, the metadata says {len(names)}")
        for name, part in zip(names, parts, strict=True):
            tensors[name] = torch_weight(part, t, name, cfg, permuted, raw, dtype)
    if rope_freqs is not None and cfg.rope_scaling is None:  # llama3 scaling baked into a tensor: mark the config
        cfg = replace(cfg, rope_scaling={"rope_type": "llama3", "from_gguf": True})
    from fluidpd.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(path, reader=reader) if "tokenizer.ggml.tokens" in reader.fields else None
    return Checkpoint(
        cfg,
        tensors,
        tokenizer_source=path if tokenizer else None,
        rope_freqs=rope_freqs,
        tokenizer=tokenizer,
        meta={"format": "gguf", "path": path, "file_type": gguf_field(reader, "general.file_type")},
    )
