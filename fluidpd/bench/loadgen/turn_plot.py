"""PNG: TTFT (p50, p95) and the prefix-cache hit rate by turn, one line per run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fluidpd.bench.plots import save_figure


def turns_plot(series: dict[str, list[dict]], path: Path, title: str = "") -> Path:
    """`series`: label -> its by-turn rows (turns.by_turn)."""
    fig, (ax_t, ax_h) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    turns = sorted({r["turn"] for rows in series.values() for r in rows})
    for i, (label, rows) in enumerate(series.items()):
        turn = [r["turn"] for r in rows]
        color = f"C{i}"
        ax_t.plot(turn, [r["ttft_p50_s"] for r in rows], "o-", color=color, label=f"{label} p50")
        ax_t.plot(turn, [r["ttft_p95_s"] for r in rows], "x--", color=color, alpha=0.6, label=f"{label} p95")
        ax_h.plot(turn, [r["hit_rate"] for r in rows], "o-", color=color, label=label)
    ax_t.set_ylabel("TTFT (s)")
    ax_t.set_yscale("log")
    ax_t.grid(alpha=0.3)
    ax_t.legend(fontsize=7, ncol=2)
    if title:
        ax_t.set_title(textwrap.fill(title, 80), fontsize=9)
    ax_h.set_ylabel("cached / prompt tokens")
    ax_h.set_ylim(-0.02, 1.02)
    ax_h.set_xlabel("turn")
    ax_h.set_xticks(turns)
    ax_h.grid(alpha=0.3)
    return save_figure(fig, path)
