"""FluidPD at scale in simulation: Table 1's deployable systems on 8, 64, 256 and 1,024 GPUs.

Setting: Table 1's worker (one Llama-3.3-70B FP8 per H100, step jitter CV 0.05, SLO TTFT 2 s / TBT
40 ms), 8 GPUs a node (KV hand-offs between nodes cross the NIC), a host KV tier pooled per node
(64 GiB a worker). Every size is offered the same load per GPU: the datacenter generator
(`fluidpd.workload.datacenter`) drawing from the Azure code trace at 0.32 req/s per GPU (Table 1's
headline, azure_code as recorded on 8 GPUs), one independent user population (its own arrival
process, sessions and system prompts) per 8 GPUs, under the daily cycle. A small cluster's window
is stretched until it holds 10,000 requests (one population is as bursty as the trace: two minutes
of it measure the burst, not the system), so 8 GPUs are evaluated over about 65 minutes. No time compression: at
1,024 GPUs 328 req/s come from 128 populations, not one hour squeezed into seconds.

Tuning (as Table 1, on history only): the DistServe split and chunked's token budget are searched on
the 8-GPU cluster's history (another draw of the same generator, another seed) and kept as shares
at every size; static-pd 2P:6D keeps the seed's quarter of prefill workers. fluidtoken, fluidpd and
fluidpd-pools start from the tuned split.

Reported per size and system: joint and strict attainment, P99 TTFT and TBT, goodput per GPU
(requests meeting both SLOs per second, per GPU), role switches per hour, KV bytes moved and the
part that crossed nodes, and the control plane's CPU per 10 ms cycle (thread CPU of the policy's
tick, with the period's routes and hand-offs). Goal (issue 54): fluidpd's goodput per GPU at 1,024
GPUs within 5% of its value at 8.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fluidpd.bench.experiments.output import make_console, write_json
from fluidpd.bench.experiments.scale.figures import write_figures
from fluidpd.bench.experiments.scale.report import headline, print_results
from fluidpd.bench.experiments.scale.run import (
    GPUS,
    QUICK_GPUS,
    QUICK_MIN_REQUESTS,
    QUICK_WINDOW_S,
    SYSTEMS,
    ScaleSetting,
    run_scale,
)
from fluidpd.core.argtypes import names_of, positive
from fluidpd.workload.datacenter_config import SOURCES

HELP = "Table 1's systems on 8 to 1,024 GPUs at the same load per GPU: goodput per GPU, control-plane CPU"


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ScaleSetting()
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_GPUS} GPUs, {QUICK_WINDOW_S:g} s windows (at least {QUICK_MIN_REQUESTS:,} requests)",
    )
    p.add_argument("--gpus", type=_sizes, default=None, help=f"cluster sizes, comma-separated (default {GPUS})")
    p.add_argument("--systems", type=names_of(SYSTEMS, "system"), default=None, help=f"subset of {', '.join(SYSTEMS)}")
    p.add_argument("--window", type=positive(float), default=None, help=f"seconds evaluated (default {d.window_s:g})")
    p.add_argument(
        "--min-requests",
        type=positive(int),
        default=None,
        help=f"a smaller cluster's window holds at least this many (default {d.min_requests:,})",
    )
    p.add_argument("--source", default=d.source, choices=SOURCES, help="the real trace the populations draw from")
    p.add_argument("--rate-per-gpu", type=positive(float), default=d.rate_per_gpu, help="offered req/s per GPU")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", type=Path, default=Path("results/scale"), help="directory for scale.json and PNGs")


def main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    console = make_console()
    window = args.window or (QUICK_WINDOW_S if args.quick else ScaleSetting().window_s)
    least = args.min_requests or (QUICK_MIN_REQUESTS if args.quick else ScaleSetting().min_requests)
    setting = ScaleSetting(args.source, args.rate_per_gpu, window, least, args.seed)
    gpus = args.gpus or (QUICK_GPUS if args.quick else GPUS)
    results = run_scale(tuple(gpus), setting, args.systems)
    print_results(console, results)
    path = write_json(results, args.out / "scale.json")
    pngs = write_figures(results, args.out)
    results["command_wall_s"] = time.perf_counter() - t0
    write_json(results, path)
    console.print(f"wrote {path} and {len(pngs)} PNGs in {args.out} ({results['command_wall_s']:.0f} s)")
    console.print(headline(results))
    return 0


def _sizes(text: str) -> tuple[int, ...]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one cluster size")
    sizes = tuple(positive(int)(p.strip()) for p in parts)
    if min(sizes) < 2:
        raise argparse.ArgumentTypeError("a cluster needs at least 2 GPUs (one of each role)")
    return sizes
