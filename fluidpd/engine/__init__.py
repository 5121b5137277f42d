"""The real execution engine: a Llama-family model over a paged KV arena, continuously batched.

    from fluidpd.engine import LLMEngine, EngineConfig, SamplingParams
    engine = LLMEngine(EngineConfig(model="smollm2"))
    engine.generate(["The capital of France is"], SamplingParams(max_tokens=16))

See docs/engine.md.
"""
from fluidpd.engine.block_manager import NoFreeBlocksError
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import (EngineStats, LLMEngine, RequestOutput, ResizeResult, StepOutput,
                                   StepResult, load_model)
from fluidpd.engine.kv_transfer import KVLayout, KVPayload
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams, TokenLogprob

__all__ = [
    "EngineConfig", "EngineStats", "KVLayout", "KVPayload", "LLMEngine", "NoFreeBlocksError",
    "PrefillChunk", "RequestOutput", "ResizeResult", "SamplingParams", "StepOutput", "StepPlan",
    "StepResult", "TokenLogprob", "load_model",
]
