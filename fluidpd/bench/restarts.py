"""What the alternatives to an in-place role switch cost: the seed's Table 2, modelled from bandwidths.

The seed measures a 70B FP16 model (140 GB of weights):
  cold process restart      82.4 s weight load from disk      + 4.8 s NCCL/context  =  87.2 s
  warm container restart    14.1 s weight load from shm/IPC   + 3.2 s context       =  17.3 s
  dynamic autoscaler (K8s)  185.0 s VM provisioning + load    + 8.4 s context       = 193.4 s
  FluidRole (in place)      0 s                               + 0 s                 =   0.28 s

Model: the two load bandwidths are derived from the seed (140 GB / 82.4 s = 1.70 GB/s from disk,
140 GB / 14.1 s = 9.93 GB/s from shared memory) and applied to any model's weight bytes. The
autoscaler's 185 s lumps VM provisioning with a cold weight load (the seed lists it under "Model
Weight Reload"), so it is modelled as 185 - 82.4 = 102.6 s of provisioning that does not depend on
the model, plus the cold load at disk bandwidth, plus 8.4 s; for 140 GB this is the seed's 193.4 s.
"""

from __future__ import annotations

from dataclasses import dataclass

SEED_WEIGHT_BYTES = 140e9  # the seed's 70B FP16 model
SEED_DISK_LOAD_S = 82.4
SEED_COLD_CONTEXT_S = 4.8
SEED_SHM_LOAD_S = 14.1
SEED_WARM_CONTEXT_S = 3.2
SEED_AUTOSCALER_S = 185.0  # VM provisioning + weight load, as the seed's table reports it
SEED_AUTOSCALER_CONTEXT_S = 8.4
SEED_FLUIDROLE_S = 0.28

SEED_TABLE2 = {  # mechanism -> (weight reload s, context rebuild s, total s), as printed
    "cold process restart": (82.4, 4.8, 87.2),
    "warm container restart": (14.1, 3.2, 17.3),
    "dynamic autoscaler (K8s)": (185.0, 8.4, 193.4),
    "FluidRole (in place)": (0.0, 0.0, 0.28),
}


@dataclass(frozen=True, slots=True)
class RestartModel:
    """Bandwidths and fixed costs of the three restart mechanisms."""

    disk_bw: float = SEED_WEIGHT_BYTES / SEED_DISK_LOAD_S  # bytes/s
    shm_bw: float = SEED_WEIGHT_BYTES / SEED_SHM_LOAD_S  # bytes/s
    cold_context_s: float = SEED_COLD_CONTEXT_S
    warm_context_s: float = SEED_WARM_CONTEXT_S
    vm_provision_s: float = SEED_AUTOSCALER_S - SEED_DISK_LOAD_S
    autoscaler_context_s: float = SEED_AUTOSCALER_CONTEXT_S

    def __post_init__(self) -> None:
        if not (self.disk_bw > 0 and self.shm_bw > 0):
            raise ValueError("bandwidths must be > 0")
        if min(self.cold_context_s, self.warm_context_s, self.vm_provision_s, self.autoscaler_context_s) < 0:
            raise ValueError("fixed costs must be >= 0")

    def costs(self, weight_bytes: float) -> dict[str, tuple[float, float, float]]:
        """mechanism -> (weight reload s, context rebuild s, total downtime s) for `weight_bytes`."""
        if not weight_bytes > 0:
            raise ValueError(f"weight_bytes must be > 0, got {weight_bytes}")
        cold = weight_bytes / self.disk_bw
        warm = weight_bytes / self.shm_bw
        auto = self.vm_provision_s + cold
        return {
            "cold process restart": (cold, self.cold_context_s, cold + self.cold_context_s),
            "warm container restart": (warm, self.warm_context_s, warm + self.warm_context_s),
            "dynamic autoscaler (K8s)": (auto, self.autoscaler_context_s, auto + self.autoscaler_context_s),
        }
