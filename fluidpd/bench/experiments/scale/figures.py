"""The scale experiment's PNGs: goodput per GPU, attainment and control-plane CPU against cluster size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fluidpd.bench.plots import save_figure


def write_figures(results: dict, directory: Path) -> list[Path]:
    """scale.png in `directory`: three panels against GPUs (log scale), one line per system."""
    directory.mkdir(parents=True, exist_ok=True)
    sizes = sorted(results["sizes"].values(), key=lambda r: r["gpus"])
    systems = results["setting"]["systems"]
    panels = (
        ("goodput_per_gpu", "goodput per GPU (req/s meeting both SLOs)", 1.0),
        ("attainment", "joint SLO attainment (%)", 100.0),
        ("control_cpu_per_cycle_ms", "control-plane CPU per 10 ms cycle (ms)", 1.0),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 4.5))
    x = [s["gpus"] for s in sizes]
    for ax, (key, label, k) in zip(axes, panels):
        for system in systems:
            ax.plot(x, [s["systems"][system][key] * k for s in sizes], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{n:,}" for n in x])
        ax.set_xlabel("GPUs (8 a node)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[2].axhline(10.0, color="grey", linestyle="--", linewidth=0.8, label="the 10 ms cycle")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    st = results["setting"]
    fig.suptitle(
        f"same load per GPU ({st['rate_per_gpu']:g} req/s, {st['source']} populations), at least "
        f"{st['window_s']:g} s and {st['min_requests']:,} requests evaluated"
    )
    return [save_figure(fig, directory / "scale.png")]
