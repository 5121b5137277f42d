"""Build the serving runtime: load and profile the engine, size max_model_len, start the workers."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from fluidpd.policy.view import blocks_for
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.coordinator import Coordinator
from fluidpd.runtime.profile import EngineProfile


def _stderr(msg: str) -> None:
    print(f"fluidpd: {msg}", file=sys.stderr, flush=True)


def serving_max_model_len(engine, requested: int | None) -> tuple[int, str]:
    """The longest request (prompt + output) every worker can serve, and why.

    As vLLM does: the model's context (an explicit `requested` instead), if one worker's KV holds a
    request that long, else an error for `requested` and the cap for the default. A prefill worker
    keeps room for one such prompt when FluidRole re-slices its arena (`prefill_kv_floor`)."""
    bs, blocks = engine.config.block_size, engine.blocks.num_blocks
    whole = blocks * bs
    if requested is not None:
        if requested > whole:
            raise ValueError(
                f"max_model_len {requested} needs {blocks_for(requested, bs)} KV blocks per worker, "
                f"but a worker holds {blocks} ({whole} tokens): raise --num-kv-blocks or lower "
                f"--max-model-len"
            )
        return requested, "as requested"
    where = f"one worker's KV ({blocks} blocks x {bs} tokens)"
    if engine.max_model_len <= whole:
        return engine.max_model_len, f"the model's context ({where} holds {whole} tokens)"
    return whole, (f"capped by {where}; the model's context is {engine.max_model_len}; more --num-kv-blocks for longer")


def build_coordinator(
    config,
    runtime: RuntimeConfig,
    model_name: str | None = None,
    log=None,
    profile: EngineProfile | None = None,
    placement=None,
) -> Coordinator:
    """Start `runtime.workers` engines of `config` (after profiling one in this process, unless a
    `profile` is given) and return the coordinator (not yet started: `await coordinator.start()`
    inside the serving event loop). `model_name`: the name clients use (default: `config.model`).
    `placement`: where Ray workers go (`ray_placement`; default: reserved here)."""
    from fluidpd.runtime.backend import make_worker

    log = log or _stderr
    probe = _probe(config, runtime, log, profile)
    shared: dict = {"model": probe.model, "tokenizer": probe.tokenizer} if runtime.backend == "inprocess" else {}
    threads = runtime.worker_threads
    if runtime.backend == "ray":
        from fluidpd.runtime.ray_links import ray_placement

        gpus = str(config.device).startswith("cuda")
        shared["placement"] = placement or ray_placement(runtime, gpus, log)[0]
        threads = runtime.threads  # 0: each actor splits its node's cores between the workers there
    probe.model = None  # in-process workers share it through `shared`; the others load their own
    _release_heap()
    config = with_kv_store(config, runtime, log)

    def spawn(i: int):
        return make_worker(runtime.backend, i, config, num_threads=threads, **shared)

    backends = [spawn(i) for i in range(runtime.workers)]
    _start(backends, runtime, bool(shared), log)
    return Coordinator(
        backends,
        probe.tokenizer,
        model_name or config.model,
        probe.max_model_len,
        probe.vocab_size,
        probe.kv_blocks,
        config.block_size,
        probe.kv_bytes_per_token,
        probe.profile,
        runtime,
        spawn,
        release=shared["placement"].remove if "placement" in shared else None,
        prefix_caching=config.enable_prefix_caching,
        kv_store=config.kv_store,
        kv_store_bytes=config.kv_store_bytes,
    )


def with_kv_store(config, runtime: RuntimeConfig, log):
    """`config` with a node-shared KV store (a fresh file per run) when `--kv-offloading-size` asks for one:
    size x workers (on Ray, each node's file is sized so too)."""
    if not runtime.kv_offloading_size:
        return config
    if not config.enable_prefix_caching:
        raise ValueError("--kv-offloading-size needs prefix caching (drop --no-enable-prefix-caching)")
    import os
    import secrets
    from dataclasses import replace

    from fluidpd.engine.kvstore.shm import default_dir

    path = default_dir() / f"fluidpd-kv-{os.getpid()}-{secrets.token_hex(4)}"
    size = int(runtime.kv_offloading_size * 2**30 * runtime.workers)
    log(f"KV store: {size / 2**30:.2f} GiB shared by the node's workers at {path}")
    return replace(config, kv_store=str(path), kv_store_bytes=size)


def measure_host(config, runtime: RuntimeConfig) -> EngineProfile:
    """What `fluidpd serve` with these configs measures of this host at startup (its engine profile),
    without starting workers."""
    probe = _probe(config, runtime, lambda m: None, None)
    probe.model = None
    _release_heap()
    return probe.profile


def _release_heap() -> None:
    """Hand the heap the probe engine freed (its weights, arena and profile runs) back to the OS."""
    import gc

    from fluidpd.core.memory import trim_heap

    gc.collect()
    trim_heap()


@dataclass
class _Probe:
    """What one engine loaded (and profiled) in this process tells the coordinator about every worker."""

    model: Any
    tokenizer: Any
    max_model_len: int
    profile: EngineProfile
    kv_blocks: int
    kv_bytes_per_token: float
    vocab_size: int


def _probe(config, runtime: RuntimeConfig, log, profile: EngineProfile | None) -> _Probe:
    """Load the model, size max_model_len on an engine of `config` and profile it (unless `profile` is given)."""
    import torch

    from fluidpd.engine.engine import LLMEngine, load_model
    from fluidpd.runtime.profile import profile_engine

    # the profile prices steps for the policy: measured at the threads a worker runs
    torch.set_num_threads(runtime.worker_threads)
    t0 = time.perf_counter()
    model, tokenizer = load_model(config)
    if tokenizer is None:
        raise ValueError(f"serving needs a tokenizer: {config.model} has none (pass --tokenizer)")
    probe = LLMEngine(config, model=model, tokenizer=tokenizer)
    max_len, why = serving_max_model_len(probe, config.max_model_len)
    log(
        f"loaded {config.model} in {time.perf_counter() - t0:.1f} s ({model.quantization} weights, "
        f"{model.attention} decode attention); max_model_len {max_len}: {why}"
    )
    if profile is None:
        log("profiling step times ...")
        profile = profile_engine(probe)
    log(
        f"profile: f_P(512) = {profile.prefill_time(512) * 1e3:.0f} ms, decode step "
        f"{profile.decode_step_s * 1e3:.1f} ms, L_m = {profile.prefill_batch_tokens} tokens"
    )
    kv_bytes_per_token = probe.arena.block_bytes / config.block_size
    return _Probe(
        model, tokenizer, max_len, profile, probe.blocks.num_blocks, kv_bytes_per_token, probe.model_config.vocab_size
    )


def _start(backends: list, runtime: RuntimeConfig, shared: bool, log) -> None:
    """Start the workers and log how long that took and the memory each holds."""
    from fluidpd.core.memory import rss_bytes
    from fluidpd.runtime.backend import start_workers

    t1 = time.perf_counter()
    infos = start_workers(backends)
    rss = ", ".join(f"{rss_bytes(b.pid) / 2**30:.2f}" for b in backends)
    threads = ", ".join(sorted({str(i.threads) for i in infos}))
    log(
        f"started {runtime.workers} {runtime.backend} worker(s) ({threads} torch thread(s) each) in "
        f"{time.perf_counter() - t1:.1f} s, "
        f"policy {runtime.policy}; resident memory per worker (GiB{', one shared process' if shared else ''}): {rss}"
    )
