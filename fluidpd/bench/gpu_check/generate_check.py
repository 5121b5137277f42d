"""`generate`: `fluidpd generate --device D` on a random-weight Llama-3.1-8B (written on the spot by
`synthetic.write_checkpoint`) against transformers' greedy tokens from the same directory on the same
device, both in bfloat16.

Random weights give near-flat logits (the 8B's are about N(0, 1.3) over 128,256 ids, the top one
near 5.6: the top two differ by ~0.26 on average, often by far less), so two correct bfloat16
implementations may break a near-tie differently. The lists pass when they are equal, or when they
first differ at a step where transformers' own logits put our token within `TIE_ULPS` bfloat16 ulps
of their top one (its top-2 margin there is then under that too; both are recorded). Why 4 ulps:
each side rounds its logits to bfloat16 (half an ulp each: up to one ulp between them from that
alone), and the two round the residual stream at different points (fused norms, attention kernels,
GEMM splits), relative errors of a few 2^-8 over 32 layers, which by estimate move a logit of this
flat distribution by ~0.01-0.05, about one ulp (1/32 for a top logit in [4, 8)). A flip within 4
ulps (0.125 there) is a tie broken by rounding; one beyond is a wrong token. After a flip the two
continue from different contexts: nothing later is compared."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fluidpd.bench.gpu_check import synthetic
from fluidpd.bench.gpu_check.context import CheckContext

PROMPT = "FluidPD on a GPU is"  # 19 bytes: with BOS, 20 tokens of the byte-level vocabulary
MAX_TOKENS = 32
TIE_ULPS = 4
_STATS = re.compile(r"\[load ([\d.]+)s, .* in ([\d.]+)s")


def check(ctx: CheckContext) -> dict:
    shape = "tiny" if ctx.tiny else "llama-3.1-8b"
    reused = (ctx.work / shape / synthetic.DONE).is_file()
    t0 = time.monotonic()
    path = synthetic.write_checkpoint(ctx.work / shape, shape, device=ctx.device)
    write_s, size = time.monotonic() - t0, (path / synthetic.WEIGHTS).stat().st_size
    ctx.release_device()  # the drawing's cached blocks: the engine's process needs the memory
    result: dict[str, Any] = {"shape": shape, "write_s": round(write_s, 2), "reused": reused}
    result |= {"checkpoint_bytes": size, "write_gb_per_s": None if reused else round(size / 1e9 / write_s, 2)}
    try:
        ours = fluidpd_generate(path, ctx.device, timeout_s=max(ctx.left_s() - 30.0, 10.0))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the write's figures still count
        return {"ok": False, **result, "error": f"{type(exc).__name__}: {exc}"}
    result |= {k: ours[k] for k in ("load_s", "generate_s", "engine_wall_s", "finish_reason")}
    ref = transformers_greedy(path, ctx.device, ours["prompt_token_ids"], MAX_TOKENS, ours["token_ids"])
    ctx.release_device()
    result |= {"transformers_load_s": ref["load_s"], "transformers_generate_s": ref["generate_s"]}
    result |= compare(ours["token_ids"], ref)
    return {"ok": result.pop("ok"), **result, "prompt_tokens": len(ours["prompt_token_ids"])}


def fluidpd_generate(path: Path, device: str, timeout_s: float) -> dict[str, Any]:
    """`fluidpd generate --json` in a subprocess (greedy, EOS ignored, bfloat16 weights and KV): its
    JSON, with the load and generate times its --stats line gives."""
    cmd = [sys.executable, "-m", "fluidpd.cli", "generate", "--model", str(path), "--device", device]
    cmd += ["--dtype", "bfloat16", "--kv-cache-dtype", "bfloat16", "--prompt", PROMPT]
    cmd += ["--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--ignore-eos", "--max-model-len", "256"]
    cmd += ["--json", "--stats"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = round(time.monotonic() - t0, 2)
    if proc.returncode != 0:
        raise RuntimeError(f"fluidpd generate exited {proc.returncode}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = _STATS.search(proc.stderr)
    times = {"load_s": float(stats[1]), "generate_s": float(stats[2])} if stats else {}
    return {"load_s": None, "generate_s": None, **out, **times, "engine_wall_s": wall}


def transformers_greedy(path: Path, device: str, prompt_ids: list[int], n: int, ours: list[int]) -> dict[str, Any]:
    """Transformers' model from `path` on `device` in bfloat16: `n` greedy tokens after `prompt_ids`
    (no EOS stop), and at each step its top logit, its top-2 margin and its logit of `ours`' token."""
    import torch
    import transformers

    t0 = time.monotonic()
    auto: Any = transformers.AutoModelForCausalLM  # (its from_pretrained's typing trips mypy)
    # straight onto the GPU where accelerate is there to place it; else loaded on the host and moved
    placed = {"device_map": device} if device != "cpu" and importlib.util.find_spec("accelerate") else {}
    model = auto.from_pretrained(str(path), dtype=torch.bfloat16, **placed)
    try:
        model = model.to(device).eval()
        _sync(device)
        t1 = time.monotonic()
        ref = _greedy(model, torch.tensor([prompt_ids], device=device), n, ours)
        _sync(device)
        t2 = time.monotonic()
    finally:
        del model  # the caller gives its memory back (ctx.release_device)
    return {**ref, "load_s": round(t1 - t0, 2), "generate_s": round(t2 - t1, 2)}


def _greedy(model: Any, ids: Any, n: int, ours: list[int]) -> dict[str, list]:
    import torch

    ref: dict[str, list] = {"token_ids": [], "tops": [], "margins": [], "ours_logits": []}
    # transformers renamed past_key_values to cache (5.2x); 5.17 has only the old name
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        for step in range(n):
            logits = out.logits[0, -1].float()
            top2 = logits.topk(2).values.tolist()
            ref["token_ids"].append(int(logits.argmax()))
            ref["tops"].append(top2[0])
            ref["margins"].append(top2[0] - top2[1])
            ref["ours_logits"].append(float(logits[ours[step]]) if step < len(ours) else None)
            if step + 1 < n:
                nxt = torch.tensor([[ref["token_ids"][-1]]], device=ids.device)
                out = model(nxt, use_cache=True, **{key: getattr(out, key)})
    return ref


def compare(ours: list[int], ref: dict[str, Any]) -> dict[str, Any]:
    """Equal lists pass; else the first step where they differ passes only as a near-tie of
    transformers' logits there: its top logit over its logit of our token (the gap; its top-2
    margin at most) no more than TIE_ULPS bfloat16 ulps of the top logit."""
    theirs = ref["token_ids"]
    n = max(len(ours), len(theirs))
    first = next((i for i in range(n) if i >= len(ours) or i >= len(theirs) or ours[i] != theirs[i]), None)
    result: dict[str, Any] = {"tokens": len(ours), "equal": first is None, "first_diff": first, "margin": None}
    result |= {"min_margin": round(min(ref["margins"]), 5) if ref["margins"] else None}
    result |= {"fluidpd_ids": ours, "transformers_ids": theirs}
    if first is None:
        return {"ok": len(ours) == MAX_TOKENS, **result}
    if first >= len(ours) or first >= len(theirs):  # one stopped early: not a tie
        return {"ok": False, **result}
    tol, gap = TIE_ULPS * bf16_ulp(ref["tops"][first]), ref["tops"][first] - ref["ours_logits"][first]
    result |= {"margin": round(ref["margins"][first], 5), "gap": round(gap, 5), "tolerance": tol}
    result |= {"fluidpd_token": ours[first], "transformers_token": theirs[first]}
    return {"ok": gap <= tol, **result}


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 values (8 significant bits) around `x`."""
    if x == 0 or not math.isfinite(x):
        return 0.0
    return math.ldexp(1.0, math.frexp(abs(x))[1] - 8)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
