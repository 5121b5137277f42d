"""Weight loaders by load format: GGUF, Hugging Face safetensors directories, and dummy (random) weights.

Each returns a `Checkpoint`: the model's shape (`ModelConfig`), its tensors under Hugging Face
Llama names ("model.layers.0.self_attn.q_proj.weight", ...), and where its tokenizer lives.
"""

from __future__ import annotations

from typing import Any

import torch

from fluidpd.engine.loaders import dummy, gguf, safetensors  # noqa: F401  (each registers its loader)
from fluidpd.engine.loaders.checkpoint import LOADERS, Checkpoint
from fluidpd.engine.model_source import resolve_model, smollm2_gguf

__all__ = ["LOADERS", "Checkpoint", "load_checkpoint", "resolve_model", "smollm2_gguf"]


def load_checkpoint(
    model: str,
    load_format: str = "auto",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    keep_quantized: bool = False,
) -> Checkpoint:
    """The checkpoint `model` names, read by the loader registered for its (resolved) format.

    `keep_quantized`: a GGUF's Q4_1 / Q8_0 linear weights stay as shipped (`QuantizedTensor`).
    """
    path, fmt = resolve_model(model, load_format)
    extra = {"keep_quantized": True} if keep_quantized and fmt == "gguf" else {}
    return LOADERS.build(fmt, path, dtype, seed=seed, overrides=overrides or {}, **extra)
