"""One Llama decoder layer over the paged KV arena: fused q|k|v and gate|up linears, RoPE and the KV write,
attention split into prefill segments (SDPA, causal over the block table's context) and decodes (the paged
C kernel reading K/V pages in place, or gathered decode groups). The arena may hold K/V in another dtype
than the model's (float16 KV for a float32 model): writes round to it, reads convert to the query's dtype;
a prefill chunk with no earlier context attends to its K/V rounded alike, so a prompt's logits do not
depend on where its chunks (or a cached prefix) begin."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fluidpd.engine.arena import KVArena
from fluidpd.engine.attention_meta import AttentionMetadata, DecodeGroup, PrefillSegment
from fluidpd.engine.layer_ops import LayerOps, OpsStep, TorchLayerOps, gelu_mul
from fluidpd.engine.linear import Linear, tensor_bytes
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.moe import SparseMoE
from fluidpd.engine.paged_attention import PagedDecodeAttention
from fluidpd.engine.softcap_attention import attention


class DecoderLayer:
    """RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm -> SwiGLU -> residual; Gemma's
    (1 + w) norms also after attention and the MLP (before each residual add), and GeGLU."""

    def __init__(
        self,
        cfg: ModelConfig,
        w: dict[str, torch.Tensor],
        index: int,
        linear: Callable[..., Linear],
        paged: PagedDecodeAttention | None = None,
        ops: LayerOps | None = None,
    ) -> None:
        prefix = f"model.layers.{index}."
        one = 1.0 if cfg.gemma else 0.0  # Gemma's norms scale by 1 + w: folded in once here
        g = lambda name: w.pop(prefix + name)
        n = lambda name: g(name) + one
        self.input_norm = n("input_layernorm.weight")
        self.sandwich = None  # Gemma: the norms of attention's and the MLP's outputs
        if cfg.gemma:
            self.post_norm = n("pre_feedforward_layernorm.weight")
            self.sandwich = (n("post_attention_layernorm.weight"), n("post_feedforward_layernorm.weight"))
        else:
            self.post_norm = g("post_attention_layernorm.weight")
        self.qk_norms = (n("self_attn.q_norm.weight"), n("self_attn.k_norm.weight")) if cfg.qk_norm else None
        self.window, self.softcap = cfg.window(index), cfg.attn_logit_softcapping
        self.scale = cfg.query_pre_attn_scalar**-0.5 if cfg.query_pre_attn_scalar else None

        def fused(name: str, parts: tuple[str, ...]):  # Phi-3 ships q|k|v and gate|up as one tensor each
            t = w.pop(prefix + name, None)
            return torch.cat([g(p) for p in parts]) if t is None else t

        qkv = fused(
            "self_attn.qkv_proj.weight",
            ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        )
        biases = [w.pop(prefix + f"self_attn.{p}_proj.bias", None) for p in "qkv"]
        self.qkv = linear(qkv, torch.cat(biases) if all(b is not None for b in biases) else None)
        self.o = linear(g("self_attn.o_proj.weight"), w.pop(prefix + "self_attn.o_proj.bias", None))
        self.moe = SparseMoE(cfg, w, prefix, linear) if cfg.num_experts else None
        if self.moe is None:
            self.gate_up = linear(fused("mlp.gate_up_proj.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight")))
            self.down = linear(g("mlp.down_proj.weight"))
        self.h, self.kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.paged = paged
        self.ops: LayerOps = ops or TorchLayerOps(self.h, self.kv, self.d)

    @property
    def linears(self) -> tuple[Linear, ...]:
        """q|k|v, o, gate|up and down (each expert's, with a mixture of experts), in forward order."""
        if self.moe is not None:
            return self.qkv, self.o, *self.moe.linears
        return self.qkv, self.o, self.gate_up, self.down

    def nbytes(self) -> int:
        norms = tensor_bytes(self.input_norm, self.post_norm, *(self.qk_norms or ()), *(self.sandwich or ()))
        mlp = self.moe.nbytes() if self.moe is not None else self.gate_up.nbytes + self.down.nbytes
        return norms + self.qkv.nbytes + self.o.nbytes + mlp

    def to(self, device: torch.device) -> None:
        self.input_norm, self.post_norm = self.input_norm.to(device), self.post_norm.to(device)
        if self.qk_norms:
            self.qk_norms = (self.qk_norms[0].to(device), self.qk_norms[1].to(device))
        if self.sandwich:
            self.sandwich = (self.sandwich[0].to(device), self.sandwich[1].to(device))
        for lin in (self.qkv, self.o) if self.moe is not None else self.linears:
            lin.to(device)
        if self.moe is not None:
            self.moe.to(device)

    def forward(
        self, x: torch.Tensor, res: torch.Tensor | None, st: OpsStep, meta: AttentionMetadata, layer: int
    ) -> torch.Tensor:
        """x += res (the previous layer's output), then this layer; returns its output (added by the next)."""
        ops = self.ops
        qkv = self.qkv(ops.add_rms_norm(x, res, self.input_norm, self.eps, st))
        if self.qk_norms is not None:
            self._norm_heads(qkv)
        q, k, v = ops.rope_kv(qkv, st, layer)
        a = self._attend(q, k, v, meta, st.arena, layer)
        if self.sandwich is not None:
            after_attn, after_mlp = self.sandwich
            h = ops.add_rms_norm(x, self._norm(self.o(a), after_attn), self.post_norm, self.eps, st)
            return self._norm(self.down(gelu_mul(self.gate_up(h))), after_mlp)
        h = ops.add_rms_norm(x, self.o(a), self.post_norm, self.eps, st)
        if self.moe is not None:
            return self.moe(h)
        return self.down(ops.silu_mul(self.gate_up(h), st))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _norm_heads(self, qkv: torch.Tensor) -> None:
        """RMSNorm of every query and key head of `qkv` [n, (H + 2 KV) D] in place (Qwen3), before RoPE."""
        assert self.qk_norms is not None
        n, qd = qkv.shape[0], self.h * self.d
        for part, weight, heads in (
            (qkv[:, :qd], self.qk_norms[0], self.h),
            (qkv[:, qd : qd + self.kv * self.d], self.qk_norms[1], self.kv),
        ):
            x = part.reshape(n, heads, self.d)
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
            if self.sandwich is not None:  # Gemma: (x * w) rounded to the dtype, where Qwen3 rounds x first
                part.copy_((y * weight.float()).to(x.dtype).reshape(n, heads * self.d))
                continue
            part.copy_((weight * y.to(x.dtype)).reshape(n, heads * self.d))

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, arena: KVArena, layer: int
    ) -> torch.Tensor:
        """q [N, H, D], k/v [N, KV, D] -> [N, H*D]; writes k/v into the paged cache first."""
        kc, vc = arena.k_layers[layer], arena.v_layers[layer]
        kc.index_put_((meta.slot_blocks, meta.slot_offsets), k.to(kc.dtype))
        vc.index_put_((meta.slot_blocks, meta.slot_offsets), v.to(vc.dtype))
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
            ks, vs = k[s:e].to(kc.dtype).to(q.dtype), v[s:e].to(vc.dtype).to(q.dtype)  # as the arena holds them
            mask, causal = None, True
        else:
            ks = arena.gather(kc, seg.block_ids, 0).flatten(0, 1).to(q.dtype)  # [T, KV, D]
            vs = arena.gather(vc, seg.block_ids, 1).flatten(0, 1).to(q.dtype)
            mask, causal = seg.mask, False
        if self.window and seg.window_mask is not None:
            mask, causal = seg.window_mask, False
        o = attention(
            qs,
            ks.transpose(0, 1).unsqueeze(0),
            vs.transpose(0, 1).unsqueeze(0),
            mask,
            causal,
            self.scale,
            self.softcap,
            self.h != self.kv,
        )
        return o[0].transpose(0, 1).reshape(e - s, self.h * self.d)

    def _decode(self, q, grp: DecodeGroup, kc, vc, arena: KVArena) -> torch.Tensor:
        b = grp.end - grp.start
        if grp.buffers is None:
            grp.buffers = self._decode_buffers(grp, kc.shape[1:], arena, q.dtype)
        k_dst, v_dst, k_att, v_att, kk, vv = grp.buffers
        torch.index_select(kc, 0, grp.block_ids, out=k_dst)  # [B*nb, bs, KV, D]
        torch.index_select(vc, 0, grp.block_ids, out=v_dst)
        if k_att is not k_dst:  # KV in another dtype than q: converted once per layer
            k_att.copy_(k_dst)
            v_att.copy_(v_dst)
        # GQA without repeating K/V: the G query heads of a KV head act as G query rows
        qd = q[grp.start : grp.end].view(b, self.kv, self.h // self.kv, self.d)
        mask = grp.mask
        if self.window and grp.mask is None:  # one sequence: its last `window` tokens
            kk, vv = kk[:, :, -self.window :], vv[:, :, -self.window :]
        elif self.window:
            mask = grp.window_mask
        o = attention(qd, kk, vv, mask, False, self.scale, self.softcap, False)
        return o.reshape(b, self.h * self.d)

    def _decode_buffers(self, grp: DecodeGroup, page: torch.Size, arena: KVArena, dtype: torch.dtype) -> tuple:
        """Gather destinations (the arena's dtype), what SDPA reads (`dtype`: the same tensors, or their
        converted copies) and its [B, KV, T, D] views, shared by every layer of a step."""
        b, n = grp.end - grp.start, grp.block_ids.numel()
        k_dst, v_dst = arena.workspace((n, *page), 0), arena.workspace((n, *page), 1)
        k_att, v_att = k_dst, v_dst
        if dtype != arena.dtype:
            k_att, v_att = torch.empty_like(k_dst, dtype=dtype), torch.empty_like(v_dst, dtype=dtype)
        t = n // b * page[0]
        kk, vv = k_att.view(b, t, self.kv, self.d), v_att.view(b, t, self.kv, self.d)
        if grp.mask is None:
            kk, vv = kk[:, : grp.ctx_len], vv[:, : grp.ctx_len]
        return k_dst, v_dst, k_att, v_att, kk.transpose(1, 2), vv.transpose(1, 2)
