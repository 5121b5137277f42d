"""The replan experiment's PNG: prefill workers over time per system, under the arrival rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fluidpd.sim.run import SimResult


def write_replan_plot(results: dict, runs: dict[str, SimResult], path: Path) -> Path:
    """Prefill workers over time for every system, over the workload's arrival rate and phases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fluidpd.bench.plots import save_figure

    fig, (ax_rate, ax_roles) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=(1, 2))
    trace_end = max(b for _, b, _ in results["workload"]["phases"])
    for a, b, label in results["workload"]["phases"]:
        for ax in (ax_rate, ax_roles):
            ax.axvspan(a / 3600, b / 3600, alpha=0.08, color="tab:grey" if label.endswith("code") else "tab:blue")
        ax_rate.text((a + b) / 7200, 0.95, label, ha="center", va="top", transform=ax_rate.get_xaxis_transform())
    any_run = next(iter(runs.values()))
    arrivals = any_run.cluster.trace.arrival_s
    bins = np.arange(0.0, trace_end + 60.0, 60.0)
    counts, _ = np.histogram(arrivals, bins)
    ax_rate.plot(bins[:-1] / 3600, counts / 60.0, color="black", lw=0.8)
    ax_rate.set_ylabel("arrivals (req/s)")
    for system, res in runs.items():
        tl = res.cluster.timeline
        prefill = [sum(1 for r in row if r == "prefill") for row in tl.role]
        ax_roles.step(np.array(tl.t) / 3600, prefill, where="post", label=system)
    for row in results["systems"].values():
        for p in row["replans"]:
            ax_roles.axvline(p["at_s"] / 3600, color="grey", lw=0.6, ls=":")
    ax_roles.set_ylabel("prefill workers")
    ax_roles.set_xlabel("hours")
    ax_roles.axvline(results["workload"]["history_s"] / 3600, color="black", lw=0.8, ls="--")
    ax_roles.legend(loc="upper right")
    ax_roles.grid(alpha=0.3)
    return save_figure(fig, path)
