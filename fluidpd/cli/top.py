"""`fluidpd top`: a live view of a running FluidPD server, refreshed from its admin API.

    fluidpd top                                  # the server `make run` starts (127.0.0.1:8000)
    fluidpd top --url http://host:8000 --api-key KEY
    fluidpd top --once                           # one frame to stdout (scripts, logs)

One row per worker (role and the switch under way, running and waiting requests, KV used and
cached, prefix hit rate, decode step time, tokens/s, FluidToken chunks borrowed); PPI and DPI with
their last two minutes; TTFT, TBT and SLO attainment over the last minute; the last role switches
and worker failures. Ctrl-C quits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from fluidpd.core.argtypes import positive


def register(sub) -> None:
    p = sub.add_parser(
        "top",
        help="a live view of a running server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    p.add_argument(
        "--api-key", default=None, help="its admin key (default: env FLUIDPD_ADMIN_KEY, else FLUIDPD_API_KEY)"
    )
    p.add_argument("--interval", type=positive(float), default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from fluidpd.cli.top_view import TopError, fetch, render

    key = args.api_key or os.environ.get("FLUIDPD_ADMIN_KEY") or os.environ.get("FLUIDPD_API_KEY")
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no terminal width to fit, so no truncated columns
        console = Console(width=max(console.width, 200))
    try:
        snap = fetch(args.url, key)
    except TopError as exc:
        print(f"fluidpd top: {exc}", file=sys.stderr)
        return 1
    prev = None
    if args.once:  # two answers an interval apart: the rates need both
        time.sleep(args.interval)
        try:
            prev, snap = snap, fetch(args.url, key)
        except TopError as exc:
            print(f"fluidpd top: {exc}", file=sys.stderr)
            return 1
        console.print(render(snap, prev))
        return 0
    try:
        with Live(render(snap), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(args.interval)
                try:
                    new = fetch(args.url, key)
                except TopError as exc:
                    live.update(render(snap, prev, error=str(exc)))
                    continue
                prev, snap = snap, new
                live.update(render(snap, prev))
    except KeyboardInterrupt:
        pass
    return 0
