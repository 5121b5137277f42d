"""Linear layers by weight format (`--quantization`): dense is the reference, int8 and fp16 stream fewer bytes.

* `none`: the weight in the model dtype, stored transposed ([in, out]): `x @ W` streams it at the
  memory bandwidth for any small batch, where `F.linear(x, W)` (MKL with a transposed operand)
  drops to half of it from 4 rows up on CPU.
* `int8` (CPU): weights int8, one scale per output channel; activations quantised per token
  (each row scaled to max |x| = 1, then fbgemm's dynamic int8 GEMM with the tensor's range pinned
  to [-1, 1] by one constant row); 8-bit activations where the CPU has VNNI, 7-bit elsewhere
  (fbgemm's AVX2 kernel sums pairs in int16, which 8 bits can overflow). Pinning the range makes
  a row's result independent of the rest of the batch (exact int32 sums); 4x fewer weight bytes
  than fp32. A rounding-size change upstream (padded vs unpadded attention) can still move an
  activation across a quantisation step, so greedy outputs can depend on batching, as in llama.cpp.
* `fp16` (CPU): fp16 weights, fp32 activations (fbgemm's fp16 GEMM); 2x fewer bytes.
* `gguf` (CPU): a GGUF's Q4_1 / Q8_0 blocks as shipped (fluidpd.engine.gguf_linear registers it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from fluidpd.core.cpu import cpu_flags
from fluidpd.core.registry import Registry


class Linear(Protocol):
    """y = x W^T (+ b) for x [N, in] in the model dtype; built from a [out, in] weight."""

    nbytes: int  # bytes a forward streams: weight, scales, bias (not the lookup table)

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def to(self, device: torch.device) -> Linear: ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight (a tied lm_head's embedding lookup; needs `lookups=True`)."""
        ...


LINEARS: Registry[Callable[..., Linear]] = Registry("quantization")


VNNI = bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


@LINEARS.register("none")
class DenseLinear:
    """y = x @ W (+ b), W stored [in, out] in the model dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, lookups: bool = False) -> None:
        self.weight, self.bias = weight.t().contiguous(), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.weight, self.bias)

    def to(self, device: torch.device) -> DenseLinear:
        self.weight = self.weight.to(device)
        self.bias = None if self.bias is None else self.bias.to(device)
        return self

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.index_select(1, ids).t().contiguous()


class _CpuPacked:
    """An fbgemm-packed layer: it lives on the CPU, so `to` only checks the device."""

    kind = ""

    def __init__(self, weight: torch.Tensor) -> None:
        _cpu_only(self.kind, weight.device)
        self.out_features, self.in_features = weight.shape

    def to(self, device: torch.device) -> _CpuPacked:
        _cpu_only(self.kind, torch.device(device))
        return self


@LINEARS.register("int8")
class Int8Linear(_CpuPacked):
    """Per-channel int8 weights, per-token int8 activations, fbgemm's int32-accumulating GEMM."""

    kind = "int8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, lookups: bool = False) -> None:
        super().__init__(weight)
        w = weight.float()
        self.scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
        q = torch.round(w / self.scale[:, None]).clamp_(-127, 127).to(torch.int8)
        with warnings.catch_warnings():  # quantized tensors are deprecated as a user API; fbgemm still packs them
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(
                q, self.scale.double(), torch.zeros_like(q[:, 0], dtype=torch.long), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.bias = None if bias is None else bias.float()
        self.q = q if lookups else None  # fbgemm's packed copy cannot be read back row by row cheaply
        self.pin = torch.zeros(1, self.in_features)
        self.pin[0, :2] = torch.tensor([1.0, -1.0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax(1, keepdim=True).clamp_min_(1e-30)
        y = torch.ops.quantized.linear_dynamic(torch.cat([x / s, self.pin]), self.packed, not VNNI)[:-1]
        y.mul_(s)
        return y if self.bias is None else y.add_(self.bias)

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features + tensor_bytes(self.scale, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.q is None:
            raise ValueError("built without lookups=True")
        return self.q.index_select(0, ids).float().mul_(self.scale.index_select(0, ids)[:, None])


@LINEARS.register("fp16")
class Fp16Linear(_CpuPacked):
    """fp16 weights, fp32 activations and accumulation (fbgemm)."""

    kind = "fp16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, lookups: bool = False) -> None:
        super().__init__(weight)
        self.table = weight.half() if lookups else None
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None if bias is None else bias.float())
        self.has_bias = bias is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)

    @property
    def nbytes(self) -> int:
        bias = 4 * self.out_features if self.has_bias else 0
        return 2 * self.out_features * self.in_features + bias

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            raise ValueError("built without lookups=True")
        return self.table.index_select(0, ids).float()


def _cpu_only(kind: str, device: torch.device) -> None:
    if device.type != "cpu":
        raise ValueError(f"--quantization {kind} runs on the CPU (fbgemm); use 'none' on {device.type}")


def tensor_bytes(*ts: torch.Tensor | None) -> int:
    """Bytes held by the given tensors (None skipped)."""
    return sum(t.numel() * t.element_size() for t in ts if t is not None)
