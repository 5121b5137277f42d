"""PNG plots of the experiments: attainment against load per system, and FluidPD's control timeline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from fluidpd.bench.plots import save_figure

ROLE_CODES = {"prefill": 0, "decode": 1, "colocated": 2}
ROLE_COLORS = ["#d62728", "#1f77b4", "#7f7f7f"]


def attainment_vs_rate(
    curves: dict[str, tuple[list, list]],
    path: Path,
    title: str,
    xlabel: str,
    notes: dict[str, list[str]] | None = None,
    target: float | None = 0.9,
) -> Path:
    """`curves`: system -> (rate scales, joint attainment); `notes`: system -> a label per point."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, (x, y) in curves.items():
        ax.plot(x, np.asarray(y) * 100, marker="o", linewidth=1.4, label=system)
        for xi, yi, note in zip(x, y, (notes or {}).get(system, [])):
            ax.annotate(note, (xi, yi * 100), textcoords="offset points", xytext=(4, -10), fontsize=7)
    if target:
        ax.axhline(target * 100, color="grey", linestyle="--", linewidth=0.8, label=f"{target:.0%} target")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("joint SLO attainment (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def fluid_timeline(
    history: list,
    timeline,
    transitions: list,
    path: Path,
    title: str,
    phases: list[tuple[float, float, str]] = (),
    thresholds: dict[str, float] | None = None,
) -> Path:
    """PPI and DPI (FluidPD.history), every worker's role (Timeline.role) and each FluidRole transition.

    history: (t, ppi, dpi, state) samples; transitions: RoleTransition objects; phases: (start, end,
    label) spans shaded on both panels (e.g. surge / wave)."""
    fig, (ax_p, ax_r) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [1.3, 1]})
    _pressure_panel(ax_p, history, thresholds or {}, title)
    _role_panel(ax_r, timeline)
    _mark_transitions(ax_p, ax_r, transitions)
    _mark_phases(ax_p, ax_r, phases)
    ax_p.legend(fontsize=7, loc="upper center")
    return save_figure(fig, path)


def _pressure_panel(ax, history: list, thresholds: dict[str, float], title: str) -> None:
    if history:
        h = np.asarray([(t, p, d) for t, p, d, _ in history], dtype=np.float64)
        ax.plot(h[:, 0], h[:, 1], linewidth=0.9, color="#d62728", label="PPI (prefill pressure)")
        ax.plot(h[:, 0], h[:, 2], linewidth=0.9, color="#1f77b4", label="DPI (decode pressure)")
    for name, value in thresholds.items():
        ax.axhline(value, linestyle=":", linewidth=0.8, color="black")
        ax.annotate(
            name,
            (1, value),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(-60, 2),
            fontsize=7,
        )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("pressure index")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _role_panel(ax, timeline) -> None:
    roles = np.asarray([[ROLE_CODES.get(r, 2) for r in row] for row in timeline.role], dtype=np.float64)
    t = np.asarray(timeline.t, dtype=np.float64)
    if roles.size:
        edges = np.append(t, t[-1] + (t[-1] - t[-2] if len(t) > 1 else 1.0))
        ax.pcolormesh(
            edges,
            np.arange(roles.shape[1] + 1) - 0.5,
            roles.T,
            cmap=ListedColormap(ROLE_COLORS),
            vmin=-0.5,
            vmax=2.5,
            shading="flat",
        )
    ax.set_yticks(range(timeline.n_workers))
    ax.set_yticklabels([f"w{i}" for i in range(timeline.n_workers)], fontsize=7)
    ax.set_ylabel("worker role")
    ax.set_xlabel("time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ROLE_COLORS[:2]]
    ax.legend(handles, ["prefill", "decode"], fontsize=7, loc="upper right")


def _mark_transitions(ax_p, ax_r, transitions: list) -> None:
    """Each transition: a bar on its worker's row from its start to its route, a line on the indices."""
    for tr in transitions:
        end = tr.ended.get("route", tr.began_s)
        ax_r.plot([tr.began_s, end], [tr.worker, tr.worker], color="black", linewidth=3)
        ax_r.annotate(
            f"{tr.src_role.value[0].upper()}->{tr.dst_role.value[0].upper()}",
            (tr.began_s, tr.worker),
            textcoords="offset points",
            xytext=(3, 4),
            fontsize=7,
        )
        ax_p.axvline(tr.began_s, color="black", linewidth=0.6, alpha=0.6)


def _mark_phases(ax_p, ax_r, phases: list[tuple[float, float, str]]) -> None:
    for start, end, label in phases:
        ax_p.axvspan(start, end, color="#ffbb78" if "surge" in label else "#c5e0b4", alpha=0.25, zorder=0)
        ax_r.axvline(start, color="white", linewidth=1.2, linestyle="--")
        ax_p.annotate(
            label,
            (start, 1),
            xycoords=("data", "axes fraction"),
            textcoords="offset points",
            xytext=(3, -10),
            fontsize=7,
        )
