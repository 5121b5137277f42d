"""steps: prefill and decode step times of the 8B shape on this GPU, measured by `fluidpd profile`'s
machinery (CUDA-synchronised steps, medians of a few repeats after a warm-up), each against what the
simulator's latency model for this GPU predicts for it: the roofline with the GPU's calibration, as
`--gpu h100` simulates it (not fitted to these points: this is its first fidelity figure on a GPU).
The same measurements are the measured profile, `<kind>-measured.json` in the results: shipped in
fluidpd/specs/profiles/, the simulator runs `--gpu <kind>-measured` on it.

The dry run (--tiny, on the CPU) measures the tiny shape on a tiny grid through the same code, and
compares it with the 8B on an H100 (numbers without meaning, labelled dry_run).
"""

from __future__ import annotations

import json
import math
import time

from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.bench.host_profile.config import GPU_PARTS, ProfileConfig, gpu_config

MODEL = "llama-3.1-8b"  # the simulator's name of the shape measured on the GPU
# the dry run: a few small points of each kind, in seconds on a CPU
TINY = dict(
    repeats=3,
    chunks=(16, 64, 256),
    priors=(0, 64),
    batches=(1, 4, 16),
    contexts=(32, 128),
    max_decode_tokens=2048,
    mixed_chunks=(32,),
    mixed_batches=(4,),
    mixed_context=128,
    jitter_steps=20,
    transfer_tokens=(32, 128),
    transfer_repeats=3,
    step_tokens=64,
)
RESERVE_S = 30.0  # of the budget, kept for what follows the step points (jitter, hand-off, remap, writing)


def check(ctx: CheckContext) -> dict:
    from fluidpd.bench.gpu_check.synthetic import write_checkpoint
    from fluidpd.bench.host_profile.measure import measure_profile
    from fluidpd.engine.config import EngineConfig

    t0 = time.monotonic()
    shape = "tiny" if ctx.tiny else MODEL
    path = write_checkpoint(ctx.work / shape, shape, device=ctx.device)
    kind, gpu = gpu_kind(ctx.device)
    ctx.release_device()
    # bfloat16 on the CPU too: the dry run takes the GPU's path (page gathers + SDPA, torch layer ops)
    engine = EngineConfig(
        model=str(path), device=ctx.device, dtype="bfloat16", max_model_len=None if ctx.tiny else 16384
    )
    cfg = ProfileConfig(**TINY) if ctx.tiny else gpu_config(repeats=3, jitter_steps=200, transfer_repeats=5)
    deadline = time.monotonic() + ctx.left_s() - (5.0 if ctx.tiny else RESERVE_S)
    profile = measure_profile(engine, cfg, progress=False, parts=GPU_PARTS, deadline=deadline, keep_going=True)
    ctx.release_device()
    profile["gpu_check"] = {"kind": kind, "dry_run": not ctx.on_gpu, "shape": shape}
    rows = compare(profile["steps"], kind)
    points = [r for r in rows if r["kind"] != "mixed"]
    result = {
        "ok": _ok(points) and not profile.get("failed_parts"),
        "dry_run": not ctx.on_gpu,
        "kind": kind,
        "gpu": gpu,
        "model": MODEL if ctx.on_gpu else f"{shape} (predicted as {MODEL})",
        "predicted_by": f"RooflineModel({MODEL}, {kind}, latency_config({kind!r}))",
        "points": points,
        "mixed_points": [r for r in rows if r["kind"] == "mixed"],
        "summary": {k: summarise(rows, k) for k in ("prefill", "decode", "mixed")},
        "skipped": skipped(cfg, profile),
        "failed_parts": profile.get("failed_parts", {}),
        "grid": {k: profile["config"][k] for k in ("chunks", "priors", "batches", "contexts", "max_decode_tokens")},
        "setup_s": round(time.monotonic() - t0 - profile["measure_s"], 1),  # checkpoint, model load
        "measure_s": round(profile["measure_s"], 1),
    }
    result |= _write_profile(ctx, profile, kind)
    return result


def gpu_kind(device: str) -> tuple[str, str]:
    """The catalogue GPU (fluidpd.specs.hardware) this device is, and its name; the dry run's is h100."""
    if not device.startswith("cuda"):
        return "h100", "cpu (dry run: predicted as h100)"
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    for tag, kind in (("H200", "h200"), ("H100", "h100"), ("A100", "a100-80g")):
        if tag in name.upper():
            return kind, name
    return "h100", f"{name} (not in the catalogue: predicted as h100)"


def compare(steps: list[dict], kind: str) -> list[dict]:
    """Each measured step point beside the simulator's prediction of it (the 8B on `kind`)."""
    from fluidpd.latency.calibration import latency_config
    from fluidpd.latency.roofline import RooflineModel
    from fluidpd.latency.shape import StepShape
    from fluidpd.specs.hardware import get_hardware
    from fluidpd.specs.models import get_model

    roofline = RooflineModel(get_model(MODEL), get_hardware(kind), config=latency_config(kind))
    rows = []
    for p in steps:
        s = p["shape"]
        row: dict = {"kind": p["kind"]}
        if s["prefill_tokens"]:
            row |= {"tokens": s["prefill_tokens"], "prior": s["prefill_kv_read"]}
        if s["decode_tokens"]:
            row |= {"batch": s["decode_tokens"], "context": round(s["decode_ctx"] / s["decode_tokens"])}
        # a prefill alone is prefill_time(tokens, prior); a decode alone decode_time(batch, context)
        predicted = roofline.step_time(StepShape(**s))
        row |= {"measured_s": p["seconds"], "predicted_s": predicted, "error": predicted / p["seconds"] - 1}
        rows.append(row)
    return rows


def skipped(cfg: ProfileConfig, profile: dict) -> list[dict]:
    """The grid's points that were not measured, and why: past the KV budget the GPU's memory
    allowed (its decode batches), past the time budget, or failed (out of memory)."""
    from dataclasses import replace

    from fluidpd.bench.host_profile.steps import step_grid

    limit, budget = profile["model"]["max_model_len"] - 2, profile["config"]["max_decode_tokens"]
    kept = step_grid(replace(cfg, max_decode_tokens=budget), limit)
    over = [p | {"why": f"over the KV budget ({budget} tokens)"} for p in step_grid(cfg, limit) if p not in kept]
    return over + profile.get("steps_skipped", [])


def summarise(rows: list[dict], kind: str) -> dict:
    """Mean and max |predicted / measured - 1| of the points of `kind`."""
    errors = [abs(r["error"]) for r in rows if r["kind"] == kind]
    if not errors:
        return {"points": 0}
    return {"points": len(errors), "mean_abs_error": sum(errors) / len(errors), "max_abs_error": max(errors)}


def _ok(points: list[dict]) -> bool:
    kinds = {p["kind"] for p in points}
    finite = all(
        math.isfinite(p[k]) and (k == "error" or p[k] > 0)
        for p in points
        for k in ("measured_s", "predicted_s", "error")
    )
    return kinds == {"prefill", "decode"} and finite


def _write_profile(ctx: CheckContext, profile: dict, kind: str) -> dict:
    """The measured profile as `<kind>-measured.json` in the results, with its step fit's error."""
    from fluidpd.latency.profiled import fit_steps

    if len(profile["steps"]) < 8 or profile.get("failed_parts"):
        why = f"{len(profile['steps'])} step points (a fit needs 8); failed parts: {profile.get('failed_parts', {})}"
        return {"profile": None, "profile_error": why}
    fit = fit_steps(profile["steps"])
    path = ctx.out / f"{kind}-measured.json"
    path.write_text(json.dumps(profile, indent=1) + "\n")
    return {
        "profile": path.name,
        "profile_fit": {"mean_rel_error": fit.mean_rel_error, "max_rel_error": fit.max_rel_error},
    }
