"""A GGUF weight kept as shipped: its quantised blocks, row by row, for the `gguf` linear layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

BLOCK = 32  # weights per block in both formats
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # fp16 d (+ fp16 m) + packed quants
GGML_TYPE = {"Q4_1": 3, "Q8_0": 8}  # ggml's type ids (the kernel's `type` argument)


@dataclass
class QuantizedTensor:
    """A [rows, cols] weight as GGUF blocks: `data` [rows, cols / 32 * block bytes] uint8, row-major.

    Model building treats it like a weight tensor: `torch.cat` of row blocks of one kind along
    dim 0 (fusing q|k|v, gate|up) and `.to(dtype)` (a no-op: the blocks compute in float32).
    """

    kind: str
    shape: tuple[int, int]
    data: torch.Tensor

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"quantised weights must be one of {sorted(BLOCK_BYTES)}, got {self.kind!r}")
        rows, cols = self.shape
        if cols % BLOCK:
            raise ValueError(f"{self.kind} rows hold whole blocks of {BLOCK}; got {cols} columns")
        want = (rows, cols // BLOCK * BLOCK_BYTES[self.kind])
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want or not self.data.is_contiguous():
            raise ValueError(f"{self.kind} {self.shape} needs contiguous uint8 data of shape {want}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def to(self, *args: Any, **kwargs: Any) -> QuantizedTensor:
        return self

    def dequantize(self) -> torch.Tensor:
        """The float32 weight, as gguf-py (the reference loader) dequantises it."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        arr = dequantize(self.data.numpy(), GGMLQuantizationType[self.kind])
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(self.shape))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.cat:
            return cat_rows(*args, **kwargs)
        raise TypeError(f"QuantizedTensor supports torch.cat only, not {getattr(func, '__name__', func)}")


def cat_rows(parts, dim: int = 0) -> QuantizedTensor | torch.Tensor:
    """Rows of several weights stacked (dim 0); mixed kinds or widths fall back to float32."""
    parts = list(parts)
    if dim != 0:
        raise ValueError("quantised weights are stacked along rows (dim 0) only")
    first = parts[0]
    same = all(isinstance(p, QuantizedTensor) and p.kind == first.kind and p.shape[1] == first.shape[1] for p in parts)
    if not same:
        return torch.cat([p.dequantize() if isinstance(p, QuantizedTensor) else p.float() for p in parts])
    data = torch.cat([p.data for p in parts])
    return QuantizedTensor(first.kind, (data.shape[0], first.shape[1]), data)
