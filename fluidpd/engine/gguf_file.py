"""A GGUF file's metadata and tensor table (llama.cpp's format, versions 2 and 3), read in one pass.

Metadata values come back as plain Python values (an array of 49,152 token strings is one list of
str) and each tensor's bytes as a numpy view of one read-only mmap of the file. gguf-py's
`GGUFReader` keeps a numpy array per part of every field, ~160 MB of objects for SmolLM2's
vocabulary and merges, of which ~20 MB stayed resident (fragmented) after it was freed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
ELEMENT_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFTensor:
    """One tensor: GGUF dims (innermost first), type, and its data (elements, or block bytes per row)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray


class GGUFFile:
    """The metadata (`fields`: key -> value) and tensors of one GGUF file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self._mm)
        self._pos = len(MAGIC)
        if bytes(self._buf[:4]) != MAGIC:
            raise ValueError(f"{path!r} is not a GGUF file (no GGUF magic)")
        version, n_tensors, n_fields = self._unpack("<IQQ")
        if version not in (2, 3):
            raise ValueError(f"{path!r}: GGUF version {version} not supported (2, 3)")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I")[0])
        table = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"{path!r}: general.alignment {alignment} is not a power of two")
        start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(start, *entry) for entry in table]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError(f"{path!r}: duplicated tensor names")

    # ------------------------------------------------------------------ parsing
    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        s = str(self._buf[self._pos : self._pos + n], "utf-8")
        self._pos += n
        return s

    def _value(self, kind: int) -> Any:
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            sub, count = self._unpack("<IQ")
            if sub in SCALARS:  # a run of fixed-size values: one numpy read
                dtype = np.dtype(SCALARS[sub])
                values = np.frombuffer(self._buf, dtype, count, self._pos).tolist()
                self._pos += dtype.itemsize * count
                return values
            return [self._value(sub) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"{self.path!r}: unknown GGUF value type {kind}")
        return self._unpack(SCALARS[kind])[0]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        dims = self._unpack(f"<{n_dims}Q")
        kind, offset = self._unpack("<IQ")
        return name, tuple(int(d) for d in dims), kind, offset

    def _tensor(self, start: int, name: str, dims: tuple[int, ...], kind: int, offset: int) -> GGUFTensor:
        qtype = GGMLQuantizationType(kind)
        block, type_size = GGML_QUANT_SIZES[qtype]
        shape = tuple(reversed(dims))  # numpy order: outermost first
        n = int(np.prod(dims))
        if qtype in ELEMENT_DTYPES:
            dtype, count = np.dtype(ELEMENT_DTYPES[qtype]), n
        else:  # quantized: rows of block bytes
            dtype, count = np.dtype(np.uint8), n // block * type_size
            shape = (*shape[:-1], shape[-1] // block * type_size)
        data = np.frombuffer(self._mm, dtype, count, start + offset).reshape(shape)
        return GGUFTensor(name, dims, qtype, data)
