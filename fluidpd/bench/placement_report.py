"""A placement as people read it: the chosen configuration, the top candidates per phase, and a
goodput-per-GPU plot of every candidate scored."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from fluidpd.bench.plots import save_figure
from fluidpd.placement.algorithms import Candidate
from fluidpd.placement.result import Placement


def _config(c: Candidate) -> str:
    if c.phase == "unit":
        a, b = c.segments
        return f"PP{c.pp} {a}x prefill TP{c.tp} + {b}x decode TP{c.decode_tp}"
    return f"TP{c.tp} PP{c.pp}"


def summary_lines(p: Placement) -> list[str]:
    pre, dec = p.prefill, p.decode
    lines = [f"Algorithm {p.algorithm}" + (f" ({p.reason})" if p.reason else "") + f", R = {p.rate:.4g} req/s"]
    if p.unit is not None:
        u = p.unit
        lines.append(
            f"  {u.instances} units PP={u.pp}, {u.prefill_segments} prefill TP={u.prefill_tp} + "
            f"{u.decode_segments} decode TP={u.decode_tp} per node per stage, at {u.goodput_rps:.1f} req/s each"
        )
    lines.append(f"  prefill: {pre.instances} instances PP={pre.pp} TP={pre.tp} at {pre.goodput_rps:.1f} req/s")
    lines.append(f"  decode:  {dec.instances} instances PP={dec.pp} TP={dec.tp} at {dec.goodput_rps:.1f} req/s")
    lines.append(
        f"  {p.total_gpus} GPUs"
        + (f" (cluster: {p.cluster_gpus})" if p.cluster_gpus else "")
        + f"; search {p.search_wall_s:.1f} s"
    )
    return lines


def print_placement(p: Placement, top: int = 5, title: str = "", console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    if title:
        console.print(f"[bold]{title}[/bold]")
    for line in summary_lines(p):
        console.print(line, highlight=False)
    for phase in ("prefill", "decode", "unit"):
        cands = sorted((c for c in p.candidates if c.phase == phase), key=lambda c: -c.per_gpu)[:top]
        if not cands:
            continue
        table = Table(title=f"top {phase} candidates")
        for col in ("configuration", "GPUs", "goodput req/s", "per GPU"):
            table.add_column(col, justify="left" if col == "configuration" else "right")
        for c in cands:
            table.add_row(_config(c), str(c.gpus), f"{c.goodput_rps:.2f}", f"{c.per_gpu:.3f}")
        console.print(table)


def placement_plot(p: Placement, path: Path) -> Path:
    """Goodput per GPU of every candidate, by phase, the chosen ones ringed."""
    phases = [ph for ph in ("prefill", "decode", "unit") if any(c.phase == ph for c in p.candidates)]
    fig, axes = plt.subplots(1, len(phases), figsize=(5 * len(phases), 4), squeeze=False)
    chosen = {("prefill", p.prefill.tp, p.prefill.pp), ("decode", p.decode.tp, p.decode.pp)}
    for ax, phase in zip(axes[0], phases):
        cands = sorted((c for c in p.candidates if c.phase == phase), key=lambda c: -c.per_gpu)
        labels = [_config(c).replace(" + ", "\n+ ") for c in cands]
        colours = []
        for c in cands:
            picked = (phase, c.tp, c.pp) in chosen if phase != "unit" else _is_unit(p, c)
            colours.append("tab:red" if picked else "tab:blue")
        ax.barh(range(len(cands)), [c.per_gpu for c in cands], color=colours)
        ax.set_yticks(range(len(cands)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("goodput per GPU (req/s)")
        ax.set_title(f"{phase} candidates (chosen in red)")
        ax.grid(alpha=0.3, axis="x")
    return save_figure(fig, path)


def _is_unit(p: Placement, c: Candidate) -> bool:
    u = p.unit
    return u is not None and (c.pp, c.tp, c.decode_tp, c.segments) == (
        u.pp,
        u.prefill_tp,
        u.decode_tp,
        (u.prefill_segments, u.decode_segments),
    )
