"""`fluidpd place`: DistServe's goodput-optimised placement (Algorithms 1 and 2) for a model,
GPU, SLOs and a workload fitted to a trace window (or the window replayed).

fluidpd place --model llama-3.3-70b --gpu h100 --nodes 4 --gpus-per-node 8 \\
    --trace azure_conv --ttft-slo 2 --tpot-slo 0.1 --rate 20 --out placement.json --plot placement.png
fluidpd place --example seed      # the seed's worked example, closed-form estimator
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from fluidpd.core.argtypes import positive
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.core.metrics import Slo
from fluidpd.latency.calibration import latency_config
from fluidpd.placement.config import PlaceConfig
from fluidpd.specs.hardware import HARDWARE_NAMES, get_hardware
from fluidpd.specs.models import DTYPES, MODEL_NAMES, get_model
from fluidpd.workload.registry import TRACES, load_trace


def register(sub) -> None:
    p = sub.add_parser(
        "place",
        help="goodput-optimised P/D placement (DistServe Algorithms 1 and 2)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--example", choices=("seed",), help="run a worked example instead (the seed's, closed-form)")
    p.add_argument("--model", choices=MODEL_NAMES)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--gpu", choices=HARDWARE_NAMES)
    p.add_argument("--trace", help=f"history to fit the workload to: one of {', '.join(TRACES)}, or a file")
    p.add_argument("--start", type=float, default=0.0, help="history window start in the trace, s (default: 0)")
    p.add_argument("--duration", type=positive(float), default=None, help="history window length, s (default: all)")
    p.add_argument("--replay", action="store_true", help="replay the window's arrivals instead of fitting them")
    p.add_argument("--ttft-slo", type=positive(float), help="seconds")
    p.add_argument("--tpot-slo", type=positive(float), help="seconds")
    add_flags(p, PlaceConfig)
    p.add_argument(
        "--ray-address",
        help="measure the KV bandwidth between two nodes of this Ray cluster (auto | HOST:PORT) and place with it",
    )
    p.add_argument("--top", type=int, default=5, help="candidates shown per phase (default: 5)")
    p.add_argument("--out", type=Path, help="write the placement as JSON")
    p.add_argument("--plot", type=Path, help="goodput-per-GPU plot of the candidates (PNG)")
    p.set_defaults(func=run)


def run(args) -> int:
    from fluidpd.bench.placement_report import placement_plot, print_placement

    if args.example == "seed":
        return _seed(args)
    missing = [
        f"--{k.replace('_', '-')}" for k in ("model", "gpu", "trace", "ttft_slo", "tpot_slo") if not getattr(args, k)
    ]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (or run --example seed)")
    if args.start < 0:
        raise ValueError(f"--start must be >= 0, got {args.start}")
    config = PlaceConfig(**flag_values(args, PlaceConfig))
    trace = load_trace(args.trace)
    history = trace.window(args.start, args.duration or max(trace.duration_s - args.start, 1e-9) + 1e-6)
    from fluidpd.placement.plan import estimator, fit_history, place

    workload = fit_history(history, args.replay)
    model, hw = get_model(args.model, args.dtype), get_hardware(args.gpu)
    if args.ray_address:
        from fluidpd.runtime.ray_links import cluster_links

        links = cluster_links(args.ray_address)
        print(f"inter-node KV link: {links.describe()} (the {hw.name} spec says {hw.internode_bw / 1e9:.2f} GB/s)")
        hw = replace(hw, internode_bw=links.inter_node_bw)
    slo = Slo(args.ttft_slo, args.tpot_slo)
    with tqdm(desc="placement", unit="config", file=sys.stderr, delay=1.0, leave=False) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        placement = place(estimator(model, hw, slo, workload, config, latency_config(hw.name)), config, progress)
    print_placement(
        placement, args.top, f"{model.name} {args.dtype} on {config.nodes} x {config.gpus_per_node} {hw.name}"
    )
    if args.out:
        data = placement.to_json() | {
            "workload": workload.describe(),
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tbt_s},
        }
        _write(args.out, data)
    if args.plot:
        placement_plot(placement, args.plot)
    if not placement.fits:
        print(f"note: R needs {placement.total_gpus} GPUs, more than the cluster's {placement.cluster_gpus}")
    return 0


def _seed(args) -> int:
    from fluidpd.bench.placement_report import placement_plot, print_placement
    from fluidpd.placement.closed_form import seed_example

    results = seed_example(max(args.max_segments, 4))
    titles = {
        "algorithm1": "Algorithm 1",
        "algorithm2": "Algorithm 2",
        "algorithm2_ratios": "Algorithm 2, segment ratios per node (beyond the paper)",
    }
    for key, p in results.items():
        print_placement(p, args.top, titles[key])
    saved = results["algorithm2"].total_gpus - results["algorithm2_ratios"].total_gpus
    print(f"segment ratios save {saved} GPUs over Algorithm 2's 1:1 units on the seed's example")
    if args.out:
        _write(args.out, {k: p.to_json() for k, p in results.items()} | {"gpus_saved_by_ratios": saved})
    if args.plot:
        placement_plot(results["algorithm2_ratios"], args.plot)
    return 0


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
