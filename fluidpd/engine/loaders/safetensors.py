"""Hugging Face checkpoint directories: config.json and *.safetensors shards."""

from __future__ import annotations

import glob
import os
from typing import Any

import torch

from fluidpd.engine.loaders.checkpoint import LOADERS, Checkpoint
from fluidpd.engine.model_config import ModelConfig, read_hf_config


@LOADERS.register("safetensors")
def load_safetensors(
    path: str, dtype: torch.dtype = torch.float32, *, seed: int = 0, overrides: dict[str, Any] | None = None
) -> Checkpoint:
    """config.json plus every *.safetensors shard of a directory."""
    from safetensors.torch import load_file

    if not os.path.isdir(path):
        raise FileNotFoundError(f"safetensors directory not found: {path!r}")
    cfg = ModelConfig.from_hf(read_hf_config(path))
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(f).items():
            tensors[name] = t.to(dtype)
    tok = path if (os.path.isfile(os.path.join(path, "tokenizer.json"))) else None
    return Checkpoint(cfg, tensors, tokenizer_source=tok, meta={"format": "safetensors", "path": path})
