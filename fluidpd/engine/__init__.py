"""The real execution engine: a Llama-family model over a paged KV arena, continuously batched.

    from fluidpd.engine import LLMEngine, EngineConfig, SamplingParams
    engine = LLMEngine(EngineConfig(model="smollm2"))
    engine.generate(["The capital of France is"], SamplingParams(max_tokens=16))

Names are imported lazily, so `import fluidpd.engine.cli` (the `fluidpd` command) needs no torch.
See docs/engine.md.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "NoFreeBlocksError": "block_manager",
    "MissingCachedBlocks": "block_pool",
    "EngineConfig": "config",
    "EngineStats": "outputs",
    "LLMEngine": "engine",
    "RequestOutput": "outputs",
    "ResizeResult": "outputs",
    "StepOutput": "outputs",
    "StepResult": "outputs",
    "load_model": "model_loading",
    "KVLayout": "kv_transfer",
    "KVPayload": "kv_transfer",
    "PrefillChunk": "plan",
    "StepPlan": "plan",
    "SamplingParams": "sampling_params",
    "TokenLogprob": "sampling_params",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"fluidpd.engine.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fluidpd.engine' has no attribute {name!r}")


def __dir__():
    return __all__
