"""The small ops of a decoder layer around its linears: residual add + RMSNorm, RoPE + the KV write, silu(gate) * up
(SwiGLU; Gemma's GeGLU, gelu(gate) * up, is `gelu_mul`, torch on every path).

`TorchLayerOps` is the reference (and the path off the CPU, or in another dtype than float32);
`FusedLayerOps` runs each group as one call of a C kernel (fluidpd/engine/kernels/fused_ops.c)
through ctypes, on scratch rows allocated once per step. A forward calls `begin` once per step
(the per-step metadata: positions, KV slots, pointers), then the three ops in every layer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from fluidpd.engine.arena import KVArena
from fluidpd.engine.kernels import load

_i64, _i32, _f32, _p = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


@dataclass
class OpsStep:
    """One step's inputs to the ops, prepared once for every layer."""

    n: int  # rows of the flat batch
    arena: KVArena
    slot_blocks: torch.Tensor  # [n] int64 block of each row's new K/V
    slot_offsets: torch.Tensor  # [n] int64 token offset inside it
    cos: torch.Tensor  # torch: [n, 1, D/2] at the rows' positions; fused: the whole table
    sin: torch.Tensor
    positions: torch.Tensor  # [n] int64
    norm_out: torch.Tensor | None = None  # fused: [n, hidden] scratch, reused by every norm
    act_out: torch.Tensor | None = None  # fused: [n, intermediate] scratch


class LayerOps(Protocol):
    """The small ops of a layer; `x` is the residual stream [n, hidden], updated in place."""

    def begin(
        self,
        positions: torch.Tensor,
        slot_blocks: torch.Tensor,
        slot_offsets: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        arena: KVArena,
    ) -> OpsStep: ...

    def add_rms_norm(
        self, x: torch.Tensor, res: torch.Tensor | None, w: torch.Tensor, eps: float, st: OpsStep
    ) -> torch.Tensor:
        """x += res (when given); returns rms_norm(x) * w."""
        ...

    def rope_kv(self, qkv: torch.Tensor, st: OpsStep, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [n, H, D], k, v [n, KV, D] of `qkv` [n, (H + 2 KV) D], q and k rotated; k, v written to the cache."""
        ...

    def silu_mul(self, gu: torch.Tensor, st: OpsStep) -> torch.Tensor:
        """silu(gu[:, :I]) * gu[:, I:] for gu [n, 2I]."""
        ...


class _Shape:
    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.h, self.kv, self.d = heads, kv_heads, head_dim
        self.q_dim, self.qk_dim = heads * head_dim, (heads + kv_heads) * head_dim

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = qkv.shape[0]
        q = qkv[:, : self.q_dim].view(n, self.h, self.d)
        k = qkv[:, self.q_dim : self.qk_dim].view(n, self.kv, self.d)
        return q, k, qkv[:, self.qk_dim :].view(n, self.kv, self.d)


class TorchLayerOps(_Shape):
    """The reference: torch ops, any device and dtype."""

    def begin(self, positions, slot_blocks, slot_offsets, cos, sin, arena) -> OpsStep:
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        return OpsStep(positions.shape[0], arena, slot_blocks, slot_offsets, c, s, positions)

    def add_rms_norm(self, x, res, w, eps, st) -> torch.Tensor:
        if res is not None:
            x.add_(res)
        return F.rms_norm(x, w.shape, w, eps)

    def rope_kv(self, qkv, st, layer):
        n = qkv.shape[0]
        qk = rope(qkv[:, : self.qk_dim].view(n, self.h + self.kv, self.d), st.cos, st.sin)
        v = qkv[:, self.qk_dim :].view(n, self.kv, self.d)
        q, k = qk[:, : self.h], qk[:, self.h :]
        idx, kv_dtype = (st.slot_blocks, st.slot_offsets), st.arena.dtype
        st.arena.k_layers[layer].index_put_(idx, k.to(kv_dtype))  # rounded to the KV dtype (a no-op if the same)
        st.arena.v_layers[layer].index_put_(idx, v.to(kv_dtype))
        return q, k, v

    def silu_mul(self, gu, st) -> torch.Tensor:
        i = gu.shape[1] // 2
        return F.silu(gu[:, :i]).mul_(gu[:, i:])


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma's MLP): gelu_tanh(gu[:, :I]) * gu[:, I:] for gu [n, 2I], beside `LayerOps.silu_mul`'s SwiGLU."""
    i = gu.shape[1] // 2
    return F.gelu(gu[:, :i], approximate="tanh").mul_(gu[:, i:])


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention (HF rotate_half); x [N, heads, D], cos/sin [N, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty_like(x)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
    return out


def fused_kernels(march: str = "native") -> ctypes.CDLL:
    """fused_ops.c with its signatures declared; KernelUnavailable when it cannot be built."""
    lib = load("fused_ops", march)
    lib.add_rms_norm.restype = lib.silu_mul.restype = None
    lib.add_rms_norm.argtypes = [_p, _i64, _p, _i64, _p, _i64, _p, _i32, _i32, _f32]
    lib.silu_mul.argtypes = [_p, _i64, _p, _i64, _i32, _i32]
    for fn in (lib.rope_kv_write, lib.rope_kv_write_f16):  # float32 / float16 KV pages
        fn.restype = None
        fn.argtypes = [_p, _i64, _i32, _i32, _i32, _i32, _p, _p, _p, _p, _p, _i64, _i64, _p, _p]
    return lib


KV_WRITERS = {torch.float32: "rope_kv_write", torch.float16: "rope_kv_write_f16"}  # by the KV pages' dtype


class FusedLayerOps(_Shape):
    """One C call per op group (CPU, float32, contiguous rows); in-place RoPE on the qkv output; the KV
    write stores float32 pages, or float16 ones rounded to nearest even (as torch's `.half()`)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, hidden: int, intermediate: int, march: str = "native"):
        super().__init__(heads, kv_heads, head_dim)
        self.lib, self.hidden, self.inter = fused_kernels(march), hidden, intermediate

    def begin(self, positions, slot_blocks, slot_offsets, cos, sin, arena) -> OpsStep:
        n = positions.shape[0]
        for t in (positions, slot_blocks, slot_offsets):
            if t.dtype != torch.int64 or not t.is_contiguous() or t.shape != (n,):
                raise ValueError(f"positions and KV slots must be [{n}] contiguous int64")
        if not (cos.is_contiguous() and sin.is_contiguous()) or cos.shape[1] * 2 != self.d:
            raise ValueError(f"cos/sin tables must be contiguous [max_positions, {self.d // 2}]")
        k0 = arena.k_layers[0]
        if k0.dtype not in KV_WRITERS or k0.stride(3) != 1 or k0.stride(2) != self.d:
            raise ValueError(f"KV pages must be float32 or float16 with contiguous heads, not {k0.dtype}")
        if n and (int(positions.max()) >= cos.shape[0] or int(slot_blocks.max()) >= k0.shape[0]):
            raise IndexError("a position past the RoPE table or a KV slot past the arena")  # C would write anywhere
        st = OpsStep(n, arena, slot_blocks, slot_offsets, cos, sin, positions)
        st.norm_out = torch.empty(n, self.hidden)
        st.act_out = torch.empty(n, self.inter)
        return st

    def add_rms_norm(self, x, res, w, eps, st) -> torch.Tensor:
        n, out = x.shape[0], st.norm_out
        assert out is not None and x.stride(1) == 1 and (res is None or res.stride(1) == 1) and x.shape[1] == w.numel()
        if n != out.shape[0]:  # the final norm over the sampled rows only
            out = torch.empty(n, self.hidden)
        rp, rs = (None, 0) if res is None else (res.data_ptr(), res.stride(0))
        self.lib.add_rms_norm(
            x.data_ptr(), x.stride(0), rp, rs, out.data_ptr(), out.stride(0), w.data_ptr(), n, x.shape[1], eps
        )
        return out

    def rope_kv(self, qkv, st, layer):
        assert qkv.stride(1) == 1 and qkv.shape == (st.n, self.qk_dim + self.kv * self.d)
        kc, vc = st.arena.k_layers[layer], st.arena.v_layers[layer]
        getattr(self.lib, KV_WRITERS[kc.dtype])(
            qkv.data_ptr(), qkv.stride(0), st.n, self.h, self.kv, self.d, st.cos.data_ptr(), st.sin.data_ptr(),
            st.positions.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.stride(0), kc.stride(1),
            st.slot_blocks.data_ptr(), st.slot_offsets.data_ptr(),
        )  # fmt: skip
        return self.split(qkv)

    def silu_mul(self, gu, st) -> torch.Tensor:
        out = st.act_out
        assert out is not None and gu.stride(1) == 1 and gu.shape == (st.n, 2 * self.inter)
        self.lib.silu_mul(gu.data_ptr(), gu.stride(0), out.data_ptr(), out.stride(0), st.n, self.inter)
        return out
