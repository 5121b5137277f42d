"""Build the serving runtime: start the workers, size max_model_len on worker 0's engine and profile it.

With the process and Ray backends this process loads only the tokenizer (no torch, no weights: the
workers load the model); the in-process backend loads the model here once and shares it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from fluidpd.core.cpu import usable_cores
from fluidpd.engine.config import device_type
from fluidpd.policy.view import blocks_for
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.coordinator import Coordinator
from fluidpd.runtime.profile import EngineProfile


def _stderr(msg: str) -> None:
    print(f"fluidpd: {msg}", file=sys.stderr, flush=True)


def serving_max_model_len(engine, requested: int | None) -> tuple[int, str]:
    """The longest request (prompt + output) every worker can serve, and why, for workers like `engine`.

    As vLLM does: the model's context (an explicit `requested` instead), if one worker's KV holds a
    request that long, else an error for `requested` and the cap for the default. A prefill worker
    keeps room for one such prompt when FluidRole re-slices its arena (`prefill_kv_floor`)."""
    return max_model_len_for(engine.config.block_size, engine.blocks.num_blocks, engine.max_model_len, requested)


def max_model_len_for(block_size: int, blocks: int, context: int, requested: int | None) -> tuple[int, str]:
    """`serving_max_model_len` for workers of `blocks` KV blocks of `block_size` tokens over a model
    whose context is `context` tokens (what a worker's StartInfo reports)."""
    bs, whole = block_size, blocks * block_size
    if requested is not None:
        if requested > whole:
            raise ValueError(
                f"max_model_len {requested} needs {blocks_for(requested, bs)} KV blocks per worker, "
                f"but a worker holds {blocks} ({whole} tokens): raise --num-kv-blocks or lower "
                f"--max-model-len"
            )
        return requested, "as requested"
    where = f"one worker's KV ({blocks} blocks x {bs} tokens)"
    if context <= whole:
        return context, f"the model's context ({where} holds {whole} tokens)"
    return whole, (f"capped by {where}; the model's context is {context}; more --num-kv-blocks for longer")


def build_coordinator(
    config,
    runtime: RuntimeConfig,
    model_name: str | None = None,
    log=None,
    profile: EngineProfile | None = None,
    placement=None,
) -> Coordinator:
    """Start `runtime.workers` engines of `config` and return the coordinator (not yet started:
    `await coordinator.start()` inside the serving event loop). `model_name`: the name clients use
    (default: `config.model`). `placement`: where Ray workers go (`ray_placement`; default: reserved here).

    Worker 0 tells what every worker serves (max_model_len, KV blocks, vocabulary) and, unless a
    `profile` is given, measures its engine's step times for the policy (the `profile` call). The
    in-process backend loads the model here once and shares it between its workers; the process and
    Ray backends load it in their workers only: this process reads the tokenizer and never imports torch."""
    from fluidpd.runtime.backend import make_worker

    log = log or _stderr
    shared: dict = {}
    tokenizer, load_s = _load_tokenizer(config, runtime, shared)
    threads, release = runtime.worker_threads, None
    if runtime.backend == "ray":
        threads, release = _place_ray(config, runtime, placement, log, shared)
    config = with_kv_store(config, runtime, log)

    def spawn(i: int):
        return make_worker(runtime.backend, i, config, num_threads=threads, **shared)

    backends = [spawn(i) for i in range(runtime.workers)]
    first = _start_or_undo(backends, runtime, log, load_s, config, profile, release if placement is None else None)
    return Coordinator(
        backends,
        tokenizer,
        model_name or config.model,
        first.max_model_len,
        first.vocab_size,
        first.kv_blocks,
        config.block_size,
        first.kv_bytes_per_token,
        first.profile,
        runtime,
        spawn,
        release=release,
        prefix_caching=config.enable_prefix_caching,
        kv_store=config.kv_store,
        kv_store_bytes=config.kv_store_bytes,
        compute_slots=compute_slots(runtime, config, threads),
    )


def _load_tokenizer(config, runtime: RuntimeConfig, shared: dict) -> tuple:
    """(the tokenizer clients' text goes through, seconds it took); the in-process backend loads the
    model here too (into `shared`)."""
    t0 = time.perf_counter()
    if runtime.backend == "inprocess":
        from fluidpd.engine.model_loading import load_model

        shared["model"], shared["tokenizer"] = load_model(config)
        tokenizer = shared["tokenizer"]
    else:
        from fluidpd.engine.model_source import load_tokenizer

        tokenizer = load_tokenizer(config)
    if tokenizer is None:
        raise ValueError(f"serving needs a tokenizer: {config.model} has none (pass --tokenizer)")
    load_s = time.perf_counter() - t0
    _release_heap()  # what reading the GGUF's metadata (or the checkpoint) left on the heap
    return tokenizer, load_s


def _place_ray(config, runtime: RuntimeConfig, placement, log, shared: dict):
    """(threads a worker, what releases the placement) for Ray workers, their placement put in `shared`:
    `placement`, else one reserved here (released by the coordinator)."""
    from fluidpd.runtime.ray_links import ray_placement

    gpus = str(config.device).startswith("cuda")
    shared["placement"] = placement or ray_placement(runtime, gpus, log)[0]
    return runtime.threads, shared["placement"].remove  # threads 0: each actor splits its node's cores


def _start_or_undo(
    backends: list, runtime: RuntimeConfig, log, load_s: float, config, profile: EngineProfile | None, release
) -> _Served:
    """`_start`; one that fails leaves nothing behind: the workers, the KV store, and the placement
    reserved here (`release`)."""
    try:
        return _start(backends, runtime, runtime.backend == "inprocess", log, load_s, config, profile)
    except BaseException:  # e.g. a max_model_len no worker holds
        for b in backends:
            b.close()
        if release is not None:
            release()
        if config.kv_store:
            from fluidpd.engine.kvstore.shm import SharedKVStore

            SharedKVStore.unlink(config.kv_store)
        raise


def compute_slots(runtime: RuntimeConfig, config, threads: int) -> int:
    """Steps that run at full speed at once when the workers share this machine's cores: its cores
    over each worker's threads; 0 where each worker has a device of its own or a node of Ray's."""
    if runtime.backend == "ray" or device_type(config.device) != "cpu":
        return 0
    return max(1, usable_cores() // threads)


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
    """What `fluidpd serve` with these configs measures of this host at startup (its engine profile:
    `profile_engine` at a worker's torch threads), on an engine in this process, without starting workers."""
    import torch

    from fluidpd.engine.engine import LLMEngine
    from fluidpd.runtime.profile import profile_engine

    torch.set_num_threads(runtime.worker_threads)
    engine = LLMEngine(config)
    try:
        return profile_engine(engine)
    finally:
        del engine
        _release_heap()


def _release_heap() -> None:
    """Hand the heap a load or an engine freed (parsed metadata, weights, arena, profile runs) back to the OS."""
    import gc

    from fluidpd.core.memory import trim_heap

    gc.collect()
    trim_heap()


@dataclass
class _Served:
    """What worker 0 tells the coordinator about every worker."""

    max_model_len: int
    vocab_size: int
    kv_blocks: int
    kv_bytes_per_token: float
    profile: EngineProfile


def _profile(backend, config, info, cached: bool, log) -> EngineProfile:
    """Worker 0's engine profile: this machine's kept one for the same engine when a decode step now takes
    what it took then (within PROFILE_DRIFT: the host is as busy as it was), else measured (and kept)."""
    from fluidpd.runtime.profile_cache import PROFILE_DRIFT, load_profile, profile_key, store_profile

    key = profile_key(config, info)
    hit = load_profile(key) if cached else None
    if hit is not None:
        kept, when = hit
        now = backend.submit("decode_probe").result()
        if 1 / PROFILE_DRIFT <= now / kept.decode_step_s <= PROFILE_DRIFT:
            log(f"profile: this host's, measured {when} (a decode step {now * 1e3:.1f} ms now, as then)")
            return kept
        log(f"profile kept from {when}: decode step {kept.decode_step_s * 1e3:.1f} ms then, {now * 1e3:.1f} ms now")
    log("profiling step times ...")
    profile = backend.submit("profile").result()
    store_profile(key, profile)
    return profile


def _start(
    backends: list, runtime: RuntimeConfig, shared: bool, log, load_s: float, config, profile: EngineProfile | None
) -> _Served:
    """Start the workers, size max_model_len on worker 0's engine and profile it (unless `profile` is
    given); log the load, the profile, how long the start took and the memory each worker holds."""
    from fluidpd.core.memory import rss_bytes
    from fluidpd.runtime.backend import start_workers

    t1 = time.perf_counter()
    infos = start_workers(backends)
    start_s = time.perf_counter() - t1
    info = infos[0]
    stats = info.stats
    max_len, why = max_model_len_for(config.block_size, stats.num_kv_blocks, info.max_model_len, config.max_model_len)
    log(
        f"loaded {config.model} in {load_s + info.weight_load_s + info.engine_build_s:.1f} s ({info.quantization} "
        f"weights, {info.attention} decode attention); max_model_len {max_len}: {why}"
    )
    if profile is None:
        profile = _profile(backends[0], config, info, runtime.profile_cache, log)
    log(
        f"profile: f_P(512) = {profile.prefill_time(512) * 1e3:.0f} ms, decode step "
        f"{profile.decode_step_s * 1e3:.1f} ms, L_m = {profile.prefill_batch_tokens} tokens"
    )
    rss = ", ".join(f"{rss_bytes(b.pid) / 2**30:.2f}" for b in backends)
    threads = ", ".join(sorted({str(i.threads) for i in infos}))
    log(
        f"started {runtime.workers} {runtime.backend} worker(s) ({threads} torch thread(s) each) in "
        f"{start_s:.1f} s, "
        f"policy {runtime.policy}; resident memory per worker (GiB{', one shared process' if shared else ''}): {rss}"
    )
    return _Served(max_len, info.vocab_size, stats.num_kv_blocks, stats.block_bytes / config.block_size, profile)
