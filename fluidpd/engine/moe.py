"""The sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router scores every expert for each
token, the top k run it, and each expert runs once per step on the tokens routed to it (grouped by
expert, never densely over every token), its SwiGLU output weighted by the token's router weight."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fluidpd.engine.linear import Linear, tensor_bytes
from fluidpd.engine.model_config import ModelConfig

# checkpoint names per architecture: (router, one expert's prefix, its gate / up / down projections)
MOE_NAMES = {
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{}.", ("w1", "w3", "w2")),
    "qwen3_moe": ("mlp.gate.weight", "mlp.experts.{}.", ("gate_proj", "up_proj", "down_proj")),
}


def moe_tensor_names(cfg: ModelConfig, layer_prefix: str) -> list[str]:
    """Every tensor name of one layer's MoE MLP in `cfg`'s checkpoint."""
    router, expert, (gate, up, down) = MOE_NAMES[cfg.architecture]
    names = [layer_prefix + router]
    for e in range(cfg.num_experts):
        names += [layer_prefix + expert.format(e) + p + ".weight" for p in (gate, up, down)]
    return names


class SparseMoE:
    """Router (softmax over experts, top k, weights renormalised over the k where the model does)
    -> each chosen expert's SwiGLU on its tokens -> the weighted sum per token."""

    def __init__(
        self, cfg: ModelConfig, w: dict[str, torch.Tensor], prefix: str, linear: Callable[..., Linear]
    ) -> None:
        router, expert, (gate, up, down) = MOE_NAMES[cfg.architecture]
        self.router = w.pop(prefix + router)
        self.experts: list[tuple[Linear, Linear]] = []
        for e in range(cfg.num_experts):
            p = prefix + expert.format(e)
            gate_up = torch.cat([w.pop(p + gate + ".weight"), w.pop(p + up + ".weight")])
            self.experts.append((linear(gate_up), linear(w.pop(p + down + ".weight"))))
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.inter = cfg.expert_intermediate_size

    @property
    def linears(self) -> list[Linear]:
        return [lin for pair in self.experts for lin in pair]

    def nbytes(self) -> int:
        """The router's and every expert's weights."""
        return tensor_bytes(self.router) + sum(lin.nbytes for lin in self.linears)

    def to(self, device: torch.device) -> None:
        self.router = self.router.to(device)
        for lin in self.linears:
            lin.to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [n, k]
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
        tokens, scale = order // self.top_k, weights.flatten()[order].to(x.dtype)
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(torch.bincount(flat, minlength=len(self.experts)).tolist()):
            if not n:
                continue
            rows = tokens[start : start + n]
            gate_up, down = self.experts[e]
            gu = gate_up(x[rows])
            h = down(F.silu(gu[:, : self.inter]) * gu[:, self.inter :])
            out.index_add_(0, rows, h * scale[start : start + n, None])
            start += n
        return out
