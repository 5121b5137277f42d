"""Rounding-error bounds for the engine tests, from the dtype and the size of each reduction."""

from __future__ import annotations

import math

import torch

from fluidpd.engine.model_config import ModelConfig


def logits_tol(cfg: ModelConfig, num_tokens: int, dtype: torch.dtype, scale: float) -> float:
    """Bound on |logits - exact logits| for one forward of `cfg` in `dtype`, logits of magnitude `scale`.

    Every layer and the lm_head end in sums of at most n terms (n: the longest of hidden size,
    heads * head_dim, intermediate size and attended tokens). A sum of n terms rounded at eps
    errs by about sqrt(n) * eps of its magnitude (rounding errors add as a random walk; the worst
    case n * eps, over 30 layers, would exceed the gap between fp32 and bf16 and catch nothing);
    the final norm makes that a relative error of the logits, and the layers' errors add.
    """
    n = max(cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size, num_tokens)
    return (cfg.num_layers + 1) * math.sqrt(n) * torch.finfo(dtype).eps * scale
