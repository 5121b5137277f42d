"""Llama-family decoder (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3, Mixtral, Qwen3-MoE) over a paged KV arena.

One forward runs a flattened mixed batch: every token of every prefill chunk and every decode
token goes through the dense layers together ([num_tokens, hidden]); attention splits the rows
into prefill segments (one SDPA each, causal over earlier context read from the block table)
and decodes: on the CPU in float32 one C kernel call per layer reads every decode row's K/V pages
(float32 or float16) in place (fluidpd.engine.paged_attention); elsewhere, or with `attention="gather"`, decode groups
(pages of similar-length contexts gathered into scratch, one padded SDPA per group).
Weights are fused at load (q|k|v and gate|up) to keep the per-layer op count small; each
linear layer is built by the weight format `quantization` names (fluidpd.engine.linear).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch
import torch.nn.functional as F

from fluidpd.engine import gguf_linear  # noqa: F401  (registers the gguf weight format in LINEARS)
from fluidpd.engine.arena import KVArena
from fluidpd.engine.attention_meta import AttentionMetadata
from fluidpd.engine.config import ATTENTIONS, LAYER_OPS
from fluidpd.engine.decode_program import DecodeProgram
from fluidpd.engine.decoder_layer import DecoderLayer
from fluidpd.engine.kernels import KernelUnavailable
from fluidpd.engine.layer_ops import FusedLayerOps, LayerOps, TorchLayerOps
from fluidpd.engine.linear import LINEARS, tensor_bytes
from fluidpd.engine.loaders.checkpoint import Checkpoint
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.moe import moe_tensor_names
from fluidpd.engine.paged_attention import PagedDecodeAttention
from fluidpd.engine.rope import rope_inv_freq


class LlamaModel:
    """Weights + forward. Shared read-only by any number of engines in one process."""

    def __init__(
        self,
        ckpt: Checkpoint,
        dtype: torch.dtype,
        device: torch.device | str,
        max_positions: int,
        quantization: str = "none",
        attention: str = "auto",
        layer_ops: str = "auto",
    ) -> None:
        cfg = self.config = ckpt.config
        self.dtype, self.device, self.quantization = dtype, torch.device(device), quantization
        self.paged = _paged_kernel(cfg, dtype, self.device, attention)
        self.attention = "gather" if self.paged is None else "paged"
        self.ops = _layer_ops(cfg, dtype, self.device, layer_ops)
        self.layer_ops = "torch" if isinstance(self.ops, TorchLayerOps) else "fused"
        linear = LINEARS.get(quantization)
        w = dict(ckpt.tensors)  # popped as packed; the checkpoint itself stays intact for its owner
        _check_names(cfg, w)
        for k in w:
            w[k] = w[k].to(dtype)
        embed = w.pop("model.embed_tokens.weight")
        self.norm = w.pop("model.norm.weight") + (1.0 if cfg.gemma else 0.0)  # Gemma's (1 + w)
        lm_head = w.pop("lm_head.weight", None)
        tied = cfg.tie_word_embeddings or lm_head is None
        self.lm_head = linear(embed if tied else lm_head, lookups=tied)
        self.embed = None if tied else embed  # tied: rows are read from lm_head
        self.layers = [DecoderLayer(cfg, w, i, linear, self.paged, self.ops) for i in range(cfg.num_layers)]
        w.clear()
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=dtype) if cfg.gemma else None
        self.cos, self.sin = _rope_table(rope_inv_freq(cfg, ckpt.rope_freqs), max_positions, dtype)
        self.local_rope = None  # Gemma 3's sliding layers: their own base, unscaled
        if cfg.rope_local_theta:
            local = replace(cfg, rope_theta=cfg.rope_local_theta, rope_scaling=None)
            self.local_rope = _rope_table(rope_inv_freq(local), max_positions, dtype)
        self.to(self.device)
        self.program = DecodeProgram.for_model(self)  # decode-only steps in one C call, where it applies

    def to(self, device: torch.device) -> None:
        self.embed = None if self.embed is None else self.embed.to(device)
        self.norm = self.norm.to(device)
        self.lm_head.to(device)
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        if self.local_rope is not None:
            self.local_rope = (self.local_rope[0].to(device), self.local_rope[1].to(device))
        for layer in self.layers:
            layer.to(device)

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    def weight_bytes(self) -> int:
        """Bytes of weights a decode step streams (tied embedding counted once)."""
        own = tensor_bytes(self.norm, self.embed) + self.lm_head.nbytes
        return own + sum(layer.nbytes() for layer in self.layers)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        arena: KVArena,
        logits_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32) [len(logits_rows), vocab] for the chosen rows of the flat batch."""
        x = self.embed_tokens(input_ids)
        st = self.ops.begin(positions, meta.slot_blocks, meta.slot_offsets, self.cos, self.sin, arena)
        if self.program is not None and self.program.runs(x.shape[0], meta):
            self.program(x, st, meta, arena)
        else:
            local = st
            if self.local_rope is not None:
                local = self.ops.begin(positions, meta.slot_blocks, meta.slot_offsets, *self.local_rope, arena)
            res = None
            for i, layer in enumerate(self.layers):
                res = layer.forward(x, res, local if layer.window else st, meta, i)
            if res is not None:
                x.add_(res)
        x = self.ops.add_rms_norm(x[logits_rows], None, self.norm, self.config.rms_norm_eps, st)
        logits = self.lm_head(x).float()
        if cap := self.config.final_logit_softcapping:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = (
            F.embedding(input_ids, self.embed)
            if self.embed is not None
            else self.lm_head.rows(input_ids).to(self.dtype)
        )
        return x if self.embed_scale is None else x * self.embed_scale


def _paged_kernel(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, attention: str
) -> PagedDecodeAttention | None:
    """The paged decode kernel for `attention` ('paged': required; 'auto': where it builds; 'gather': none)."""
    if attention != "auto" and attention not in ATTENTIONS:
        raise ValueError(f"attention must be 'auto' or one of {ATTENTIONS}, got {attention!r}")
    if attention == "gather" or (attention == "auto" and not cfg.plain_attention):
        return None
    if not cfg.plain_attention:
        raise ValueError("paged attention computes plain softmax attention: no sliding window, soft-cap or scale")
    if device.type != "cpu" or dtype != torch.float32:
        if attention == "paged":
            raise ValueError(f"paged attention runs on the CPU in float32, not {dtype} on {device}")
        return None
    try:
        return PagedDecodeAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    except KernelUnavailable as exc:
        if attention == "paged":
            raise ValueError(f"paged attention unavailable: {exc}") from None
        warnings.warn(f"decode attention falls back to page gathers: {exc}", RuntimeWarning, stacklevel=3)
        return None


def _layer_ops(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, layer_ops: str) -> LayerOps:
    """The layer's small ops for `layer_ops` ('fused': the C kernels, required; 'auto': where they build)."""
    if layer_ops != "auto" and layer_ops not in LAYER_OPS:
        raise ValueError(f"layer_ops must be 'auto' or one of {LAYER_OPS}, got {layer_ops!r}")
    shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    if layer_ops == "torch":
        return TorchLayerOps(*shape)
    if device.type != "cpu" or dtype != torch.float32:
        if layer_ops == "fused":
            raise ValueError(f"fused layer ops run on the CPU in float32, not {dtype} on {device}")
        return TorchLayerOps(*shape)
    try:
        return FusedLayerOps(*shape, cfg.hidden_size, cfg.intermediate_size)
    except KernelUnavailable as exc:
        if layer_ops == "fused":
            raise ValueError(f"fused layer ops unavailable: {exc}") from None
        warnings.warn(f"layer ops fall back to torch: {exc}", RuntimeWarning, stacklevel=3)
        return TorchLayerOps(*shape)


def _check_names(cfg: ModelConfig, w: dict[str, torch.Tensor]) -> None:
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn = (
            ("self_attn.qkv_proj.weight",)
            if cfg.fused_projections
            else tuple(f"self_attn.{x}_proj.weight" for x in "qkv")
        )
        mlp = ("mlp.gate_up_proj.weight",) if cfg.fused_projections else ("mlp.gate_proj.weight", "mlp.up_proj.weight")
        norms = ("input_layernorm.weight", "post_attention_layernorm.weight")
        if cfg.gemma:
            norms += ("pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")
        need += [p + s for s in (*norms, "self_attn.o_proj.weight", *attn)]
        need += moe_tensor_names(cfg, p) if cfg.num_experts else [p + s for s in (*mlp, "mlp.down_proj.weight")]
        if cfg.qk_norm:
            need += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    if not cfg.tie_word_embeddings:
        need.append("lm_head.weight")
    missing = [n for n in need if n not in w]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    bad = [
        n
        for n in need
        if n.endswith("q_proj.weight") and tuple(w[n].shape) != (cfg.num_heads * cfg.head_dim, cfg.hidden_size)
    ]
    if bad:
        raise ValueError(
            f"{bad[0]} has shape {tuple(w[bad[0]].shape)}, config says "
            f"{(cfg.num_heads * cfg.head_dim, cfg.hidden_size)}"
        )


def _rope_table(inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_positions, head_dim / 2] of every position's angles."""
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)
