"""Decode attention over the paged KV arena, read in place by a C kernel (fluidpd.engine.kernels).

The gather path (`index_select` of every page into scratch, then SDPA) copies a step's whole KV
context per layer; this kernel walks each row's block table and reads K/V where they lie. CPU,
float32 queries over float32 or float16 pages (converted on load, the same float32 math after it);
elsewhere the model keeps the gather path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from fluidpd.engine.kernels import KernelUnavailable, load

MAX_GROUP = 16  # MAX_G in the kernel
_i64, _i32, _f32, _p = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


@dataclass
class PagedDecodes:
    """Rows [start, end) of the batch: one decode token each, attended in place over its pages."""

    start: int
    end: int
    tables: torch.Tensor  # [B, max_blocks] int32 block tables (padding never read)
    ctx_lens: torch.Tensor  # [B] int32: tokens each row attends to (its own included)
    scores: torch.Tensor  # float32 scratch for one row's scores: num_heads * max(ctx_lens)
    max_ctx: int = field(init=False)  # max(ctx_lens), read once here rather than per layer

    def __post_init__(self) -> None:
        b, t, c = self.end - self.start, self.tables, self.ctx_lens
        if t.dim() != 2 or t.shape[0] != b or c.shape != (b,) or t.dtype != c.dtype or c.dtype != torch.int32:
            raise ValueError(f"{b} decode rows need [{b}, max_blocks] int32 tables and [{b}] int32 context lengths")
        if not (t.is_contiguous() and c.is_contiguous() and self.scores.is_contiguous()):
            raise ValueError("block tables, context lengths and scores must be contiguous")
        if self.scores.dtype != torch.float32:
            raise ValueError("the scores scratch must be float32")
        self.max_ctx = int(c.max()) if b else 0


class PagedDecodeAttention:
    """out[b] = softmax(q[b] K_b^T * scale) V_b over row b's pages, for every decode row at once."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, march: str = "native") -> None:
        if num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GROUP or head_dim % 8:
            raise KernelUnavailable(
                f"the paged kernel needs head_dim % 8 == 0 and at most {MAX_GROUP} query heads per KV head; "
                f"got {num_heads} heads, {num_kv_heads} KV heads of {head_dim}"
            )
        lib = load("paged_attention", march)
        self.fns = {torch.float32: lib.paged_decode_attention, torch.float16: lib.paged_decode_attention_f16}
        for fn in self.fns.values():  # by the pages' dtype
            fn.restype = ctypes.c_int32
            fn.argtypes = [_p, _i64, _p, _p, _p, _i64, _i64, _p, _i32, _p, _i32, _i32, _i32, _i32, _i32, _f32, _p]
        self.h, self.kv, self.d = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5

    def __call__(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rows: PagedDecodes) -> torch.Tensor:
        """q [B, H, D] (rows may be strided), kc/vc one layer's [blocks, block_size, KV, D] pages (float32 or
        float16) -> [B, H*D] float32."""
        b = rows.end - rows.start
        if q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != self.d or kc.stride(3) != 1:
            raise ValueError("paged decode attention needs float32 q and pages with contiguous heads")
        if kc.dtype not in self.fns or vc.dtype != kc.dtype:
            raise ValueError(f"paged decode attention reads float32 or float16 pages, not {kc.dtype} / {vc.dtype}")
        if kc.stride() != vc.stride() or kc.stride(2) != self.d:
            raise ValueError("K and V pages must share one [block, token, head, dim] layout")
        if q.shape[0] != b or rows.scores.numel() < self.h * rows.max_ctx:
            raise ValueError(f"{q.shape[0]} query rows for {b} decode rows, or scores scratch under {self.h} heads")
        out = q.new_empty(b, self.h * self.d)
        if torch.autograd._profiler_enabled():  # named in a profile (ctypes calls are invisible to it)
            with torch.profiler.record_function("fluidpd::paged_decode_attention"):
                self._run(q, kc, vc, rows, out)
        else:
            self._run(q, kc, vc, rows, out)
        return out

    def _run(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rows: PagedDecodes, out: torch.Tensor) -> None:
        t, n = rows.tables, rows.end - rows.start
        rc = self.fns[kc.dtype](
            q.data_ptr(), q.stride(0), out.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.stride(0), kc.stride(1),
            t.data_ptr(), t.shape[1], rows.ctx_lens.data_ptr(), n, self.h, self.kv, self.d, kc.shape[1],
            self.scale, rows.scores.data_ptr(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"paged decode attention does not support {self.h} heads / {self.kv} KV heads of {self.d}")
