"""RoPE inverse frequencies: default, linear and llama3 scaling (as transformers computes them)."""

from __future__ import annotations

import math

import torch

from fluidpd.engine.model_config import ModelConfig


def rope_inv_freq(cfg: ModelConfig, rope_freqs: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE inverse frequencies in float32 (computed as transformers does), linear or llama3 scaled."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type", "default")
    if rope_freqs is not None:
        return inv / rope_freqs.float()
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        inv = _llama3_scale(inv, sc)
    return inv


def _llama3_scale(inv: torch.Tensor, sc: dict) -> torch.Tensor:
    factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)
