"""`fluidpd bench`: loopback guard, exact-length prompts with clipping, aggregates, and a real run
against `fluidpd serve` (SmolLM2 on CPU) started as a subprocess."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from fluidpd.cli import main
from fluidpd.core.metrics import Slo
from fluidpd.workload.trace import Trace

pytest.importorskip("httpx")

ROW_KEYS = {
    "policy",
    "requests",
    "completed",
    "attainment",
    "strict_attainment",
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p99_s",
    "tpot_mean_s",
    "throughput_tok_s",
    "wall_s",
}


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.3.2.1:1/v1", "http://localhost:8000/", "http://[::1]:8000"]
)
def test_loopback_urls_are_accepted(url):
    from fluidpd.bench.loadgen.target import check_loopback

    base = check_loopback(url)
    assert not base.endswith("/v1") and not base.endswith("/")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000",
        "http://example.com",
        "http://192.0.2.7:80/v1",
        "ftp://127.0.0.1/",
        "http://[2001:db8::1]:8000",
    ],
)
def test_non_loopback_targets_exit_2(url, capsys):
    rc = main(["bench", "--url", url, "--trace", "azure_conv", "--ttft-slo", "1", "--tbt-slo", "0.1", "--no-progress"])
    assert rc == 2
    assert "error" in capsys.readouterr().err


def test_prompts_have_exact_lengths_and_clipping_is_counted():
    from fluidpd.bench.corpus import load_corpus
    from fluidpd.bench.loadgen.requests import plan_requests

    assert len(load_corpus()) > 20_000
    trace = Trace("t", np.array([0.0, 0.5, 1.0, 2.0]), np.array([10, 300, 900, 5]), np.array([5, 50, 20, 600]))
    plan = plan_requests(trace, list(range(1000, 1400)), max_model_len=512, seed=3)
    lens = [(len(r.prompt_ids), r.max_tokens) for r in plan.requests]
    assert lens == [(10, 5), (300, 50), (492, 20), (1, 511)]
    assert (plan.clipped_prompts, plan.clipped_outputs) == (2, 1)
    assert all(1000 <= t < 1400 for r in plan.requests for t in r.prompt_ids)
    assert [r.arrival_s for r in plan.requests] == [0.0, 0.5, 1.0, 2.0]
    unclipped = plan_requests(trace, list(range(50)), max_model_len=None)
    assert [len(r.prompt_ids) for r in unclipped.requests] == [10, 300, 900, 5]


def test_summary_counts_failures_as_misses():
    from fluidpd.bench.loadgen.aggregate import summarize
    from fluidpd.bench.loadgen.requests import BenchResult

    ok = BenchResult(0, 10, 3, send_s=0.0, token_s=[0.2, 0.3, 0.4], finish_s=0.4, finish_reason="length")
    slow = BenchResult(1, 10, 3, send_s=1.0, token_s=[3.5, 3.6, 3.7], finish_s=3.7, finish_reason="length")
    bad = BenchResult(2, 10, 3, send_s=2.0, error="HTTP 500: boom")
    row = summarize([ok, slow, bad], Slo(1.0, 0.2), "colocated")
    assert row["policy"] == "colocated"
    assert (row["requests"], row["completed"], row["failed"]) == (3, 2, 1)
    assert math.isclose(row["attainment"], 1 / 3) and math.isclose(row["strict_attainment"], 1 / 3)
    assert math.isclose(row["ttft_p50_s"], 1.35)
    assert math.isclose(row["tpot_mean_s"], 0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"fluidpd serve exited early:\n{proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail("fluidpd serve did not become healthy in time")


@pytest.mark.slow
def test_bench_against_fluidpd_serve(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fluidpd.cli",
            "serve",
            "--model",
            "smollm2",
            "--workers",
            "1",
            "--port",
            str(port),
            "--max-model-len",
            "256",
            "--num-kv-blocks",
            "64",
            "--log-level",
            "warning",
            "--admit-ttft-factor",
            "0",  # admission control is not the subject: a slow host must not 429
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        _wait_healthy(url, proc)
        out = tmp_path / "bench.json"
        rc = main(
            [
                "bench",
                "--url",
                url,
                "--trace",
                "azure_conv",
                "--rate-scale",
                "0.5",
                "--duration",
                "10",
                "--max-requests",
                "3",
                "--ttft-slo",
                "5",
                "--tbt-slo",
                "0.5",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        assert rc == 0
        rows = json.loads(out.read_text())
        assert len(rows) == 1
        row = rows[0]
        assert set(row) >= ROW_KEYS
        assert row["requests"] == 3 and row["completed"] == row["requests"] and row["failed"] == 0
        assert row["policy"] == "colocated"
        assert row["clipped_prompts"] >= 1 and row["max_model_len"] == 256
        assert row["ttft_p50_s"] > 0 and row["throughput_tok_s"] > 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            log, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
    assert proc.returncode == 0, log
    assert "stopped" in log
