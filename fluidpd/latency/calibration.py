"""Fitted latency knobs per GPU, kept as data with their source (`calibrations/<gpu>.json`).

A GPU with measured figures (the A100-80GB, from the DistServe paper) has a knob set fitted to
them by `fluidpd experiment calibrate`; the file records the figures, their source, the fit's
value for each and its error. A GPU without a file runs on LatencyConfig's datasheet estimates.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from functools import cache
from pathlib import Path

from fluidpd.latency.config import LatencyConfig

CALIBRATION_DIR = Path(__file__).parent / "calibrations"


def calibration_path(gpu: str) -> Path:
    return CALIBRATION_DIR / f"{gpu}.json"


@cache
def _load(gpu: str) -> dict | None:
    path = calibration_path(gpu)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    known = {f.name for f in fields(LatencyConfig)}
    unknown = set(data["knobs"]) - known
    if unknown:
        raise ValueError(f"{path}: unknown latency knobs {sorted(unknown)}")
    return data


def calibration(gpu: str) -> dict | None:
    """The calibration record of `gpu` (knobs, figures, source, errors), or None."""
    return _load(gpu)


def latency_config(gpu: str) -> LatencyConfig:
    """The fitted knobs of `gpu`, or the datasheet-estimate defaults when it has no calibration."""
    data = _load(gpu)
    return LatencyConfig(**data["knobs"]) if data else LatencyConfig()


def save_calibration(gpu: str, config: LatencyConfig, record: dict, path: Path | None = None) -> Path:
    """Write `config` and the fit's `record` (figures, source, errors) as `gpu`'s calibration."""
    path = path or calibration_path(gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gpu": gpu, "knobs": asdict(config), **record}, indent=1) + "\n")
    _load.cache_clear()
    return path
