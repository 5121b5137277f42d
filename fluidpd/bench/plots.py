"""PNG plots: TTFT and TBT CDFs across policies, and per-policy timelines of queues and use."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def save_figure(fig, path: str | Path, dpi: int = 110, **kw) -> Path:
    """`fig` laid out tight, written to `path` (its folder made) and closed; `path`."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, **kw)
    plt.close(fig)
    return path


def cdf_plot(
    series: dict[str, tuple[np.ndarray, np.ndarray]], xlabel: str, path: Path, slo: float | None = None
) -> Path:
    """`series`: label -> (values, cumulative fraction)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (x, y) in series.items():
        if len(x):
            ax.step(x, y, where="post", label=label)
    if slo:
        ax.axvline(slo, color="grey", linestyle="--", label="SLO")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def sorted_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray(values, dtype=np.float64))
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def timeline_plot(timeline, title: str, path: Path) -> Path:
    """Queue length, decoding batch, KV use and utilisation of every worker over time."""
    t = np.asarray(timeline.t)
    panels = [
        ("queued requests", timeline.queue),
        ("decoding requests", timeline.decoding),
        ("KV use", timeline.kv_use),
        ("utilisation", timeline.utilization),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 9), sharex=True)
    for ax, (label, data) in zip(axes, panels):
        arr = np.asarray(data, dtype=np.float64)
        if arr.size:
            for w in range(arr.shape[1]):
                ax.plot(t, arr[:, w], linewidth=0.8, label=f"w{w} ({timeline.role[0][w]})")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[0].legend(fontsize=6, ncol=4)
    axes[-1].set_xlabel("time (s)")
    return save_figure(fig, path)


def bars_plot(
    groups: dict[str, dict[str, float]],
    ylabel: str,
    path: Path,
    title: str = "",
    *,
    figsize: tuple[float, float] = (6, 4),
    legend_below: bool = False,
) -> Path:
    """Grouped bars: `groups` maps a group (x tick) to its bars (label -> value), same labels in each;
    `legend_below`: the legend under the axes, in columns (for many labels)."""
    labels = list(next(iter(groups.values()))) if groups else []
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.8 / max(len(labels), 1)
    x = np.arange(len(groups))
    for i, label in enumerate(labels):
        ax.bar(x + (i - (len(labels) - 1) / 2) * width, [g[label] for g in groups.values()], width, label=label)
    ax.set_xticks(x, list(groups))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    if legend_below:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(labels), 4), fontsize=8)
    else:
        ax.legend()
    return save_figure(fig, path, bbox_inches="tight" if legend_below else None)


def scaling_plot(
    panels: dict[str, dict[str, tuple[list[float], list[float]]]],
    xlabel: str,
    path: Path,
    lines: dict[str, float] | None = None,
    title: str = "",
) -> Path:
    """Side-by-side log-log panels (title -> label -> (x, y)), each with the horizontal reference
    `lines` (label -> y: a goal, a period)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        for label, (x, y) in series.items():
            ax.plot(x, y, marker="o", label=label)
        for label, y in (lines or {}).items():
            ax.axhline(y, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(label, (1.0, y), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
