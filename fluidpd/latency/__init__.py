"""Step-latency models: roofline estimate, calibration knobs, polynomial fits."""

from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.fit import Polynomial, fit_chunk_time, fit_polynomial, fit_prefill_time
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape

__all__ = [
    "LatencyConfig",
    "Polynomial",
    "RooflineModel",
    "StepShape",
    "fit_chunk_time",
    "fit_polynomial",
    "fit_prefill_time",
]
