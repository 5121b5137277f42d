"""The KV-reuse table's PNGs: the envelope, and token hit rate and turn-2+ TTFT p50 against load per workload."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fluidpd.bench.experiments.envelope import EnvelopePoint, envelope_plot
from fluidpd.bench.plots import save_figure


def write_figures(results: dict, directory: Path) -> list[Path]:
    """envelope.png, hit_rate_<workload>.png and ttft_turn2_<workload>.png in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    points = [EnvelopePoint.from_json(p) for p in results["envelope"]]
    title = (
        "fluidpd+kv-affinity against the best other row at every workload and load\n"
        "(load: share of the best baseline's saturation load on history)"
    )
    paths = [envelope_plot(points, directory / "envelope.png", title)]
    for name, loads in results["kv"].items():
        entry = results["workloads"][name]
        shares = sorted(loads, key=float)
        x = [float(s) * 100 for s in shares]
        systems = [r["system"] for r in loads[shares[0]]]
        oracle = [loads[s][0]["oracle_hit_rate"] * 100 for s in shares]
        series = {sys: [next(r for r in loads[s] if r["system"] == sys) for s in shares] for sys in systems}
        sat = f"saturation {entry['saturation']['saturation_load']:.3g} {entry['knob']}"
        paths.append(
            _plot(
                {k: [r["hit_rate"] * 100 for r in v] for k, v in series.items()},
                x,
                "token hit rate (%)",
                f"{name}: prefix-cache hit rate ({sat})",
                directory / f"hit_rate_{name}.png",
                extra=("oracle (infinite shared cache)", oracle),
            )
        )
        paths.append(
            _plot(
                {k: [r["ttft_turn2_p50_s"] * 1e3 for r in v] for k, v in series.items()},
                x,
                "turn-2+ TTFT p50 (ms)",
                f"{name}: follow-up TTFT p50 ({sat})",
                directory / f"ttft_turn2_{name}.png",
                log=True,
            )
        )
    return paths


def _plot(curves: dict, x: list, ylabel: str, title: str, path: Path, extra=None, log: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for system, y in curves.items():
        fluid = system.startswith("fluidpd")
        ax.plot(x, y, marker="o", linewidth=2.2 if fluid else 1.0, linestyle="-" if fluid else "--", label=system)
    if extra:
        ax.plot(x, extra[1], color="black", linewidth=1.5, linestyle=":", label=extra[0])
    if log and np.nanmin([v for y in curves.values() for v in y] or [1]) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("load (% of the best baseline's saturation load on history)")
    ax.set_ylabel(ylabel)
    ax.set_xticks(x)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)
