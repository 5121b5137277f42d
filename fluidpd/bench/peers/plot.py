"""engine_vs_peers' panels: each server's medians side by side (the benchmark's plot and the docs' figure)."""

from __future__ import annotations

import math
from pathlib import Path

PANELS = (("single", "single-stream tok/s"), ("ttft", "TTFT cold (s)"), ("ttft_warm", "TTFT warm (s)"),
          ("conc", "conc-{c} out tok/s"), ("rss", "RSS of tree (GB)"), ("rss_full", "RSS, KV cycled (GB)"))  # fmt: skip


def plot_medians(med: dict[str, dict[str, float]], path: str | Path, concurrency: int, title: str) -> Path:
    """One bar panel per metric, a bar per server (NaN: no bar), saved as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fluidpd.bench.plots import save_figure

    fig, axes = plt.subplots(1, len(PANELS), figsize=(3 * len(PANELS), 3))
    names = list(med)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        ax.bar(names, [0 if math.isnan(med[n][key]) else med[n][key] for n in names], color=["C0", "C1"][: len(names)])
        ax.set_title(label.format(c=concurrency), fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path, dpi=120)
