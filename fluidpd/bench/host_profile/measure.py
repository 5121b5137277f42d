"""The whole profile: every part measured on this host, with the host's and the model's facts."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from fluidpd.bench.host_profile.config import PARTS, PROFILE_VERSION, ProfileConfig
from fluidpd.bench.host_profile.contention import measure_contention
from fluidpd.bench.host_profile.dispatch import measure_dispatch
from fluidpd.bench.host_profile.kv import measure_remap, measure_transfer
from fluidpd.bench.host_profile.step_bench import StepBench
from fluidpd.bench.host_profile.steps import measure_jitter, measure_steps
from fluidpd.core.cpu import cpu_name, worker_threads


def measure_profile(
    engine_config, cfg: ProfileConfig, progress: bool = True, parts: tuple[str, ...] = PARTS, base: dict | None = None
) -> dict:
    """Everything `fluidpd profile` writes, measured on this host (see the package docstring); with
    `parts`, only those are measured and the rest is kept from `base` (a profile of this engine)."""
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"profile parts must be some of {', '.join(PARTS)}, got {', '.join(parts) or 'none'}")
    if set(parts) != set(PARTS) and base is None:
        raise ValueError("measuring only some parts needs the profile they update")
    out = dict(base or {})
    from tqdm import tqdm

    engines = _Engines.load(engine_config, cfg)
    facts = engines.facts()
    n_points = len(cfg.priors) * len(cfg.chunks) + len(cfg.contexts) * len(cfg.batches)
    levels = 4 * (cfg.workers - 1) * cfg.contention_rounds if "contention" in parts else 0
    total = (n_points if "steps" in parts else 0) + levels + len(parts)
    with tqdm(total=total, desc="profile", disable=not progress) as bar:
        t0 = time.perf_counter()
        engines.measure(cfg, parts, out, bar.update)
        del engines  # the rest runs in spawned worker processes
        if "dispatch" in parts:
            out["dispatch"] = measure_dispatch(
                engine_config, cfg.dispatch_steps, worker_threads(cfg.workers), cfg.step_tokens
            )
            bar.update()
        if "contention" in parts:
            out["contention"] = measure_contention(
                engine_config, cfg.workers, cfg.contention_s, bar.update, cfg.contention_rounds, cfg.step_tokens
            )
            bar.update()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return out | {
        "version": PROFILE_VERSION,
        "date": stamp,
        "host": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "threads_per_worker": worker_threads(cfg.workers),
            "mem_bytes": _mem_bytes(),
            "platform": platform.platform(),
        },
        "engine": asdict(engine_config),
        "model": facts,
        "config": asdict(cfg),
        "measure_s": time.perf_counter() - t0,
        "measured_parts": (base or {}).get("measured_parts", {}) | dict.fromkeys(parts, stamp),
    }


@dataclass
class _Engines:
    """The engines of this process that the in-process parts time, sharing one model."""

    model: Any
    serving: Any  # configured as given: the KV a served worker gets
    engine: Any  # room for the largest decode batch and KV hand-off
    other: Any  # the hand-off's other end

    @classmethod
    def load(cls, engine_config, cfg: ProfileConfig) -> _Engines:
        import torch

        from fluidpd.engine.engine import LLMEngine, load_model

        # what a worker of a `cfg.workers`-worker cluster on this host runs (1 where they outnumber the cores)
        torch.set_num_threads(worker_threads(cfg.workers))
        model, tok = load_model(engine_config)
        serving = LLMEngine(engine_config, model=model, tokenizer=tok)
        need = -(-(cfg.max_decode_tokens + 2 * max(cfg.batches) + max(cfg.transfer_tokens)) // engine_config.block_size)
        big = replace(engine_config, num_kv_blocks=max(need, serving.blocks.num_blocks), arena_bytes=None)
        engine = LLMEngine(big, model=model, tokenizer=tok)
        other = LLMEngine(big, model=model, tokenizer=tok)
        return cls(model, serving, engine, other)

    def facts(self) -> dict:
        """What the profile records about the model and the KV a served worker of it gets."""
        model, engine = self.model, self.engine
        spec = spec_of(model.config)
        return {
            "spec": None if spec is None else spec.name,
            "matmul_params": _matmul_params(model.config),
            "weight_bytes": model.weight_bytes(),
            "weight_format": model.quantization,
            "attention": model.attention,
            "kv_bytes_per_token": engine.arena.block_bytes // engine.config.block_size,
            "kv_blocks": self.serving.blocks.num_blocks,
            "block_size": engine.config.block_size,
            "max_model_len": engine.max_model_len,
        }

    def measure(self, cfg: ProfileConfig, parts: tuple[str, ...], out: dict, advance) -> None:
        """The in-process parts among `parts` (steps, jitter, kv_transfer, fluidrole) into `out`."""
        bench = StepBench(self.engine, 0)
        if "steps" in parts:
            out["steps"] = measure_steps(bench, cfg, advance)
        if "jitter" in parts:
            out["jitter"] = measure_jitter(bench, cfg.jitter_steps, ctx=cfg.step_tokens)
        if "kv_transfer" in parts:
            out["kv_transfer"] = measure_transfer(bench, self.other, cfg.transfer_tokens, cfg.transfer_repeats)
        if "fluidrole" in parts:
            out["fluidrole"] = measure_remap(bench, cfg.repeats, ctx=2 * cfg.step_tokens)
        advance(len(set(parts) & {"steps", "jitter", "kv_transfer", "fluidrole"}))


def spec_of(mc):
    """The catalogue ModelSpec (fluidpd.specs.models) with this engine model's shape, or None."""
    from fluidpd.specs.models import MODELS

    key = (mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.intermediate_size, mc.vocab_size)
    for name in MODELS:
        m = MODELS.get(name)
        if (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.intermediate, m.vocab) == key:
            return m
    return None


def _matmul_params(mc) -> int:
    """Weights multiplied per token (projections of every layer and the LM head)."""
    d = mc.head_dim
    attn = mc.hidden_size * (mc.num_heads + 2 * mc.num_kv_heads) * d + mc.num_heads * d * mc.hidden_size
    return mc.num_layers * (attn + 3 * mc.hidden_size * mc.intermediate_size) + mc.vocab_size * mc.hidden_size


def _mem_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
