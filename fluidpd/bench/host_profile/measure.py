"""The whole profile: every part measured on this host, with the host's and the model's facts."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from fluidpd.bench.host_profile.config import PARTS, PROFILE_VERSION, REQUIRED_PARTS, ProfileConfig
from fluidpd.bench.host_profile.contention import measure_contention
from fluidpd.bench.host_profile.dispatch import measure_dispatch
from fluidpd.bench.host_profile.kv import measure_remap, measure_transfer
from fluidpd.bench.host_profile.step_bench import StepBench
from fluidpd.bench.host_profile.steps import measure_jitter, measure_steps
from fluidpd.core.cpu import cpu_name, worker_threads
from fluidpd.engine.config import device_type


def measure_profile(
    engine_config,
    cfg: ProfileConfig,
    progress: bool = True,
    parts: tuple[str, ...] = PARTS,
    base: dict | None = None,
    deadline: float | None = None,
    keep_going: bool = False,
) -> dict:
    """Everything `fluidpd profile` writes, measured on this host (see the package docstring); with
    `parts`, only those are measured and the rest is kept from `base` (a profile of this engine),
    or, for dispatch and contention without a base, left neutral and marked not measured (one GPU
    process). Step points past `deadline` (time.monotonic()) are skipped (listed in steps_skipped);
    with `keep_going`, a part that fails after the steps is named in failed_parts, not raised."""
    _check_parts(parts, base)
    out = dict(base or {})
    from tqdm import tqdm

    engines = _Engines.load(engine_config, cfg)
    cfg, facts = engines.cfg, engines.facts()  # on a GPU: the decode grid within its memory
    n_points = len(cfg.priors) * len(cfg.chunks) + len(cfg.contexts) * len(cfg.batches)
    levels = 4 * (cfg.workers - 1) * cfg.contention_rounds if "contention" in parts else 0
    total = (n_points if "steps" in parts else 0) + levels + len(parts)
    with tqdm(total=total, desc="profile", disable=not progress) as bar:
        t0 = time.perf_counter()
        engines.measure(cfg, parts, out, bar.update, deadline, keep_going)
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
    return neutral_parts(out) | {
        "version": PROFILE_VERSION,
        "date": stamp,
        "host": _host_facts(cfg),
        "device": device_facts(engine_config.device),
        "engine": asdict(engine_config),
        "model": facts,
        "config": asdict(cfg),
        "measure_s": time.perf_counter() - t0,
        "measured_parts": (base or {}).get("measured_parts", {})
        | dict.fromkeys((p for p in parts if p not in out.get("failed_parts", {})), stamp),
    }


# what the simulator reads of a part that was not measured: no slowdown, no overhead
NEUTRAL = {
    "dispatch": {"decode_s": 0.0, "prefill_s": 0.0},
    "contention": {"decode": [1.0], "prefill": [1.0], "decode_cross": [], "prefill_cross": []},
}
NOT_MEASURED = "not measured (one engine process on one device): the neutral value"


def _check_parts(parts: tuple[str, ...], base: dict | None) -> None:
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"profile parts must be some of {', '.join(PARTS)}, got {', '.join(parts) or 'none'}")
    if not set(REQUIRED_PARTS) <= set(parts) and base is None:
        raise ValueError(f"measuring only some of {', '.join(REQUIRED_PARTS)} needs the profile they update")


def neutral_parts(profile: dict) -> dict:
    """`profile` with each part it lacks (dispatch, contention) at its neutral value, marked not measured."""
    return profile | {k: v | {"not_measured": NOT_MEASURED} for k, v in NEUTRAL.items() if k not in profile}


def _host_facts(cfg: ProfileConfig) -> dict:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads_per_worker": worker_threads(cfg.workers),
        "mem_bytes": _mem_bytes(),
        "platform": platform.platform(),
    }


def device_facts(device: str) -> dict:
    """The device the engine ran on: a GPU's name and memory (what the simulator's spec of it holds), or the host's."""
    if device_type(device) != "cuda":
        return {"type": "cpu", "name": cpu_name(), "mem_bytes": _mem_bytes()}
    import torch

    p = torch.cuda.get_device_properties(torch.device(device))
    return {"type": "cuda", "name": p.name, "mem_bytes": p.total_memory, "sms": p.multi_processor_count,
            "torch": torch.__version__}  # fmt: skip


@dataclass
class _Engines:
    """The engines of this process that the in-process parts time, sharing one model."""

    model: Any
    serving: Any  # configured as given: the KV a served worker gets
    engine: Any  # room for the largest decode batch and KV hand-off
    other: Any  # the hand-off's other end
    cfg: ProfileConfig  # as given; on a GPU, max_decode_tokens within the KV its memory holds

    @classmethod
    def load(cls, engine_config, cfg: ProfileConfig) -> _Engines:
        import torch

        from fluidpd.engine.engine import LLMEngine, load_model

        if device_type(engine_config.device) == "cpu":
            # what a worker of a `cfg.workers`-worker cluster on this host runs (1 where they outnumber the cores)
            torch.set_num_threads(worker_threads(cfg.workers))
        model, tok = load_model(engine_config)
        serving = LLMEngine(engine_config, model=model, tokenizer=tok)
        cfg = _within_memory(cfg, serving)
        bs = engine_config.block_size
        need = -(-(cfg.max_decode_tokens + 2 * max(cfg.batches) + max(cfg.transfer_tokens)) // bs)
        big = replace(engine_config, num_kv_blocks=max(need, serving.blocks.num_blocks), arena_bytes=None)
        engine = LLMEngine(big, model=model, tokenizer=tok)
        # the hand-off's other end holds one request of the largest size (a GPU has no room for two big arenas)
        small = replace(engine_config, num_kv_blocks=-(-max(cfg.transfer_tokens) // bs) + 4, arena_bytes=None)
        other = LLMEngine(small, model=model, tokenizer=tok)
        return cls(model, serving, engine, other, cfg)

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

    def measure(self, cfg: ProfileConfig, parts: tuple[str, ...], out: dict, advance, deadline, keep_going) -> None:
        """The in-process parts among `parts` (steps, jitter, kv_transfer, fluidrole) into `out`; with
        `keep_going`, a part after the steps that fails is named in out["failed_parts"] instead."""
        bench = StepBench(self.engine, 0)
        bench.warm(min(cfg.step_tokens, self.engine.max_model_len - 2))
        if "steps" in parts:
            skipped: list[dict] = []
            out["steps"] = measure_steps(bench, cfg, advance, deadline, skipped, keep_going)
            if deadline is not None or keep_going:
                out["steps_skipped"] = skipped
        measures = {
            "jitter": lambda: measure_jitter(bench, cfg.jitter_steps, ctx=cfg.step_tokens),
            "kv_transfer": lambda: measure_transfer(bench, self.other, cfg.transfer_tokens, cfg.transfer_repeats),
            "fluidrole": lambda: measure_remap(bench, cfg.repeats, ctx=2 * cfg.step_tokens),
        }
        for part in (p for p in measures if p in parts):
            try:
                out[part] = measures[part]()
            except Exception as exc:  # noqa: BLE001 - keep_going: what was measured still comes back
                if not keep_going:
                    raise
                out.setdefault("failed_parts", {})[part] = f"{type(exc).__name__}: {exc}"
        advance(len(set(parts) & {"steps", *measures}))


def _within_memory(cfg: ProfileConfig, engine) -> ProfileConfig:
    """`cfg` with max_decode_tokens within `gpu_kv_share` of the device memory free once the model
    is loaded (the steps' activations and attention workspaces take the rest); a CPU's as given."""
    import torch

    device = engine.arena.device
    if device.type != "cuda":
        return cfg
    torch.cuda.empty_cache()  # what the load freed counts as free
    free, _ = torch.cuda.mem_get_info(device)
    per_token = engine.arena.block_bytes // engine.config.block_size
    room = int(cfg.gpu_kv_share * free) // per_token - 2 * max(cfg.batches) - max(cfg.transfer_tokens)
    return replace(cfg, max_decode_tokens=max(1, min(cfg.max_decode_tokens, room)))


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
