"""The envelope: at every workload and load, fluidpd's joint and strict attainment against the best
other system there (the best at each point may be a different system: that is the envelope)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fluidpd.bench.plots import save_figure

GOAL_PP = -0.5  # fluidpd may trail the envelope by at most half a point
NOTE = {"textcoords": "offset points", "fontsize": 6}


@dataclass(frozen=True, slots=True)
class EnvelopePoint:
    """fluidpd at one workload and load beside the best other system for each metric."""

    point: str
    joint: float
    strict: float
    best_joint: float
    best_joint_system: str
    best_strict: float
    best_strict_system: str
    switches_per_hour: float = float("nan")  # fluidpd's role switches there, per hour of trace

    @property
    def joint_margin_pp(self) -> float:
        return (self.joint - self.best_joint) * 100

    @property
    def strict_margin_pp(self) -> float:
        return (self.strict - self.best_strict) * 100

    def as_json(self) -> dict:
        return {**asdict(self), "joint_margin_pp": self.joint_margin_pp, "strict_margin_pp": self.strict_margin_pp}

    @classmethod
    def from_json(cls, d: dict) -> EnvelopePoint:
        return cls(*(d[f.name] for f in fields(cls) if f.name in d))


def envelope_points(points: dict[str, dict[str, dict]], fluid: str, others: list[str]) -> list[EnvelopePoint]:
    """`points`: label -> system -> a row with "attainment" and "strict_attainment"; `others`: the
    systems fluidpd is held against (no ablation of itself, no oracle)."""
    out = []
    for label, rows in points.items():
        rivals = [s for s in others if s in rows]
        if fluid not in rows or not rivals:
            continue
        bj = max(rivals, key=lambda s: rows[s]["attainment"])
        bs = max(rivals, key=lambda s: rows[s]["strict_attainment"])
        f = rows[fluid]
        out.append(
            EnvelopePoint(
                label,
                f["attainment"],
                f["strict_attainment"],
                rows[bj]["attainment"],
                bj,
                rows[bs]["strict_attainment"],
                bs,
                f.get("switches_per_hour", float("nan")),
            )
        )
    return out


def describe(points: list[EnvelopePoint]) -> str:
    """One line: where fluidpd is furthest below the envelope, and how many points meet the goal."""
    if not points:
        return "envelope: no points"
    wj = min(points, key=lambda p: p.joint_margin_pp)
    ws = min(points, key=lambda p: p.strict_margin_pp)
    ok = sum(p.joint_margin_pp >= GOAL_PP and p.strict_margin_pp >= GOAL_PP for p in points)
    line = (
        f"envelope: fluidpd within {-GOAL_PP:g} pp of the best other system (joint and strict) at {ok} of "
        f"{len(points)} points; worst joint {wj.joint_margin_pp:+.1f} pp at {wj.point} (vs {wj.best_joint_system}), "
        f"worst strict {ws.strict_margin_pp:+.1f} pp at {ws.point} (vs {ws.best_strict_system})"
    )
    rated = [p for p in points if not math.isnan(p.switches_per_hour)]
    if rated:
        most = max(rated, key=lambda p: p.switches_per_hour)
        mid = float(np.median([p.switches_per_hour for p in rated]))
        line += f"; role switches median {mid:,.0f}/h, most {most.switches_per_hour:,.0f}/h at {most.point}"
    return line


def envelope_plot(points: list[EnvelopePoint], path: Path, title: str) -> Path:
    """Top: fluidpd's joint and strict attainment against the best other system's at every point;
    bottom: the margins in points with the goal line."""
    x = np.arange(len(points))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7.0, 0.9 * len(points) + 3), 7), sharex=True)
    for dx, mark, what in ((-0.1, "o", "joint"), (0.1, "^", "strict")):
        top.plot(x + dx, _pct(points, what), mark, color="#d62728", markersize=8, label=f"fluidpd {what}")
        best = _pct(points, f"best_{what}")
        top.plot(x + dx, best, mark, mfc="none", color="#1f77b4", markersize=10, label=f"best other, {what}")
    for i, p in enumerate(points):
        top.annotate(p.best_joint_system, (i - 0.1, p.best_joint * 100), xytext=(-4, -14), **NOTE)
        if p.best_strict_system != p.best_joint_system:
            top.annotate(p.best_strict_system, (i + 0.1, p.best_strict * 100), xytext=(-4, -24), **NOTE)
    top.set_ylabel("SLO attainment (%)")
    top.set_ylim(-2, 104)
    top.set_title(title, fontsize=10)
    top.grid(alpha=0.3)
    top.legend(fontsize=7, ncol=2, loc="lower left")
    joint = [p.joint_margin_pp for p in points]
    strict = [p.strict_margin_pp for p in points]
    bottom.bar(x - 0.18, joint, width=0.36, color=["#2ca02c" if v >= GOAL_PP else "#d62728" for v in joint])
    bottom.bar(x + 0.18, strict, width=0.36, color=["#98df8a" if v >= GOAL_PP else "#ff9896" for v in strict])
    bottom.axhline(0, color="black", linewidth=0.8)
    bottom.axhline(GOAL_PP, color="grey", linestyle="--", linewidth=0.8, label=f"goal: >= {GOAL_PP:g} pp")
    bottom.set_ylabel("fluidpd - best other (pp)\nleft joint, right strict")
    bottom.set_xticks(x)
    bottom.set_xticklabels([p.point for p in points], rotation=30, ha="right", fontsize=8)
    bottom.grid(alpha=0.3, axis="y")
    bottom.legend(fontsize=7)
    return save_figure(fig, path)


def _pct(points: list[EnvelopePoint], attr: str) -> list[float]:
    return [getattr(p, attr) * 100 for p in points]
