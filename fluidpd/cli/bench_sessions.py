"""`fluidpd bench --sessions`: closed-loop multi-turn sessions against a server, reported per turn."""

from __future__ import annotations

import argparse
import json
import sys


def run_sessions_cli(args: argparse.Namespace) -> int:
    from fluidpd.bench.loadgen.run import BenchConfig
    from fluidpd.bench.loadgen.session_run import SessionReplayConfig, run_sessions
    from fluidpd.bench.loadgen.session_source import ChatSessionsConfig, session_trace
    from fluidpd.bench.loadgen.turn_plot import turns_plot
    from fluidpd.bench.report import print_table
    from fluidpd.cli.bench_talk import talk
    from fluidpd.core.knobs import flag_values
    from fluidpd.core.metrics import Slo
    from fluidpd.workload.registry import trace_flags

    replay = SessionReplayConfig(**flag_values(args, SessionReplayConfig))
    chat = ChatSessionsConfig(**flag_values(args, ChatSessionsConfig))
    trace = session_trace(args.sessions, chat, replay.n_sessions, args.seed, **trace_flags(args.sessions, args))
    cfg = BenchConfig(
        url=args.url,
        trace=trace,
        slo=Slo(args.ttft_slo, args.tbt_slo),
        trace_name=str(args.sessions),
        **flag_values(args, BenchConfig),
    )
    report = talk(args.url, run_sessions(cfg, replay))
    row = report.row
    title = (
        f"{args.sessions}: {row['sessions']} sessions, {row['requests']} turns against {args.url} ({row['model']}), "
        f"SLO TTFT {args.ttft_slo}s TBT {args.tbt_slo * 1e3:g}ms"
    )
    print_table([row, *report.turns], title)
    print_hits(report.turns, row)
    for note in report.notes:
        print(note, file=sys.stderr)
    if row["retried"]:
        print(f"{row['retried']} turns were sent again after a 429 ({RETRIED})", file=sys.stderr)
    if row["failed"]:
        first = next(iter(row["errors"].items()), ("?", 0))
        print(f"{row['failed']} turns failed (misses); most common: {first[1]} x {first[0]}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.as_json(), indent=2, default=float) + "\n")
        png = turns_plot({row["policy"]: report.turns}, args.out.with_suffix(".png"), title)
        print(f"wrote {args.out} and {png}", file=sys.stderr)
    return 0


RETRIED = "--retries: their TTFT counts from the first send"


def print_hits(turns: list[dict], row: dict) -> None:
    """Per turn: prompt and cached tokens and the hit rate the server reported."""
    for t in turns:
        print(
            f"turn {t['turn']}: {t['requests']} sent, TTFT p50 {t['ttft_p50_s']:.3f}s p95 {t['ttft_p95_s']:.3f}s, "
            f"cached {t['cached_tokens']} of {t['prompt_tokens']} prompt tokens ({t['hit_rate']:.1%})"
        )
    print(
        f"turns 2+: TTFT p50 {row['turn2_ttft_p50_s']:.3f}s p95 {row['turn2_ttft_p95_s']:.3f}s, "
        f"hit rate {row['turn2_hit_rate']:.1%}; output {row['throughput_tok_s']:.1f} tok/s"
    )
