"""Llama-family decoder (Llama 2/3, SmolLM2, Qwen2, Mistral) in plain PyTorch, over a paged KV arena.

One forward runs a flattened mixed batch: every token of every prefill chunk and every decode
token goes through the dense layers together ([num_tokens, hidden]); attention splits the rows
into prefill segments (one SDPA each, causal over earlier context read from the block table)
and decodes: on the CPU in float32 one C kernel call per layer reads every decode row's K/V pages
in place (fluidpd.engine.paged_attention); elsewhere, or with `attention="gather"`, decode groups
(pages of similar-length contexts gathered into scratch, one padded SDPA per group).
Weights are fused at load (q|k|v and gate|up) to keep the per-layer op count small; each
linear layer is built by the weight format `quantization` names (fluidpd.engine.linear).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fluidpd.engine import gguf_linear  # noqa: F401  (registers the gguf weight format in LINEARS)
from fluidpd.engine.arena import KVArena
from fluidpd.engine.config import ATTENTIONS, LAYER_OPS
from fluidpd.engine.kernels import KernelUnavailable
from fluidpd.engine.layer_ops import FusedLayerOps, LayerOps, OpsStep, TorchLayerOps
from fluidpd.engine.linear import LINEARS, Linear, tensor_bytes
from fluidpd.engine.loaders.checkpoint import Checkpoint
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.paged_attention import PagedDecodeAttention, PagedDecodes
from fluidpd.engine.rope import rope_inv_freq


@dataclass
class PrefillSegment:
    """Rows [start, end) of the batch: one sequence's chunk at positions ctx_start.. ."""

    start: int
    end: int
    ctx_start: int
    block_ids: torch.Tensor | None = None  # blocks covering ctx_start + chunk (None: no earlier ctx)
    mask: torch.Tensor | None = None  # [chunk, T] additive mask (None: plain causal)


@dataclass
class DecodeGroup:
    """Rows [start, end): one token per sequence, padded to the group's longest context."""

    start: int
    end: int
    block_ids: torch.Tensor  # [B * nb] flattened, padded block tables
    mask: torch.Tensor | None  # [B, 1, 1, nb * block_size] additive (None: one sequence)
    ctx_len: int = 0  # one sequence: its context length
    buffers: tuple | None = None  # gather destinations + SDPA views, made at the first layer


@dataclass
class AttentionMetadata:
    slot_blocks: torch.Tensor  # [N] block id where each new token's K/V goes
    slot_offsets: torch.Tensor  # [N] offset inside that block
    prefills: list[PrefillSegment] = field(default_factory=list)
    decodes: list[DecodeGroup] = field(default_factory=list)
    paged: PagedDecodes | None = None  # every decode row, when the model has the paged kernel


class DecoderLayer:
    """RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU -> residual."""

    def __init__(
        self,
        cfg: ModelConfig,
        w: dict[str, torch.Tensor],
        prefix: str,
        linear: Callable[..., Linear],
        paged: PagedDecodeAttention | None = None,
        ops: LayerOps | None = None,
    ) -> None:
        g = lambda name: w.pop(prefix + name)
        self.input_norm = g("input_layernorm.weight")
        self.post_norm = g("post_attention_layernorm.weight")
        qkv = torch.cat([g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")])
        biases = [w.pop(prefix + f"self_attn.{p}_proj.bias", None) for p in "qkv"]
        self.qkv = linear(qkv, torch.cat(biases) if all(b is not None for b in biases) else None)
        self.o = linear(g("self_attn.o_proj.weight"), w.pop(prefix + "self_attn.o_proj.bias", None))
        self.gate_up = linear(torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]))
        self.down = linear(g("mlp.down_proj.weight"))
        self.h, self.kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.paged = paged
        self.ops: LayerOps = ops or TorchLayerOps(self.h, self.kv, self.d)

    def nbytes(self) -> int:
        linears = sum(lin.nbytes for lin in (self.qkv, self.o, self.gate_up, self.down))
        return tensor_bytes(self.input_norm, self.post_norm) + linears

    def to(self, device: torch.device) -> None:
        self.input_norm, self.post_norm = self.input_norm.to(device), self.post_norm.to(device)
        for lin in (self.qkv, self.o, self.gate_up, self.down):
            lin.to(device)

    def forward(
        self, x: torch.Tensor, res: torch.Tensor | None, st: OpsStep, meta: AttentionMetadata, layer: int
    ) -> torch.Tensor:
        """x += res (the previous layer's output), then this layer; returns its output (added by the next)."""
        ops = self.ops
        qkv = self.qkv(ops.add_rms_norm(x, res, self.input_norm, self.eps, st))
        q, k, v = ops.rope_kv(qkv, st, layer)
        a = self._attend(q, k, v, meta, st.arena, layer)
        gu = self.gate_up(ops.add_rms_norm(x, self.o(a), self.post_norm, self.eps, st))
        return self.down(ops.silu_mul(gu, st))

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, arena: KVArena, layer: int
    ) -> torch.Tensor:
        """q [N, H, D], k/v [N, KV, D] -> [N, H*D]; writes k/v into the paged cache first."""
        kc, vc = arena.k_layers[layer], arena.v_layers[layer]
        kc.index_put_((meta.slot_blocks, meta.slot_offsets), k)
        vc.index_put_((meta.slot_blocks, meta.slot_offsets), v)
        return self._attend(q, k, v, meta, arena, layer)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, arena: KVArena, layer: int
    ) -> torch.Tensor:
        """Attention of q over the cache, where k/v are already written."""
        kc, vc = arena.k_layers[layer], arena.v_layers[layer]
        n, hd = q.shape[0], self.h * self.d
        parts = len(meta.prefills) + len(meta.decodes) + (meta.paged is not None)
        out = None if parts == 1 else q.new_empty(n, hd)
        for seg in meta.prefills:
            o = self._prefill(q, k, v, seg, kc, vc, arena)
            if out is None:
                return o
            out[seg.start : seg.end] = o
        for grp in meta.decodes:
            o = self._decode(q, grp, kc, vc, arena)
            if out is None:
                return o
            out[grp.start : grp.end] = o
        if (rows := meta.paged) is not None:
            assert self.paged is not None, "paged decode rows for a model without the paged kernel"
            o = self.paged(q[rows.start : rows.end], kc, vc, rows)
            if out is None:
                return o
            out[rows.start : rows.end] = o
        return out

    def _prefill(self, q, k, v, seg: PrefillSegment, kc, vc, arena: KVArena) -> torch.Tensor:
        s, e = seg.start, seg.end
        qs = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if seg.block_ids is None:  # no earlier context
            ks, vs = k[s:e], v[s:e]
            mask, causal = None, True
        else:
            ks = arena.gather(kc, seg.block_ids, 0).flatten(0, 1)  # [T, KV, D]
            vs = arena.gather(vc, seg.block_ids, 1).flatten(0, 1)
            mask, causal = seg.mask, False
        o = F.scaled_dot_product_attention(
            qs,
            ks.transpose(0, 1).unsqueeze(0),
            vs.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            enable_gqa=self.h != self.kv,
        )
        return o[0].transpose(0, 1).reshape(e - s, self.h * self.d)

    def _decode(self, q, grp: DecodeGroup, kc, vc, arena: KVArena) -> torch.Tensor:
        b = grp.end - grp.start
        if grp.buffers is None:
            grp.buffers = self._decode_buffers(grp, kc.shape[1:], arena)
        k_dst, v_dst, kk, vv = grp.buffers
        torch.index_select(kc, 0, grp.block_ids, out=k_dst)  # [B*nb, bs, KV, D]
        torch.index_select(vc, 0, grp.block_ids, out=v_dst)
        # GQA without repeating K/V: the G query heads of a KV head act as G query rows
        qd = q[grp.start : grp.end].view(b, self.kv, self.h // self.kv, self.d)
        o = F.scaled_dot_product_attention(qd, kk, vv, attn_mask=grp.mask)
        return o.reshape(b, self.h * self.d)

    def _decode_buffers(self, grp: DecodeGroup, page: torch.Size, arena: KVArena) -> tuple:
        """Gather destinations and their [B, KV, T, D] views, shared by every layer of a step."""
        b, n = grp.end - grp.start, grp.block_ids.numel()
        k_dst, v_dst = arena.workspace((n, *page), 0), arena.workspace((n, *page), 1)
        t = n // b * page[0]
        kk, vv = k_dst.view(b, t, self.kv, self.d), v_dst.view(b, t, self.kv, self.d)
        if grp.mask is None:
            kk, vv = kk[:, : grp.ctx_len], vv[:, : grp.ctx_len]
        return k_dst, v_dst, kk.transpose(1, 2), vv.transpose(1, 2)


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
        self.norm = w.pop("model.norm.weight")
        lm_head = w.pop("lm_head.weight", None)
        tied = cfg.tie_word_embeddings or lm_head is None
        self.lm_head = linear(embed if tied else lm_head, lookups=tied)
        self.embed = None if tied else embed  # tied: rows are read from lm_head
        self.layers = [
            DecoderLayer(cfg, w, f"model.layers.{i}.", linear, self.paged, self.ops) for i in range(cfg.num_layers)
        ]
        w.clear()
        inv = rope_inv_freq(cfg, ckpt.rope_freqs)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        self.to(self.device)

    def to(self, device: torch.device) -> None:
        self.embed = None if self.embed is None else self.embed.to(device)
        self.norm = self.norm.to(device)
        self.lm_head.to(device)
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
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
        res = None
        for i, layer in enumerate(self.layers):
            res = layer.forward(x, res, st, meta, i)
        if res is not None:
            x.add_(res)
        x = self.ops.add_rms_norm(x[logits_rows], None, self.norm, self.config.rms_norm_eps, st)
        return self.lm_head(x).float()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            return F.embedding(input_ids, self.embed)
        return self.lm_head.rows(input_ids).to(self.dtype)


def _paged_kernel(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, attention: str
) -> PagedDecodeAttention | None:
    """The paged decode kernel for `attention` ('paged': required; 'auto': where it builds; 'gather': none)."""
    if attention != "auto" and attention not in ATTENTIONS:
        raise ValueError(f"attention must be 'auto' or one of {ATTENTIONS}, got {attention!r}")
    if attention == "gather":
        return None
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
        need += [
            p + s
            for s in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            )
        ]
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
