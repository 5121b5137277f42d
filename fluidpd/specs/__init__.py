"""Model and accelerator specs."""

from fluidpd.specs.hardware import HARDWARE_NAMES, HardwareSpec, get_hardware
from fluidpd.specs.models import DTYPE_BYTES, DTYPES, MODEL_NAMES, ModelSpec, get_model

__all__ = [
    "DTYPES",
    "DTYPE_BYTES",
    "HARDWARE_NAMES",
    "MODEL_NAMES",
    "HardwareSpec",
    "ModelSpec",
    "get_hardware",
    "get_model",
]
