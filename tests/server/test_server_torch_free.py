"""The server process holds what only it needs: with the process backend it imports no torch and loads
no weights (the workers do); worker 0 sizes max_model_len and profiles the engine for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serverhelp import healthy

from fluidpd.bench.leftovers import kill_tree
from fluidpd.bench.peers.process import free_port
from fluidpd.core.memory import rss_bytes

WAIT_S = 600.0  # a hang guard on a loaded 2-core host (load, profile), never a latency bound
SERVER_MODULES = (
    "fluidpd.cli",
    "fluidpd.cli.serve",
    "fluidpd.server.app",
    "fluidpd.server.drain",
    "fluidpd.runtime.coordinator",
    "fluidpd.runtime.build",
    "fluidpd.runtime.backend",
    "fluidpd.runtime.process",
    "fluidpd.runtime.ray_worker",
    "fluidpd.runtime.transport",
)


def test_the_server_side_imports_and_configs_load_no_torch():
    code = f"""
import sys
for m in {SERVER_MODULES!r}:
    __import__(m)
from fluidpd.cli import build_parser
from fluidpd.cli.serve import configs
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.model_source import load_tokenizer
from fluidpd.runtime.worker_env import worker_environ

engine, runtime, serve = configs(build_parser().parse_args(["serve", "--workers", "1"]))
assert worker_environ(engine) is not None and engine.weight_format == "gguf" and engine.gguf_blocks
assert EngineConfig(device="cuda:1", quantization="none").weight_format == "none"
assert load_tokenizer(EngineConfig(model="smollm2-135m", load_format="dummy")) is None
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "fluidpd.engine.engine")))
assert not loaded, loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def omp_display_env() -> dict[str, str]:
    """This environment without a wait policy of its own, and libgomp asked to print its settings as it loads."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return env | {"OMP_DISPLAY_ENV": "VERBOSE"}


def spin_count(line: str) -> str:
    """The value of libgomp's `GOMP_SPINCOUNT = '0'` line ("" for any other line)."""
    return line.partition("=")[2].strip().strip("'")


def _maps(pid: int, part: str) -> bool:
    return part in Path(f"/proc/{pid}/maps").read_text()


def _maps_torch(pid: int) -> bool:
    return _maps(pid, "/torch/lib/")


@pytest.mark.slow
def test_fluidpd_serve_one_worker_keeps_torch_and_the_weights_in_the_worker(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "fluidpd.cli",
        "serve",
        "--workers",
        "1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with open(log, "w") as out:  # libgomp prints its settings where it loads: in the worker only
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=omp_display_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(1.0)
        state = httpx.get(url + "/v1/admin/cluster", timeout=30).json()
        worker = state["workers"][0]["pid"]
        assert not _maps_torch(proc.pid), "the server process mapped torch"
        assert _maps_torch(worker)
        for pid in (proc.pid, worker):  # `fluidpd serve` imports its own subcommand, not the experiments' plots
            assert not _maps(pid, "/matplotlib/"), f"process {pid} mapped matplotlib"
        assert rss_bytes(proc.pid) < 0.15 * 2**30  # 0.08 GiB (2026-12-06); 0.12 with matplotlib, 0.35 with torch
        # what the server used to measure on its probe engine, now worker 0's: the model's whole context,
        # and the profile at a worker's threads
        assert state["max_model_len"] == 8192
        p = state["profile"]
        assert set(p) == {"prefill_512_s", "decode_step_s", "prefill_batch_tokens", "threads"}
        assert p["prefill_512_s"] > p["decode_step_s"] > 0 and p["prefill_batch_tokens"] in (16, 64, 128, 256, 512)
        text = log.read_text()
        assert f"started 1 process worker(s) ({p['threads']} torch thread(s) each)" in text
        for line in ("loaded smollm2 in", "max_model_len 8192: the model's context", "profile: f_P(512) = "):
            assert line in text, text
        spins = [spin_count(line) for line in text.splitlines() if "GOMP_SPINCOUNT" in line]
        assert spins and set(spins) == {"0"}, text  # the gguf worker's OpenMP never spins
        # the server's tokenizer and the worker's engine serve a request
        r = httpx.post(
            url + "/v1/completions",
            json={"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        kill_tree(proc)


@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_in_process_workers_openmp_sleeps_as_a_process_workers_does(quantization):
    """`fluidpd serve --backend inprocess` sets OMP_WAIT_POLICY in its own process before torch loads OpenMP
    (gguf weights: the kernel's own thread pool needs the cores; float weights keep OpenMP's default),
    as read back from libgomp's report of its settings (OMP_DISPLAY_ENV): no spinning means a spin count of 0."""
    cmd = [sys.executable, "-m", "fluidpd.cli", "serve", "--backend", "inprocess", "--workers", "1",
           "--port", str(free_port()), "--quantization", quantization, "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=omp_display_env())
    try:
        assert proc.stderr is not None
        seen = next((line for line in proc.stderr if "GOMP_SPINCOUNT" in line), "")  # printed as torch loads
    finally:
        kill_tree(proc)
    spins = spin_count(seen)
    assert spins and (spins == "0") == (quantization == "gguf"), seen
