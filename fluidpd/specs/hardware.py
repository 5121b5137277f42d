"""Accelerator specs: dense peak FLOP/s per dtype, HBM size and bandwidth, links."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
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
    pcie_bw: float = 55e9  # host <-> device, one direction (PCIe Gen5 x16: 64 GB/s nominal)
    measured: bool = True  # False: nominal placeholder numbers, not datasheet or measurement

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        links = (self.nvlink_bw, self.internode_bw, self.pcie_bw)
        if min(self.mem_bytes, self.mem_bw, *links, *self.peak_flops.values()) <= 0:
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


PROFILE_DIR = Path(__file__).parent / "profiles"


@cache
def shipped_profile(name: str) -> dict | None:
    """The host profile shipped for `name` (`fluidpd profile`'s JSON in specs/profiles/), or None."""
    path = PROFILE_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def profiled_hardware(name: str, profile: dict) -> HardwareSpec:
    """A host's or a GPU's spec from its profile, in achieved (not datasheet) figures: compute = the
    best prefill's GEMM FLOP/s, bandwidth = weights streamed by a batch-1 decode step, memory = the
    profiled device's (a GPU's own; the host's RAM for a CPU host and for profiles older than the
    device record), links = the measured KV hand-off bandwidth between worker processes (one host:
    the same figure stands for all three links; on a GPU, a copy through host memory both ways)."""
    m, steps = profile["model"], profile["steps"]
    flops = max(
        2 * m["matmul_params"] * p["shape"]["prefill_tokens"] / p["seconds"]
        for p in steps
        if p["kind"] == "prefill" and p["shape"]["prefill_kv_read"] == 0
    )
    b1 = min(p["seconds"] for p in steps if p["kind"] == "decode" and p["shape"]["decode_tokens"] == 1)
    kv = profile["kv_transfer"]["bandwidth_Bps"]
    return HardwareSpec(
        name,
        {"fp32": flops, "bf16": flops, "fp16": flops},
        mem_bytes=profile.get("device", {}).get("mem_bytes") or profile["host"]["mem_bytes"],
        mem_bw=m["weight_bytes"] / b1,
        nvlink_bw=2 * kv,  # bidirectional, as the GPU entries: one direction is the hand-off
        internode_bw=kv,
        pcie_bw=kv,  # the host tier is the same RAM: a load is a copy like a hand-off's
        measured=True,
    )


_H100_FLOPS = {"fp32": 494.5e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}  # fp32 = TF32 dense

HARDWARE: Registry[HardwareSpec] = Registry("hardware")
for _h in (
    HardwareSpec("h100", _H100_FLOPS, 80e9, 3.35e12, 900e9),  # H100 SXM5
    HardwareSpec("h200", _H100_FLOPS, 141e9, 4.8e12, 900e9),  # same die as H100, HBM3e
    HardwareSpec("a100-80g", {"fp32": 156e12, "bf16": 312e12, "fp16": 312e12}, 80e9, 2.039e12, 600e9, pcie_bw=25e9),
):
    HARDWARE.add(_h.name, _h)
# measured by `fluidpd profile` (profiles/<name>.json): this CPU host, and a GPU of the catalogue
# profiled on one device (`fluidpd profile --device cuda`: <gpu>-measured beside the datasheet <gpu>)
for _name in ("cpu-host", *(f"{g}-measured" for g in HARDWARE.names())):
    if (_p := shipped_profile(_name)) is not None:
        HARDWARE.add(_name, profiled_hardware(_name, _p))
HARDWARE_NAMES: tuple[str, ...] = HARDWARE.names()


def get_hardware(name: str) -> HardwareSpec:
    """Catalog accelerator by CLI name."""
    return HARDWARE.get(name.lower())
