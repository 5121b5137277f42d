"""Table 1's PNGs: the headline bars, the envelope, attainment against rate per workload, fluidpd's timelines."""

from __future__ import annotations

from pathlib import Path

from fluidpd.bench.experiments.common import DTYPE, GPU, N_WORKERS, SLO
from fluidpd.bench.experiments.envelope import EnvelopePoint, envelope_plot
from fluidpd.bench.experiments.plots import attainment_vs_rate, fluid_timeline
from fluidpd.bench.experiments.table1.run import SYSTEMS
from fluidpd.bench.plots import bars_plot


def setting_line(results: dict) -> str:
    """The cluster, model and SLOs of a Table 1 run, for the figures' titles."""
    model = results["setting"]["model"]
    return f"{N_WORKERS} x {GPU} {model} {DTYPE}, SLO TTFT {SLO.ttft_s:g} s, TBT {SLO.tbt_s * 1e3:g} ms"


def write_figures(results: dict, kept: dict, directory: Path) -> list[Path]:
    """Every Table 1 PNG in `directory`: headline.png, envelope.png, attainment_vs_rate_<workload>.png and
    fluidpd_<workload>_timeline.png."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [headline_bars(results, directory / "headline.png")]
    points = [EnvelopePoint.from_json(p) for p in results["envelope"]]
    title = f"fluidpd against the best other system at every workload and rate (no oracle)\n{setting_line(results)}"
    paths.append(envelope_plot(points, directory / "envelope.png", title))
    for name, entry in results["workloads"].items():
        path = directory / f"attainment_vs_rate_{name}.png"
        paths.append(_attainment_curves(name, entry, path, setting_line(results)))
    for name, entry in results["workloads"].items():
        res = kept.get(f"timeline_{name}_fluidpd")
        if res is not None:
            paths.append(_timeline(name, entry, res, directory / f"fluidpd_{name}_timeline.png"))
    return paths


def headline_bars(results: dict, path: Path) -> Path:
    """Joint attainment of every system, grouped per workload at its headline rate (the printed Table 1)."""
    groups = {
        f"{name} x{results['workloads'][name]['headline_scale']:g}": {r["system"]: r["attainment"] * 100 for r in rows}
        for name, rows in results["table1"].items()
    }
    ylabel = f"joint SLO attainment (%): TTFT <= {SLO.ttft_s:g} s, TBT <= {SLO.tbt_s * 1e3:g} ms"
    title = f"Table 1 at the headline rates: {N_WORKERS} x {GPU}, {results['setting']['model']} {DTYPE}"
    return bars_plot(groups, ylabel, path, title, figsize=(8, 4.5), legend_below=True)


def _attainment_curves(name: str, entry: dict, path: Path, setting: str) -> Path:
    runs = [entry["runs"][f"{x:g}"] for x in entry["scales"]]
    curves = {s: (entry["scales"], [r["systems"][s]["attainment"] for r in runs]) for s in SYSTEMS}
    notes = {"static-pd best": [r["best_split"] for r in runs]}
    xlabel = (
        "load multiplier of the surge and wave rates" if name == "phase_shift" else "rate scale (time compressed by x)"
    )
    return attainment_vs_rate(curves, path, f"{entry['about']}: {setting}", xlabel, notes)


def _timeline(name: str, entry: dict, res, path: Path) -> Path:
    policy = res.cluster.policy
    f = policy.fluid
    return fluid_timeline(
        policy.history,
        res.cluster.timeline,
        policy.transitions,
        path,
        f"fluidpd on {name} x{entry['headline_scale']:g}: pressure indices and worker roles",
        phases=[tuple(p) for p in entry["phases"]] if name == "phase_shift" else (),
        thresholds={"1.0": 1.0, "theta_P_high": f.theta_p_high, "theta_D_high": f.theta_d_high},
    )
