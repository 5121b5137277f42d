"""The `engine` check: the engine's device test subset (`tests/engine/test_engine_on_device.py --device D`,
tiny random-weight models only) in a pytest subprocess, its JUnit report read back.

The run loads the repository's conftests on the way to the test file: tests/conftest.py imports
tests/doc_examples.py and tests/served.py, whose module level needs only the standard library and pytest
(their servers start in session fixtures, only where a test asks for one), and tests/engine/conftest.py,
which imports torch and the engine and loads SmolLM2 only in fixtures these tests do not use. So the
GPU machine, which has no SmolLM2, runs them as the suite does; the check's dry run on the CPU proves it.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from fluidpd.bench.gpu_check.context import CheckContext

ROOT = Path(__file__).resolve().parents[3]  # the repository (tests/ beside fluidpd/)
TESTS = "tests/engine/test_engine_on_device.py"
LIMIT_S = 180.0  # the subset takes seconds; most of this is CUDA's and transformers' start
MIN_S = 10.0  # below this, do not start it


def check(ctx: CheckContext) -> dict:
    """{"ok": every test ran and passed (at least one), "passed": n, "failed": ["name: message"],
    "skipped": n, "tests": [names]}; "output_tail" (pytest's last lines) where it is not ok."""
    ctx.work.mkdir(parents=True, exist_ok=True)
    report = ctx.work / "engine.xml"
    report.unlink(missing_ok=True)
    timeout = min(LIMIT_S, ctx.left_s())
    empty: dict = {"ok": False, "passed": 0, "failed": [], "skipped": 0, "tests": []}
    if timeout < MIN_S:
        return empty | {"error": f"{ctx.left_s():.0f} s left of the run: the engine tests were not started"}
    cmd = [sys.executable, "-m", "pytest", TESTS, "--device", ctx.device, "-q", "-p", "no:cacheprovider",
           "--junitxml", str(report)]  # fmt: skip
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return empty | {"error": f"pytest ran past {timeout:.0f} s", "output_tail": _tail(exc.stdout, exc.stderr)}
    output = _tail(res.stdout, res.stderr)
    if not report.is_file():
        return empty | {"error": f"pytest exited {res.returncode} without a report", "output_tail": output}
    result = read_junit(report)
    result["returncode"] = res.returncode
    result["ok"] = res.returncode == 0 and result["passed"] > 0 and result["passed"] == len(result["tests"])
    if not result["ok"]:
        result["output_tail"] = output
    return result


def read_junit(path: Path) -> dict:
    """passed / failed / skipped / tests of a pytest JUnit XML report (an error, in setup, teardown or
    collection, counts as a failure)."""
    passed, skipped, failed, tests = 0, 0, [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name") or case.get("classname") or "?"
        tests.append(name)
        bad = case.find("failure")
        bad = case.find("error") if bad is None else bad
        if bad is not None:
            failed.append(f"{name}: {_first_line(bad.get('message') or bad.text or '')}")
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return {"passed": passed, "failed": failed, "skipped": skipped, "tests": tests}


def _first_line(text: str, limit: int = 300) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _tail(*streams: str | bytes | None, limit: int = 4000) -> str:
    """The last `limit` characters of the streams together (a timeout hands back bytes, or nothing)."""
    text = "".join(s.decode(errors="replace") if isinstance(s, bytes) else s or "" for s in streams)
    return text[-limit:]
