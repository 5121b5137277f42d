"""Attention with its scores soft-capped (Gemma 2): softmax(cap * tanh(q k * scale / cap) + mask) v, which
`F.scaled_dot_product_attention` cannot compute; without a cap it is that function."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    softcap: float,
    gqa: bool,
) -> torch.Tensor:
    """q [..., H, n, D] over k, v [..., KV, T, D] (KV = H unless `gqa`); `mask` additive, broadcast to [.., n, T]."""
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    if gqa:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = torch.tanh(s / softcap) * softcap
    if causal:
        n, t = s.shape[-2:]
        mask = torch.full((n, t), float("-inf"), dtype=s.dtype, device=s.device).triu_(t - n + 1)
    if mask is not None:
        s = s + mask
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v
