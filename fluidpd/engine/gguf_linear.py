"""`--quantization gguf`: linear layers that read a GGUF's Q4_1 / Q8_0 blocks as shipped (a C kernel).

Up to `MM_FROM_ROWS` activation rows (decode) the kernel (fluidpd/engine/kernels/gguf_linear.c)
computes from the blocks: fp32 activations times the exactly dequantised weights, fp32 sums,
output rows split across torch's thread count. From `MM_FROM_ROWS` rows on (prefill) the weight
is dequantised a slice of rows at a time into float32 scratch and multiplied by torch.mm, which is
faster there. Weights the GGUF ships in float (or a non-GGUF checkpoint) run as `fp16`.

`--quantization gguf-q8` computes every row as llama.cpp does for these types: each block of 32
activations quantised to int8 with one scale, integer dot products per block (AVX2 maddubs, or
VNNI), scaled in float (the scales stay fp32 where llama.cpp rounds them to fp16). It runs the
kernel at every batch size (as fast as dequantise + torch.mm from 24 rows up), so a row's result
does not depend on the rows batched with it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

import torch

from fluidpd.engine.kernels import KernelUnavailable, load
from fluidpd.engine.linear import LINEARS, Fp16Linear, Linear, tensor_bytes
from fluidpd.engine.quantized import GGML_TYPE, QuantizedTensor

MM_FROM_ROWS = 24  # activation rows from which dequantise + torch.mm beats the kernel (measured)
SCRATCH_BYTES = 2 << 20  # the float32 slice of a weight dequantised at once on the torch.mm path (8 MiB: no faster)
ISAS = ("scalar", "avx2", "avx512")  # the kernel's paths, narrowest first
ISA_ENV = "FLUIDPD_GGUF_ISA"  # the widest path to use (one of ISAS; default: the widest compiled in)

_p, _i32, _i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
_scratch = threading.local()


class GgufKernel:
    """The compiled kernel's entry points (y = x W^T, rows of W dequantised, its thread pool)."""

    def __init__(self) -> None:
        lib = load("gguf_linear")
        self.linear = lib.gguf_linear
        self.linear.restype = _i32
        self.linear.argtypes = [_i32, _p, _i64, _i64, _p, _i64, _i64, _p, _i32]
        self.linear_q8 = lib.gguf_linear_q8
        self.linear_q8.restype = _i32
        self.linear_q8.argtypes = self.linear.argtypes
        self.dequantize = lib.gguf_dequantize
        self.dequantize.restype = _i32
        self.dequantize.argtypes = [_i32, _p, _i64, _p, _i64, _i64, _p, _i32]
        self.parallel = lib.gguf_parallel  # its thread pool, for decode_step.c's attention
        self._set_isa = lib.gguf_set_isa
        self._set_isa.argtypes, self._set_isa.restype = [_i32], _i32
        most = os.environ.get(ISA_ENV) or ISAS[-1]
        if most not in ISAS:
            raise ValueError(f"{ISA_ENV} must be one of {ISAS}, got {most!r}")
        self.isa = self.set_isa(ISAS.index(most))

    def set_isa(self, most: int) -> int:
        """Calls take the widest path compiled in up to `most` (an index of ISAS), process-wide; returns it.

        Every path gives bit-identical results (they sum in the same order)."""
        self.isa = self._set_isa(most)
        return self.isa


_kernel: GgufKernel | None = None


def kernel() -> GgufKernel:
    """The process's kernel, built on first use (KernelUnavailable when it cannot be)."""
    global _kernel
    if _kernel is None:
        _kernel = GgufKernel()
    return _kernel


class GgufLinear:
    """y = x W^T (+ b) with W a QuantizedTensor (Q4_1 or Q8_0 blocks), on the CPU in float32."""

    def __init__(
        self, weight: QuantizedTensor, bias: torch.Tensor | None = None, *, lookups: bool = False, act8: bool = False
    ) -> None:
        if weight.data.device.type != "cpu":
            raise ValueError("--quantization gguf runs on the CPU")
        self.k = kernel()
        self.kernel_fn = self.k.linear_q8 if act8 else self.k.linear
        self.mm_from_rows = None if act8 else MM_FROM_ROWS  # int8 blocks: the kernel at every size (as fast)
        self.weight, self.bias = weight, None if bias is None else bias.float()
        self.out_features, self.in_features = weight.shape
        self.type, self.ptr = GGML_TYPE[weight.kind], weight.data.data_ptr()
        self.slice_rows = max(1, SCRATCH_BYTES // (4 * self.in_features))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"gguf linear takes float32 [N, {self.in_features}], got {x.dtype} {tuple(x.shape)}")
        if x.stride(1) != 1:
            x = x.contiguous()
        n = x.shape[0]
        if self.mm_from_rows is not None and n >= self.mm_from_rows:
            y = self._mm(x)
        else:
            y = x.new_empty(n, self.out_features)
            rc = self.kernel_fn(
                self.type, self.ptr, self.out_features, self.in_features, x.data_ptr(), x.stride(0), n,
                y.data_ptr(), torch.get_num_threads(),
            )  # fmt: skip
            if rc != 0:
                raise ValueError(f"gguf kernel refused a {self.weight.kind} {self.weight.shape} weight")
        return y if self.bias is None else y.add_(self.bias)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantise a slice of rows at a time into scratch and multiply with torch.mm."""
        y = x.new_empty(x.shape[0], self.out_features)
        scratch = _scratch_buffer(self.slice_rows * self.in_features)
        for r0 in range(0, self.out_features, self.slice_rows):
            rows = min(self.slice_rows, self.out_features - r0)
            w = scratch[: rows * self.in_features].view(rows, self.in_features)
            self._dequantize(w, None, r0, rows)
            if rows == self.out_features:
                torch.mm(x, w.t(), out=y)
            else:
                y[:, r0 : r0 + rows] = torch.mm(x, w.t())
        return y

    def _dequantize(self, out: torch.Tensor, ids: torch.Tensor | None, first: int, count: int) -> None:
        rc = self.k.dequantize(
            self.type, self.ptr, self.in_features, None if ids is None else ids.data_ptr(), first, count,
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"gguf kernel refused a {self.weight.kind} {self.weight.shape} weight")

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + tensor_bytes(self.bias)

    def to(self, device: torch.device) -> GgufLinear:
        if torch.device(device).type != "cpu":
            raise ValueError(f"--quantization gguf runs on the CPU; use 'none' on {torch.device(device).type}")
        return self

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight, dequantised (a tied embedding's lookup)."""
        ids = ids.to(torch.int64).contiguous()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.out_features):
            raise IndexError(f"row ids must lie in [0, {self.out_features})")
        out = torch.empty(ids.numel(), self.in_features)
        self._dequantize(out, ids, 0, ids.numel())
        return out.view(*ids.shape, self.in_features)


def _scratch_buffer(numel: int) -> torch.Tensor:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _scratch.buf = torch.empty(numel)
    return buf


@LINEARS.register("gguf")
def gguf_linear(
    weight: torch.Tensor | QuantizedTensor, bias: torch.Tensor | None = None, *, act8: bool = False, **kw
) -> Linear:
    """The kernel for quantised blocks; fp16 for float weights, or where the kernel cannot be built."""
    if isinstance(weight, QuantizedTensor):
        try:
            return GgufLinear(weight, bias, act8=act8, **kw)
        except KernelUnavailable as exc:
            warnings.warn(f"--quantization gguf falls back to fp16: {exc}", RuntimeWarning, stacklevel=2)
            weight = weight.dequantize()
    return Fp16Linear(weight, bias, **kw)


@LINEARS.register("gguf-q8")
def gguf_q8_linear(weight: torch.Tensor | QuantizedTensor, bias: torch.Tensor | None = None, **kw) -> Linear:
    """`gguf` with int8 activation blocks on the decode rows (llama.cpp's arithmetic)."""
    return gguf_linear(weight, bias, act8=True, **kw)
