"""Build the serving runtime: profile the engine, start the workers, wire the coordinator."""
from __future__ import annotations

import sys
import time

from fluidpd.runtime.coordinator import Coordinator, RuntimeConfig


def engine_config(model: str = "smollm2", num_kv_blocks: int | None = None, max_model_len: int | None = None,
                  max_num_seqs: int = 64, **kw):
    from fluidpd.engine.config import EngineConfig

    return EngineConfig(model=model, num_kv_blocks=num_kv_blocks, max_model_len=max_model_len,
                        max_num_seqs=max_num_seqs, **kw)


def build_coordinator(config, runtime: RuntimeConfig, workers: int, backend: str = "process",
                      log=None, profile=None) -> Coordinator:
    """Start `workers` engines of `config` (a profile engine in this process first, unless a
    `profile` is given) and return the coordinator (not yet started: `await coordinator.start()`
    inside the serving event loop)."""
    import torch

    from fluidpd.engine.engine import LLMEngine, load_model
    from fluidpd.runtime.backend import make_worker, start_workers
    from fluidpd.runtime.profile import profile_engine

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if workers < 2 and runtime.policy not in ("colocated", "chunked"):
        raise ValueError(f"policy {runtime.policy} needs at least 2 workers")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, tokenizer = load_model(config)
    probe = LLMEngine(config, model=model, tokenizer=tokenizer)
    if profile is None:
        log(f"loaded {config.model} in {time.perf_counter() - t0:.1f} s; profiling step times ...")
        profile = profile_engine(probe)
    log(f"profile: f_P(512) = {profile.prefill_time(512) * 1e3:.0f} ms, decode step "
        f"{profile.decode_step_s * 1e3:.1f} ms, L_m = {profile.prefill_batch_tokens} tokens")
    kv_blocks, block_size = probe.blocks.num_blocks, config.block_size
    kv_bytes_per_token = probe.arena.block_bytes / block_size
    max_len = probe.max_model_len
    shared = {"model": model, "tokenizer": tokenizer} if backend == "inprocess" else {}
    del probe
    backends = [make_worker(backend, i, config, **shared) for i in range(workers)]
    t1 = time.perf_counter()
    start_workers(backends)
    log(f"started {workers} {backend} workers in {time.perf_counter() - t1:.1f} s")
    return Coordinator(backends, tokenizer, _served_name(config.model), max_len, kv_blocks, block_size,
                       kv_bytes_per_token, profile, runtime)


def build_runtime(args) -> Coordinator:
    """From `fluidpd serve` arguments (model, workers, prefill_workers, policy, ttft_slo, tbt_slo,
    max_model_len, num_kv_blocks, max_num_seqs, load_format, tokenizer, dtype, device, seed,
    served_model_name)."""
    opt = {k: getattr(args, k) for k in ("load_format", "tokenizer", "dtype", "device", "seed")
           if getattr(args, k, None) is not None}
    config = engine_config(args.model, getattr(args, "num_kv_blocks", None), getattr(args, "max_model_len", None),
                           getattr(args, "max_num_seqs", None) or 64, **opt)
    runtime = RuntimeConfig(policy=args.policy, prefill_workers=getattr(args, "prefill_workers", 0) or 0,
                            ttft_slo_s=args.ttft_slo, tbt_slo_s=args.tbt_slo,
                            max_num_seqs=getattr(args, "max_num_seqs", None) or 64)
    coord = build_coordinator(config, runtime, args.workers, getattr(args, "backend", "process"))
    if getattr(args, "served_model_name", None):
        coord.model_aliases = (coord.model_name,)
        coord.model_name = args.served_model_name
    if args.model == "smollm2":
        coord.model_aliases += ("smollm2",)
    return coord


def _served_name(model: str) -> str:
    import os

    return "SmolLM2-135M-Instruct" if model == "smollm2" else os.path.basename(os.path.normpath(model))
