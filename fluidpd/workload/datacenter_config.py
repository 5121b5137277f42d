"""The datacenter generator's knobs and its daily cycle (`fluidpd.workload.datacenter`): rate(t)
proportional to 1 + A cos(2 pi (h(t) - peak_hour) / 24), normalised to the target mean rate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fluidpd.core.knobs import knob

SOURCES = ("azure_code", "azure_conv", "mooncake_conv", "mooncake_synth", "claude_code")
DAY_S = 86_400.0
WARP_GRID_S = 10.0  # the cycle's inverse is interpolated on this grid


@dataclass(frozen=True, slots=True)
class DatacenterConfig:
    """The datacenter generator's knobs (`fluidpd simulate` / `fluidpd bench` --dc-* with --trace datacenter)."""

    source: str = knob(
        "azure_code", "datacenter: the real trace each population draws from", flag="--dc-source", choices=SOURCES
    )
    rate: float = knob(100.0, "datacenter: target mean rate over the window, req/s", flag="--dc-rate")
    hours: float = knob(1.0, "datacenter: hours of traffic", flag="--dc-hours")
    populations: int = knob(16, "datacenter: independent user populations", flag="--dc-populations")
    population_rate: float | None = knob(
        None, "datacenter: req/s per population (sets the number of populations)", flag="--dc-population-rate"
    )
    daily_amplitude: float = knob(
        0.5, "datacenter: daily cycle amplitude A in [0, 1): peak / trough rate (1+A)/(1-A)", flag="--dc-amplitude"
    )
    peak_hour: float = knob(14.0, "datacenter: hour of day of the peak rate", flag="--dc-peak-hour")
    start_hour: float = knob(12.0, "datacenter: hour of day at t=0", flag="--dc-start-hour")
    turns: float = knob(4.0, "datacenter: mean turns a session is drawn with (before splits)", flag="--dc-turns")
    think_s: float = knob(30.0, "datacenter: mean seconds between a session's turns", flag="--dc-think")
    prefixes: int = knob(4, "datacenter: system prompts per population (Zipf popularity)", flag="--dc-prefixes")
    block_ids: bool = knob(
        True, "datacenter: carry prefix block ids (about 0.25 KB a request from azure_code)", flag="--dc-ids"
    )

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown datacenter source {self.source!r}; valid: {', '.join(SOURCES)}")
        for name in ("rate", "hours"):
            if not (np.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"datacenter {name} must be finite and > 0, got {getattr(self, name)}")
        if not (np.isfinite(self.turns) and self.turns >= 1):
            raise ValueError(f"datacenter turns (mean per session) must be >= 1, got {self.turns}")
        if self.populations < 1 or self.prefixes < 1:
            raise ValueError(f"populations and prefixes must be >= 1, got {self.populations}, {self.prefixes}")
        if self.population_rate is not None and not (np.isfinite(self.population_rate) and self.population_rate > 0):
            raise ValueError(f"population_rate must be finite and > 0, got {self.population_rate}")
        if not 0 <= self.daily_amplitude < 1:
            raise ValueError(f"daily_amplitude must be in [0, 1), got {self.daily_amplitude}")
        if not (np.isfinite(self.peak_hour) and np.isfinite(self.start_hour)):
            raise ValueError("peak_hour and start_hour must be finite")
        if not (np.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"think_s must be finite and >= 0, got {self.think_s}")

    @property
    def duration_s(self) -> float:
        return self.hours * 3600.0

    @property
    def n_populations(self) -> int:
        if self.population_rate is None:
            return self.populations
        return max(1, round(self.rate / self.population_rate))

    def relative_rate(self, t: np.ndarray) -> np.ndarray:
        """The daily cycle's rate at `t` s over the window's mean (1 on average over the window)."""
        return self._raw_rate(t) * self.duration_s / self._raw_count(np.array([self.duration_s]))[0]

    def _raw_rate(self, t: np.ndarray) -> np.ndarray:
        phase = 2 * np.pi * ((self.start_hour - self.peak_hour) * 3600.0 + t) / DAY_S
        return 1.0 + self.daily_amplitude * np.cos(phase)

    def _raw_count(self, t: np.ndarray) -> np.ndarray:
        """The integral of `_raw_rate` over [0, t]."""
        w, phase0 = 2 * np.pi / DAY_S, 2 * np.pi * (self.start_hour - self.peak_hour) * 3600.0 / DAY_S
        return t + self.daily_amplitude / w * (np.sin(phase0 + w * t) - np.sin(phase0))

    def warp(self, tau: np.ndarray) -> np.ndarray:
        """Wall times of operational times `tau` in [0, duration): equally spaced tau become the cycle's rate."""
        span = self.duration_s
        grid = np.linspace(0.0, span, max(2, int(span / WARP_GRID_S) + 1))
        count = self._raw_count(grid)
        return np.interp(tau, count * (span / count[-1]), grid)
