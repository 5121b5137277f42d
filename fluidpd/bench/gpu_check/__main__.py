"""`python -m fluidpd.bench.gpu_check --device cuda --out DIR`: the checks, results in DIR/gpu_check.json."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fluidpd.bench.gpu_check.checks import CHECKS
from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.bench.gpu_check.run import RESULTS, run_checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fluidpd.bench.gpu_check", description=__doc__)
    ap.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (the dry run, with --tiny)")
    ap.add_argument("--out", type=Path, required=True, help="results: gpu_check.json and the measured profile")
    ap.add_argument("--work", type=Path, default=Path("/tmp/fluidpd-gpu-check"), help="scratch (written models)")
    ap.add_argument("--tiny", action="store_true", help="the dry run's shapes (seconds on a CPU)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="the whole run's time (a GPU lease is 10 min)")
    ap.add_argument("--only", nargs="+", default=list(CHECKS.names()), choices=CHECKS.names())
    args = ap.parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"error: --device {args.device} but torch sees no GPU", file=sys.stderr)
            return 2
    ctx = CheckContext(args.device, args.out, args.work, args.tiny, time.monotonic() + args.budget_s)
    record = run_checks(ctx, tuple(args.only))
    failed = [n for n, r in record["checks"].items() if not r.get("ok")]
    print(f"gpu check on {args.device}: {len(record['checks']) - len(failed)} of {len(record['checks'])} checks "
          f"passed{' (failed: ' + ', '.join(failed) + ')' if failed else ''}; {args.out / RESULTS}")  # fmt: skip
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
