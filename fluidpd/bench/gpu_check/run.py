"""Run the checks in order, each recorded whatever it raises, into one JSON file."""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from pathlib import Path

from fluidpd.bench.gpu_check.checks import CHECKS
from fluidpd.bench.gpu_check.context import CheckContext

RESULTS = "gpu_check.json"


def device_facts(device: str) -> dict:
    """The machine the run saw: Python, torch, and the device as `fluidpd profile` records it (a GPU's
    name, memory and multiprocessors)."""
    import torch

    from fluidpd.bench.host_profile.measure import device_facts as device_record

    record = device_record(device)
    return {"python": platform.python_version(), "torch": torch.__version__, "device": device, "record": record}


def run_checks(ctx: CheckContext, names: tuple[str, ...]) -> dict:
    """Every check of `names` in order; the results file is rewritten after each, so a run cut
    short still leaves what it measured. A failed imports check ends the run."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    record: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tiny": ctx.tiny, "checks": {}}
    for name in names:
        t0 = time.monotonic()
        print(f"gpu check {name} ({ctx.left_s():.0f} s left) ...", file=sys.stderr, flush=True)
        try:
            if name != "imports" and "facts" not in record:
                record["facts"] = device_facts(ctx.device)
            result = CHECKS.get(name)(ctx)
        except Exception as exc:  # one check's failure is a result, not the end of the run
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result["seconds"] = round(time.monotonic() - t0, 1)
        record["checks"][name] = result
        if name == "imports" and not result.get("ok"):  # nothing after it can be trusted to run
            record["checks"] |= {n: {"ok": False, "skipped": "imports failed"} for n in names if n != name}
            break
        print(f"gpu check {name}: {'ok' if result.get('ok') else 'FAILED'} in {result['seconds']} s",
              file=sys.stderr, flush=True)  # fmt: skip
        (ctx.out / RESULTS).write_text(json.dumps(record, indent=1) + "\n")
    record["ok"] = all(r.get("ok") for r in record["checks"].values())
    (ctx.out / RESULTS).write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_results(out: Path) -> dict:
    return json.loads((out / RESULTS).read_text())
