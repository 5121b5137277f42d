"""What a placement search chose (`Placement`), as the JSON `fluidpd place --out` writes and `--placement` reads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from fluidpd.placement.algorithms import Algorithm1Result, Algorithm2Result, Candidate
from fluidpd.placement.estimator import GoodputEstimator


@dataclass(slots=True)
class PhasePlan:
    """`instances` copies of one tp x pp instance for one phase."""

    tp: int
    pp: int
    instances: int
    goodput_rps: float

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def to_json(self) -> dict:
        per_gpu = self.goodput_rps / self.gpus
        return {
            "tp": self.tp,
            "pp": self.pp,
            "instances": self.instances,
            "goodput_rps": self.goodput_rps,
            "goodput_per_gpu": per_gpu,
        }


@dataclass(slots=True)
class UnitPlan:
    """Algorithm 2's unit: per stage, prefill and decode segments on one node."""

    pp: int
    prefill_tp: int
    decode_tp: int
    instances: int
    goodput_rps: float
    prefill_segments: int = 1
    decode_segments: int = 1

    @property
    def gpus(self) -> int:
        return self.pp * (self.prefill_segments * self.prefill_tp + self.decode_segments * self.decode_tp)

    def to_json(self) -> dict:
        return {
            "pp": self.pp,
            "prefill_tp": self.prefill_tp,
            "decode_tp": self.decode_tp,
            "prefill_segments": self.prefill_segments,
            "decode_segments": self.decode_segments,
            "instances": self.instances,
            "goodput_rps": self.goodput_rps,
            "goodput_per_gpu": self.goodput_rps / self.gpus,
        }


@dataclass(slots=True)
class Placement:
    """What a search chose, and what it scored on the way."""

    algorithm: int
    prefill: PhasePlan
    decode: PhasePlan
    rate: float
    unit: UnitPlan | None = None
    cluster_gpus: int = 0
    search_wall_s: float = 0.0
    reason: str = ""
    candidates: list[Candidate] = field(default_factory=list)
    pruned: int = 0  # Algorithm 2: units whose bound ruled them out unsimulated

    @property
    def total_gpus(self) -> int:
        if self.unit is not None:
            return self.unit.instances * self.unit.gpus
        return self.prefill.instances * self.prefill.gpus + self.decode.instances * self.decode.gpus

    @property
    def fits(self) -> bool:
        """Whether R's GPUs fit the cluster (the seed's example replicates past its N x M)."""
        return not self.cluster_gpus or self.total_gpus <= self.cluster_gpus

    def prefill_share(self) -> float:
        """Share of the placement's GPUs that prefill."""
        p = self.prefill.instances * self.prefill.gpus
        return p / (p + self.decode.instances * self.decode.gpus)

    def to_json(self) -> dict:
        out = {
            "algorithm": self.algorithm,
            "rate_rps": self.rate,
            "prefill": self.prefill.to_json(),
            "decode": self.decode.to_json(),
            "total_gpus": self.total_gpus,
            "cluster_gpus": self.cluster_gpus,
            "fits": self.fits,
            "search_wall_s": self.search_wall_s,
            "reason": self.reason,
            "pruned_units": self.pruned,
            "candidates": [
                {
                    "phase": c.phase,
                    "tp": c.tp,
                    "pp": c.pp,
                    "decode_tp": c.decode_tp,
                    "segments": list(c.segments),
                    "gpus": c.gpus,
                    "goodput_rps": c.goodput_rps,
                    "goodput_per_gpu": c.per_gpu,
                }
                for c in self.candidates
            ],
        }
        if self.unit is not None:
            out["unit"] = self.unit.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> Placement:
        try:

            def phase(d: dict) -> PhasePlan:
                return PhasePlan(int(d["tp"]), int(d["pp"]), int(d["instances"]), float(d["goodput_rps"]))

            unit = data.get("unit")
            return cls(
                int(data["algorithm"]),
                phase(data["prefill"]),
                phase(data["decode"]),
                float(data.get("rate_rps", 0.0)),
                None
                if unit is None
                else UnitPlan(
                    int(unit["pp"]),
                    int(unit["prefill_tp"]),
                    int(unit["decode_tp"]),
                    int(unit["instances"]),
                    float(unit["goodput_rps"]),
                    int(unit.get("prefill_segments", 1)),
                    int(unit.get("decode_segments", 1)),
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a placement file (as fluidpd place --out writes): {exc}") from None


def load_placement(path: str | os.PathLike) -> Placement:
    """A placement written by `fluidpd place --out`."""
    try:
        return Placement.from_json(json.loads(Path(path).read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None


def from_algorithm1(res: Algorithm1Result, rate: float) -> Placement:
    p, d = res.prefill, res.decode
    return Placement(
        1,
        PhasePlan(p.tp, p.pp, res.prefill_instances, p.goodput_rps),
        PhasePlan(d.tp, d.pp, res.decode_instances, d.goodput_rps),
        rate,
        candidates=res.candidates,
    )


def from_algorithm2(res: Algorithm2Result, est: GoodputEstimator, rate: float) -> Placement:
    u = res.unit
    a, b = u.segments
    return Placement(
        2,
        PhasePlan(u.tp, u.pp, res.instances * a, est.prefill(u.tp, u.pp)),
        PhasePlan(u.decode_tp, u.pp, res.instances * b, est.decode(u.decode_tp, u.pp)),
        rate,
        UnitPlan(u.pp, u.tp, u.decode_tp, res.instances, u.goodput_rps, a, b),
        candidates=res.candidates,
    )
