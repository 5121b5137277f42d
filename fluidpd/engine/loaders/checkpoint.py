"""What every weight loader returns (`Checkpoint`) and the registry of loaders by load format.

A loader is `load(path, dtype, *, seed, overrides) -> Checkpoint`; `seed` and `overrides`
(Hugging Face config keys) only shape dummy weights, the file formats ignore them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fluidpd.core.registry import Registry
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.quantized import QuantizedTensor


@dataclass
class Checkpoint:
    """What a loader returns: shape, tensors (HF names), and the tokenizer's source."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor | QuantizedTensor]  # QuantizedTensor: GGUF blocks kept as shipped
    tokenizer_source: str | None = None  # a .gguf file, a tokenizer.json, or a directory
    rope_freqs: torch.Tensor | None = None  # llama3 GGUFs store the rope scaling as a tensor
    meta: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None  # built from the same GGUF reader (saves a second parse)


Loader = Callable[..., Checkpoint]
LOADERS: Registry[Loader] = Registry("load format")
