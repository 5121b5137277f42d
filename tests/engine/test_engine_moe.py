"""The sparse MoE MLP: each expert runs on the tokens routed to it only, weighted by the router."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from fluidpd.engine.linear import LINEARS
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.moe import SparseMoE


def build(cfg, rows: list[int]):
    """The layer-0 MoE of `cfg`; `rows` collects the token rows every expert linear is called on."""
    dense = LINEARS.get("none")

    def linear(w, b=None):
        lin = dense(w, b)
        real = lin.__call__

        class Counted:
            def __call__(self, x):
                rows.append(x.shape[0])
                return real(x)

            def __getattr__(self, name):
                return getattr(lin, name)

        return Counted()

    w = random_tensors(cfg, torch.float32, seed=2)
    return SparseMoE(cfg, dict(w), "model.layers.0.", linear), w  # (it pops what it takes)


def reference(cfg, w, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by its router weight where the token chose it (dense)."""
    p = "model.layers.0.mlp." if cfg.architecture == "qwen3_moe" else "model.layers.0.block_sparse_moe."
    names = ("gate_proj", "up_proj", "down_proj") if cfg.architecture == "qwen3_moe" else ("w1", "w3", "w2")
    probs = F.softmax(x @ w[p + "gate.weight"].T, dim=-1)
    top, idx = probs.topk(cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(cfg.num_experts):
        g, u, d = (w[f"{p}experts.{e}.{n}.weight"] for n in names)
        y = (F.silu(x @ g.T) * (x @ u.T)) @ d.T
        weight = (top * (idx == e)).sum(-1, keepdim=True)
        out += weight * y
    return out


def test_each_expert_runs_on_its_tokens_only_and_the_sum_is_the_dense_reference():
    for cfg in (
        tiny_config("mixtral"),
        tiny_config("qwen3_moe"),
        replace(tiny_config("qwen3_moe"), norm_topk_prob=True),
    ):
        rows: list[int] = []
        x = torch.randn(10, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
        # the real weights leave the router almost uniform: sharpen it so top k is decisive
        moe, w = build(cfg, rows)
        prefix = "model.layers.0.mlp." if cfg.architecture == "qwen3_moe" else "model.layers.0.block_sparse_moe."
        sharp = torch.randn(cfg.num_experts, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
        moe.router, w[prefix + "gate.weight"] = sharp, sharp
        out = moe(x)
        # gate|up and down once per expert that has tokens, on those tokens only: 2 x top-k rows a token
        assert sum(rows) == 2 * cfg.num_experts_per_tok * x.shape[0]
        assert torch.allclose(out, reference(cfg, w, x), atol=1e-5)
