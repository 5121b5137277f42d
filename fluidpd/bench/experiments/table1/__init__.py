"""The FluidPD seed's Table 1 in simulation: SLO attainment, P99 TTFT and P99 TBT per system.

Setting (the seed's testbed): 8 x H100-SXM, one Llama-3.3-70B FP8 worker per GPU (no tensor
parallelism), step-time jitter CV 0.05 (so FluidToken's guard band is learned from measured steps),
SLO_TBT = 40 ms (the seed's interactive reading speed) and SLO_TTFT = 2 s. Why 2 s: the p99 prompt of
the Azure code trace (7,436 tokens) prefills alone in about 1.2 s on one H100 at FP8 per the roofline
latency model (`RooflineModel.prefill_time`; printed by the command), so 2 s leaves less than one
such prefill of queueing: a deadline a well-provisioned prefill pool meets and a backlogged one misses.

Workloads, each at several rate scales (time compressed by x):
  azure_code   Azure LLM inference 2023, code: bursty (10 s buckets range from 0 to ~46k prompt tok/s
               around a mean of ~5k), long prompts, short outputs. Windowed to the first 600 s.
  azure_conv   Azure conversation: steadier, shorter prompts, longer outputs. First 600 s.
  phase_shift  fluidpd.workload.phase_shift, two cycles of a summarisation surge (arXiv lengths, prompt
               >> output, 5 req/s, ~13k prompt tok/s: just under two prefill workers' ~13.8k tok/s, so
               bursts queue) then a generation wave (BWB lengths, output >> prompt, 1 req/s: ~100k
               tokens of live KV, more than four decode workers hold), the 600 s window cut into four
               150 s phases (75 s in --quick). The rate scale multiplies both rates. At x1 static
               2P:6D loses the surges (the second one worst: its queue meets a decode pool still full
               of the wave's long generations) while 4P:4D loses the waves.
Systems: colocated (vLLM-style), chunked (Sarathi-Serve, FCFS as vLLM runs it), chunked late-last
(the same with FluidPD's late-last queue order: a request already past SLO_TTFT waits behind the
rest; its budget searched under that order), static-pd 2P:6D (the seed's SGLang / vLLM P/D
baseline), static-pd at the best fixed split for that workload and rate (every split 1..7 is run;
the one with the best joint attainment is kept and named), fluidtoken and fluidpd (both starting
from 2P:6D).
Headline rates (the Table 1 printout and headline.png): azure_code x1 (as recorded), azure_conv x1.5
(the README's `make run` setting), phase_shift x1; the others feed the attainment-vs-rate curves.
Goodput (full mode): the highest azure_code rate scale with >= 90% joint attainment, fluidpd vs
distserve, chunked, chunked late-last and every static split.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fluidpd.bench.experiments.common import MODEL, WORKLOADS, check_fits
from fluidpd.bench.experiments.output import make_console, write_json
from fluidpd.bench.experiments.table1.figures import write_figures
from fluidpd.bench.experiments.table1.report import print_results, print_setting
from fluidpd.bench.experiments.table1.run import run_table1
from fluidpd.core.argtypes import names_of, positive
from fluidpd.specs.models import MODEL_NAMES

HELP = "SLO attainment, P99 TTFT and TBT of nine systems on three workloads"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="two rate scales per workload, 300 s windows, no goodput")
    p.add_argument("--out", type=Path, default=Path("results/table1"), help="directory for table1.json and PNGs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=MODEL, choices=MODEL_NAMES, help=f"one worker's model (default: {MODEL})")
    p.add_argument("--workloads", type=names_of(WORKLOADS), default=None, help=f"subset of {', '.join(WORKLOADS)}")
    p.add_argument("--scales", type=_scales, default=None, help="rate scales for every workload (overrides)")
    p.add_argument("--window", type=positive(float), default=None, help="seconds of each trace (overrides)")
    p.add_argument("--no-goodput", action="store_true", help="skip the goodput search (full mode)")
    p.add_argument(
        "--placement",
        default="auto",
        help="distserve's split (fluidtoken and fluidpd start there): auto (searched on each history window) "
        "or a fluidpd place JSON (default: auto)",
    )


def main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    check_fits(args.model)
    console = make_console()
    print_setting(console, args.model)
    results, kept = run_table1(
        args.workloads,
        quick=args.quick,
        scales=args.scales,
        window_s=args.window,
        seed=args.seed,
        goodput=False if args.no_goodput else None,
        placement=args.placement,
        model=args.model,
    )
    print_results(console, results)
    json_path = write_json(results, args.out / "table1.json")
    paths = write_figures(results, kept, args.out)
    results["command_wall_s"] = time.perf_counter() - t0
    write_json(results, json_path)
    console.print(f"wrote {json_path} and {len(paths)} PNGs in {args.out} ({results['command_wall_s']:.0f} s)")
    return 0


def _scales(text: str) -> tuple[float, ...]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one rate scale")
    return tuple(positive(float)(p.strip()) for p in parts)
