"""`fluidpd bench`: replay a trace against a running FluidPD (or any OpenAI-compatible) server.

    fluidpd serve --model smollm2 --workers 1 &
    fluidpd bench --url http://127.0.0.1:8000 --trace azure_conv --rate-scale 0.5 --duration 60 \\
                  --ttft-slo 2 --tbt-slo 0.2 --out bench.json
    fluidpd bench --url http://127.0.0.1:8000 --sessions chat --n-sessions 8 --turns 6 \\
                  --ttft-slo 5 --tbt-slo 0.5 --out sessions.json

--trace: open-loop arrivals at the trace's timestamps; prompts of the trace's exact token lengths;
the same table and JSON keys as `fluidpd simulate`. --sessions: closed-loop multi-turn chat (each
turn carries the conversation so far and the model's actual answers, sent its think time after the
previous answer), reported per turn with the server's cached prompt tokens. Loopback servers only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fluidpd.core.argtypes import positive
from fluidpd.core.knobs import add_flags, flag_values

DEFAULT_MAX_REQUESTS = 2000


def register(sub) -> None:
    from fluidpd.bench.loadgen.run import BenchConfig
    from fluidpd.bench.loadgen.session_run import SessionReplayConfig
    from fluidpd.bench.loadgen.session_source import CHAT, ChatSessionsConfig
    from fluidpd.workload.datacenter_config import DatacenterConfig
    from fluidpd.workload.registry import TRACES

    p = sub.add_parser(
        "bench",
        help="replay a trace against a running server (open loop)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 (loopback only)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--trace", help=f"open loop: one of {', '.join(TRACES)}, or a file")
    what.add_argument(
        "--sessions",
        metavar="SOURCE",
        help=f"closed-loop sessions: '{CHAT}' (generated, see the chat flags) or a trace with sessions",
    )
    p.add_argument("--rate-scale", type=positive(float), default=1.0, help="compress time by X")
    p.add_argument(
        "--duration",
        type=positive(float),
        default=60.0,
        help="replay the trace's first SEC seconds (after rate scaling; default 60)",
    )
    p.add_argument("--ttft-slo", type=positive(float), required=True, help="seconds")
    p.add_argument("--tbt-slo", type=positive(float), required=True, help="seconds")
    p.add_argument(
        "--out",
        type=Path,
        help="write the row as JSON (same keys as fluidpd simulate); --sessions: also every turn, and a PNG beside it",
    )
    p.add_argument("--max-requests", type=positive(int), default=DEFAULT_MAX_REQUESTS, help="--trace only")
    add_flags(p, BenchConfig)
    add_flags(p, SessionReplayConfig)
    add_flags(p, ChatSessionsConfig)
    add_flags(p, DatacenterConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fluidpd.bench.loadgen.run import BenchConfig, run_bench
    from fluidpd.bench.loadgen.target import check_loopback
    from fluidpd.bench.report import print_table, write_json
    from fluidpd.cli.bench_sessions import RETRIED
    from fluidpd.cli.bench_talk import talk
    from fluidpd.core.metrics import Slo
    from fluidpd.workload.registry import load_trace, trace_flags

    check_loopback(args.url)  # ValueError -> exit 2, before loading anything
    if args.sessions:
        from fluidpd.cli.bench_sessions import run_sessions_cli

        return run_sessions_cli(args)
    base = load_trace(args.trace, seed=args.seed, **trace_flags(args.trace, args))
    trace = base.shaped(args.rate_scale, args.duration, args.max_requests)
    if len(trace) == 0:
        raise ValueError("the trace window holds no requests (raise --duration or --rate-scale)")
    cfg = BenchConfig(
        url=args.url,
        trace=trace,
        slo=Slo(args.ttft_slo, args.tbt_slo),
        trace_name=str(args.trace),
        **flag_values(args, BenchConfig),
    )
    row, _ = talk(args.url, run_bench(cfg))
    title = (
        f"{args.trace} x{args.rate_scale:g}: {row['requests']} requests against {args.url} "
        f"({row['model']}), SLO TTFT {args.ttft_slo}s TBT {args.tbt_slo * 1e3:g}ms"
    )
    print_table([row], title)
    notes = []
    if row["clipped_prompts"] or row["clipped_outputs"]:
        notes.append(
            f"clipped to max_model_len {row['max_model_len']}: {row['clipped_prompts']} prompts, "
            f"{row['clipped_outputs']} outputs"
        )
    if row["failed"]:
        first = next(iter(row["errors"].items()))
        notes.append(f"{row['failed']} requests failed (counted as misses); most common: {first[1]} x {first[0]}")
    if row["retried"]:
        notes.append(f"{row['retried']} requests were sent again after a 429 ({RETRIED})")
    notes.append(f"wall {row['wall_s']:.1f}s, max send lag {row['max_send_lag_s'] * 1e3:.0f}ms")
    for n in notes:
        print(n, file=sys.stderr)
    if args.out:
        write_json([row], args.out)
    return 0
