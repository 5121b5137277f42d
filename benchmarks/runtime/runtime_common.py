"""Shared by the runtime benchmarks: a coordinator over real engine workers, and timed streams."""

from __future__ import annotations

import itertools
import time

import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

torch.set_num_threads(1)
CONFIG = EngineConfig(num_kv_blocks=512, max_model_len=2048, max_num_seqs=32)


def coordinator(
    policy: str,
    workers: int,
    backend: str = "process",
    profile=None,
    prefill_workers: int = 0,
    max_num_seqs: int = 32,
    config: EngineConfig | None = None,
    admit_ttft_factor: float = 0.0,  # admission off: every system sees every request of a comparison
    **runtime_kw,
):
    runtime = RuntimeConfig(
        profile_cache=False,  # a benchmark measures this host as it is now
        admit_ttft_factor=admit_ttft_factor,
        workers=workers,
        policy=policy,
        backend=backend,
        **runtime_kw,
        scheduling=PolicyConfig(prefill_workers=prefill_workers, max_num_seqs=max_num_seqs),
    )
    return build_coordinator(config or CONFIG, runtime, log=lambda m: None, profile=profile)


def prompt(n: int, seed: int = 0) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(n)]


async def timed(coord, rid: str, ids: list[int], max_tokens: int) -> dict:
    """Submit one request and record its arrival, first token and every later token time."""
    t0 = time.perf_counter()
    stream = coord.submit(GenerationRequest(rid, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    times, tokens, error = [], [], None
    async for ev in stream:
        times += [time.perf_counter()] * len(ev.token_ids)
        tokens += ev.token_ids
        error = ev.error or error
    return {
        "id": rid,
        "arrival": t0,
        "times": times,
        "tokens": tokens,
        "error": error,
        "ttft": times[0] - t0 if times else float("nan"),
        "gaps": [b - a for a, b in itertools.pairwise(times)],
    }


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]
