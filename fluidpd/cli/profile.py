"""`fluidpd profile`: measure the real engine on this host for the simulator (`--gpu cpu-host`).

    fluidpd profile --out profile.json                    # SmolLM2, contention up to 4 workers
    fluidpd profile --model path/to/model.gguf --workers 2 --out my-host.json
    fluidpd profile --parts contention,jitter --out profile.json   # re-measure two parts, keep the rest

Writes the step points (prefill by chunk and prior context, decode by batch and context, fused
mixed steps), step-time jitter, KV hand-off bandwidth, FluidRole's remap time and contention
between busy worker processes, then prints the step-time fit and its error on those points.
`fluidpd/specs/profiles/cpu-host.json` is such a file; `--gpu cpu-host` reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fluidpd.bench.host_profile.config import PARTS, ProfileConfig
from fluidpd.cli.serve import ENGINE_FLAGS_SKIP
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.engine.config import EngineConfig


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the real engine on this host for the simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, EngineConfig, skip=ENGINE_FLAGS_SKIP)
    add_flags(p, ProfileConfig)
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument(
        "--parts",
        type=lambda v: tuple(x for x in v.split(",") if x),
        default=PARTS,
        help=f"measure only these ({','.join(PARTS)}; default all) and keep the rest of the profile at --out",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fluidpd.bench.host_profile.measure import measure_profile
    from fluidpd.latency.profiled import fit_steps

    engine = EngineConfig(**flag_values(args, EngineConfig, skip=ENGINE_FLAGS_SKIP))
    cfg = ProfileConfig(**flag_values(args, ProfileConfig))
    base = None
    if set(args.parts) != set(PARTS):
        if not args.out.exists():
            print(f"error: --parts updates an existing profile, and {args.out} does not exist", file=sys.stderr)
            return 2
        base = json.loads(args.out.read_text())
    try:
        profile = measure_profile(engine, cfg, progress=sys.stderr.isatty(), parts=args.parts, base=base)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    fit = fit_steps(profile["steps"])
    j, kv, c = profile["jitter"], profile["kv_transfer"], profile["contention"]
    print(f"measured {', '.join(args.parts)} in {profile['measure_s']:.0f} s")
    print(f"{len(profile['steps'])} step points; fit error mean {fit.mean_rel_error:.1%}, max {fit.max_rel_error:.1%}")
    print(
        f"jitter: decode step p50 {j['p50_s'] * 1e3:.1f} ms, p99.9 {j['p999_s'] * 1e3:.1f} ms, "
        f"delta_guard {j['delta_guard_s'] * 1e3:.1f} ms"
    )
    print(
        f"KV hand-off {kv['bandwidth_Bps'] / 1e9:.2f} GB/s + {kv['latency_s'] * 1e3:.2f} ms; remap "
        f"{profile['fluidrole']['shrink_s'] * 1e3:.2f} ms"
    )
    print(
        "contention (slowdown with k busy workers): decode "
        + ", ".join(f"{x:.2f}" for x in c["decode"])
        + "; prefill "
        + ", ".join(f"{x:.2f}" for x in c["prefill"])
    )
    print(f"wrote {args.out}")
    return 0
