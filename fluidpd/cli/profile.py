"""`fluidpd profile`: measure the real engine on this host for the simulator (`--gpu cpu-host`), or
on one GPU (`--gpu h100-measured`).

    fluidpd profile --out profile.json                    # SmolLM2, contention up to 4 workers
    fluidpd profile --model path/to/model.gguf --workers 2 --out my-host.json
    fluidpd profile --parts contention,jitter --out profile.json   # re-measure two parts, keep the rest
    fluidpd profile --device cuda --model DIR --max-model-len 16384 --out fluidpd/specs/profiles/h100-measured.json

Writes the step points (prefill by chunk and prior context, decode by batch and context, fused
mixed steps), step-time jitter, KV hand-off bandwidth, FluidRole's remap time and contention
between busy worker processes, then prints the step-time fit and its error on those points.
`fluidpd/specs/profiles/cpu-host.json` is such a file; `--gpu cpu-host` reads it.

On a GPU (`--device cuda`, a safetensors directory of a catalogue model's shape, e.g.
Llama-3.1-8B's, in bfloat16) the grid is one GPU's (chunks to 8k tokens, decode batches to 256 at
contexts to 4k, as many as fit in 60% of the memory left beside the weights; --max-model-len 16384
adds the 8k chunks after 4k of context) and the parts are steps, jitter, kv_transfer and fluidrole:
dispatch and contention (between CPU worker processes) are left neutral and marked not measured.
Saved as `fluidpd/specs/profiles/<gpu>-measured.json` (h100, h200, a100-80g), it is `--gpu
<gpu>-measured` to the simulator: step times from the profile's fit, the GPU's memory from the profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fluidpd.bench.host_profile.config import GPU_PARTS, PARTS, REQUIRED_PARTS, ProfileConfig, gpu_config
from fluidpd.cli.serve import ENGINE_FLAGS_SKIP
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.engine.config import EngineConfig, device_type


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the real engine on this host (or one GPU) for the simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, EngineConfig, skip=ENGINE_FLAGS_SKIP)
    add_flags(p, ProfileConfig, max_decode_tokens=None)  # None: the device's grid decides
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument(
        "--parts",
        type=lambda v: tuple(x for x in v.split(",") if x),
        default=None,
        help=f"measure only these ({','.join(PARTS)}; default all, on a GPU {','.join(GPU_PARTS)}) "
        "and keep the rest of the profile at --out",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fluidpd.bench.host_profile.measure import measure_profile

    engine = EngineConfig(**flag_values(args, EngineConfig, skip=ENGINE_FLAGS_SKIP))
    gpu = device_type(engine.device) == "cuda"
    knobs = {k: v for k, v in flag_values(args, ProfileConfig).items() if v is not None}
    cfg = gpu_config(**knobs) if gpu else ProfileConfig(**knobs)
    parts = args.parts or (GPU_PARTS if gpu else PARTS)
    base = None
    if set(parts) != set(PARTS):
        if args.out.exists():
            base = json.loads(args.out.read_text())
        elif not set(REQUIRED_PARTS) <= set(parts):
            print(f"error: --parts updates an existing profile, and {args.out} does not exist", file=sys.stderr)
            return 2
    try:
        profile = measure_profile(engine, cfg, progress=sys.stderr.isatty(), parts=parts, base=base)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    report(profile, parts)
    print(f"wrote {args.out}")
    return 0


def report(profile: dict, parts: tuple[str, ...]) -> None:
    """What was measured, in a few lines: the step fit's error, jitter, hand-off, remap, contention."""
    from fluidpd.latency.profiled import fit_steps

    fit = fit_steps(profile["steps"])
    j, kv, c = profile["jitter"], profile["kv_transfer"], profile["contention"]
    print(f"measured {', '.join(parts)} in {profile['measure_s']:.0f} s on {profile['device']['name']}")
    print(f"{len(profile['steps'])} step points; fit error mean {fit.mean_rel_error:.1%}, max {fit.max_rel_error:.1%}")
    print(
        f"jitter: decode step p50 {j['p50_s'] * 1e3:.1f} ms, p99.9 {j['p999_s'] * 1e3:.1f} ms, "
        f"delta_guard {j['delta_guard_s'] * 1e3:.1f} ms"
    )
    print(
        f"KV hand-off {kv['bandwidth_Bps'] / 1e9:.2f} GB/s + {kv['latency_s'] * 1e3:.2f} ms; remap "
        f"{profile['fluidrole']['shrink_s'] * 1e3:.2f} ms"
    )
    if "not_measured" in c:
        print("contention: not measured (neutral)")
        return
    print(
        "contention (slowdown with k busy workers): decode "
        + ", ".join(f"{x:.2f}" for x in c["decode"])
        + "; prefill "
        + ", ".join(f"{x:.2f}" for x in c["prefill"])
    )
