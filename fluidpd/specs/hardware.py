"""Accelerator specs: dense peak FLOP/s per dtype, HBM size and bandwidth, links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from fluidpd.core.registry import Registry


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator: dense peak compute, memory, and interconnect (all in bytes or bytes/s)."""

    name: str
    peak_flops: Mapping[str, float] = field(hash=False)  # dtype -> dense FLOP/s (no sparsity)
    mem_bytes: float
    mem_bw: float
    nvlink_bw: float  # aggregate bidirectional per-GPU NVLink bandwidth (datasheet figure)
    internode_bw: float = 50e9  # one 400 Gb/s NIC per GPU
    measured: bool = True  # False: nominal placeholder numbers, not datasheet or measurement

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        if min(self.mem_bytes, self.mem_bw, self.nvlink_bw, self.internode_bw, *self.peak_flops.values()) <= 0:
            raise ValueError(f"{self.name}: all capacities and rates must be positive")

    @property
    def nvlink_bw_unidir(self) -> float:
        """One direction of NVLink: what a point-to-point copy or a ring all-reduce step gets."""
        return self.nvlink_bw / 2

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s at `dtype`; ValueError if the tensor cores lack it (fp8 on A100)."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ValueError(
                f"{self.name} has no {dtype} tensor-core support; available: {', '.join(self.peak_flops)}"
            ) from None

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where compute and HBM bandwidth balance."""
        return self.flops(dtype) / self.mem_bw


_H100_FLOPS = {"fp32": 494.5e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}  # fp32 = TF32 dense

HARDWARE: Registry[HardwareSpec] = Registry("hardware")
for _h in (
    HardwareSpec("h100", _H100_FLOPS, 80e9, 3.35e12, 900e9),  # H100 SXM5
    HardwareSpec("h200", _H100_FLOPS, 141e9, 4.8e12, 900e9),  # same die as H100, HBM3e
    HardwareSpec("a100-80g", {"fp32": 156e12, "bf16": 312e12, "fp16": 312e12}, 80e9, 2.039e12, 600e9),
    # Nominal numbers for a few CPU cores so the small real engine has a spec to run against;
    # measured=False until a calibration run replaces them with measurements of this host.
    HardwareSpec(
        "cpu-host",
        {"fp32": 2e11, "bf16": 2e11, "fp16": 2e11},
        mem_bytes=64e9,
        mem_bw=2e10,
        nvlink_bw=1e10,  # stands for an intra-host memcpy between workers
        internode_bw=1.25e9,
        measured=False,
    ),
):
    HARDWARE.add(_h.name, _h)
HARDWARE_NAMES: tuple[str, ...] = HARDWARE.names()


def get_hardware(name: str) -> HardwareSpec:
    """Catalog accelerator by CLI name."""
    return HARDWARE.get(name.lower())
