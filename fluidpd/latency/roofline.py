"""Roofline latency model of one engine step on a TP x PP group of accelerators."""

from __future__ import annotations

import math
from dataclasses import replace

from fluidpd.latency.calibration import latency_config
from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import HardwareSpec
from fluidpd.specs.models import ModelSpec


class RooflineModel:
    """Roofline time of one mixed step (prefill chunks + decode tokens) of `model` on `hw`.

    Two kernel groups run back to back, each bound by compute or memory, whichever is slower:
      dense     = max(GEMM FLOPs / (peak * mfu), (weights + GEMM activations) / (bw * eff))
      attention = max(attn FLOPs / (peak * attn_eff), (KV read + KV write) / (bw * kv_eff))
    each plus (1 - overlap) x the shorter of its two bounds (overlap 1: the bounds hide each other).
    GEMM FLOPs: 2 per weight per token in the layers, plus the LM head on one row per chunk
    and per decode token. Attention FLOPs: 4 * layers * heads * head_dim per query-key pair.
    Tensor parallelism splits FLOPs, weights and KV heads over `tp` ranks and adds 2 ring
    all-reduces per layer; pipeline parallelism splits layers over `pp` stages and adds one
    activation send per stage boundary. The step overhead (scheduling, launches) is added once.
    Constants are precomputed so a call costs a handful of float operations.

    A mixture of experts multiplies each token by its k experts (and the router); a step of T
    tokens streams the dense weights and the experts it touches, E * (1 - (1 - k/E)^T) of E per
    layer when each token picks k uniformly (k at batch 1, all of them at large batch). Expert
    parallelism (`ep`, a divisor of tp): the attention stays TP'd over tp ranks and each of ep
    ranks holds E/ep whole experts (split tp/ep ways further); per layer the MLP's all-reduce becomes
    a dispatch and a combine all-to-all of the routed activations (T * k * hidden values each way,
    (ep-1)/ep of them leaving their rank, the step's tokens spread evenly over the ep ranks' links),
    plus an all-reduce over the tp/ep ranks of an expert when tp > ep. Per-rank expert weights
    and FLOPs are the same as under TP: the ranks' load imbalance (a small batch's experts landing
    unevenly) is not modelled.

    Sliding windows: a windowed layer attends to at most `sliding_window` keys per query. The step
    shape holds sums, so a windowed layer's pairs and reads are bounded by min(sum, count x window):
    exact when every context is past the window (or none is), an upper bound otherwise.
    """

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        tp: int = 1,
        pp: int = 1,
        config: LatencyConfig | None = None,
        pp_link_bw: float | None = None,
        ep: int = 1,
    ) -> None:
        if tp < 1 or pp < 1 or int(tp) != tp or int(pp) != pp:
            raise ValueError(f"tp and pp must be positive integers, got tp={tp} pp={pp}")
        if pp > model.n_layers:
            raise ValueError(f"pp={pp} exceeds the model's {model.n_layers} layers")
        _check_ep(model, int(tp), ep)
        c = config if config is not None else latency_config(hw.name)
        self.model, self.hw, self.tp, self.pp, self.config = model, hw, int(tp), int(pp), c
        self.ep = int(ep)
        act_b = 4 if model.dtype == "fp32" else 2  # activations stay 16-bit under fp8 weights
        self._set_compute_costs(act_b)
        self._set_comm_costs(act_b, pp_link_bw)
        self._overhead = c.step_overhead_s
        self._pp_loss = 1.0 + c.pp_stage_loss * (self.pp - 1)
        self._exposed = 1.0 - c.overlap  # share of a group's shorter bound left exposed

    def _set_compute_costs(self, act_b: int) -> None:
        """Seconds per token, LM-head row, weight read, activation, attention pair and KV token on one rank."""
        model, hw, tp, c = self.model, self.hw, self.tp, self.config
        gemm_peak = hw.flops(model.dtype) * c.mfu  # ValueError for fp8 on A100
        attn_peak = hw.flops("fp32" if model.dtype == "fp32" else "bf16") * c.attn_efficiency
        self._bw = bw = hw.mem_bw * c.bw_efficiency
        h, hd, nh, nkv = model.hidden, model.head_dim, model.n_heads, model.n_kv_heads
        L = model.n_layers
        # Fraction of heads one TP rank holds; KV heads are replicated when tp > n_kv_heads.
        q_share = math.ceil(nh / tp) / nh
        self.kv_share = math.ceil(nkv / tp) / nkv

        layer_params = model.matmul_params - model.vocab * h  # active experts only
        self._t_tok = 2 * layer_params / tp / gemm_peak  # s per token through all layers
        self._t_row = 2 * model.vocab * h / tp / gemm_peak  # s per LM-head row (vocab-parallel)
        self._t_w = (model.weight_bytes - model.expert_weight_bytes) / tp / bw  # read every step
        self._t_experts = model.expert_weight_bytes / tp / bw  # all experts; a step reads those it touches
        # the chance that one token's top k misses a given expert (0: dense, nothing to miss); the
        # share a step of T tokens touches is 1 - missed^T (ModelSpec.experts_touched / E)
        self._missed = 1.0 - model.experts_per_token / model.n_experts if model.n_experts else 0.0
        # GEMM input/output activations per layer and token: hidden-sized tensors are
        # replicated on every TP rank, head- and intermediate-sized ones are split; a token
        # goes through k experts' MLPs (one dense MLP).
        k = model.experts_per_token or 1
        width = model.expert_width
        mlp_out = (2 if model.gated_mlp else 1) * width
        split = (nh + 2 * nkv) * hd + nh * hd + k * (mlp_out + width)
        self._t_act = L * ((2 + 2 * k) * h + split / tp) * act_b / bw
        self._t_pair = model.attn_flops_per_pair * q_share / attn_peak
        self._t_kv = model.kv_bytes_per_token * self.kv_share / (hw.mem_bw * c.kv_bw_efficiency)
        self._window = model.sliding_window
        self._windowed = model.sliding_layers / L  # share of the layers (and of attention's cost) windowed

    def _set_comm_costs(self, act_b: int, pp_link_bw: float | None) -> None:
        """TP all-reduce, EP all-to-all and PP send costs: seconds per token and fixed per step (0 without them)."""
        hw, tp, pp, ep, c = self.hw, self.tp, self.pp, self.ep, self.config
        h, L = self.model.hidden, self.model.n_layers
        link = hw.nvlink_bw_unidir * c.tp_comm_efficiency

        def all_reduce(ranks: int) -> tuple[float, float]:  # (s per token, s fixed) of one per layer
            if ranks == 1:
                return 0.0, 0.0
            fixed = L * math.ceil(math.log2(ranks)) * c.allreduce_latency_s
            return L * (2 * (ranks - 1) / ranks) * h * act_b / link, fixed

        attn_tok, attn_fixed = all_reduce(tp)  # after attention
        mlp_tok, mlp_fixed = all_reduce(tp // ep)  # after the MLP, over the ranks that split an expert
        self._ar_tok, self._ar_fixed = attn_tok + mlp_tok, attn_fixed + mlp_fixed
        if ep > 1:  # dispatch and combine: each rank sends its 1/ep of the tokens' k routed copies
            routed = self.model.experts_per_token * h * act_b * (ep - 1) / ep
            self._ar_tok += 2 * L * routed / ep / link
            self._ar_fixed += 2 * L * c.alltoall_latency_s
        if pp > 1:
            self._pp_tok = h * act_b / (pp_link_bw or hw.nvlink_bw_unidir)
            self._pp_fixed = c.p2p_latency_s
        else:
            self._pp_tok = self._pp_fixed = 0.0

    # --- step times ---------------------------------------------------------------------
    def _weights_s(self, tok: int) -> float:
        """Seconds one rank streams weights in a step of `tok` tokens: dense ones and touched experts."""
        return self._t_w + self._t_experts * (1.0 - self._missed**tok)

    def _layers(self, s: StepShape, tok: int) -> float:
        """Per-rank time of all layers for a step of `tok` tokens (no overhead, no PP sends)."""
        dense_c = tok * self._t_tok + (s.prefill_seqs + s.decode_tokens) * self._t_row
        t_e = self._t_experts  # (`_weights_s` inlined: a dense model streams `_t_w`, + 0.0 exactly)
        dense_m = (self._t_w + t_e * (1.0 - self._missed**tok) if t_e else self._t_w) + tok * self._t_act
        pairs = s.prefill_attn_pairs + s.decode_ctx
        reads: float = s.prefill_kv_read + s.decode_ctx
        if self._window:
            w, f = self._window, self._windowed
            recent = min(s.decode_ctx, s.decode_tokens * w)
            pairs -= f * (pairs - min(s.prefill_attn_pairs, s.prefill_tokens * w) - recent)
            reads -= f * (reads - min(s.prefill_kv_read, s.prefill_seqs * w) - recent)
        attn_c = pairs * self._t_pair
        attn_m = (reads + tok) * self._t_kv
        k = self._exposed
        dense = dense_c + k * dense_m if dense_c > dense_m else dense_m + k * dense_c
        attn = attn_c + k * attn_m if attn_c > attn_m else attn_m + k * attn_c
        t = dense + attn
        return t + tok * self._ar_tok + self._ar_fixed

    def step_time(self, shape: StepShape) -> float:
        """Latency of the step through all pipeline stages, in seconds (0 for an empty step)."""
        tok = shape.prefill_tokens + shape.decode_tokens
        if tok == 0:
            return 0.0
        t = self._layers(shape, tok)
        pp = (self.pp - 1) * (tok * self._pp_tok + self._pp_fixed)
        return t * self._pp_loss + pp + self._overhead + shape.masked_rows * self.config.grammar_mask_s

    def stage_time(self, shape: StepShape) -> float:
        """Time of the slowest pipeline stage: the throughput-limiting step interval."""
        tok = shape.prefill_tokens + shape.decode_tokens
        if tok == 0:
            return 0.0
        t = self._layers(shape, tok)
        mask = shape.masked_rows * self.config.grammar_mask_s
        return t * self._pp_loss / self.pp + tok * self._pp_tok + self._pp_fixed + self._overhead + mask

    def prefill_time(self, n_tokens: int, prior: int = 0) -> float:
        """One prefill chunk of `n_tokens` after `prior` cached tokens, alone in a step."""
        s = StepShape()
        s.add_chunk(n_tokens, prior)
        return self.step_time(s)

    def decode_time(self, batch: int, ctx_per_seq: int) -> float:
        """One decode step of `batch` sequences, each with `ctx_per_seq` tokens of context."""
        return self.step_time(StepShape(decode_tokens=batch, decode_ctx=batch * ctx_per_seq))

    # --- sizes and transfers --------------------------------------------------------------
    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one rank streams in a step of `tokens` tokens: the dense weights and the
        experts those tokens touch (all weights of a dense model)."""
        return self._weights_s(tokens) * self._bw

    def kv_bytes(self, tokens: int) -> int:
        """KV cache of one sequence's `tokens` tokens across all layers and heads (what a P->D
        handoff moves; a windowed layer's at most its window)."""
        return self.model.kv_bytes(tokens)

    @staticmethod
    def kv_transfer_time(nbytes: float, link_bw: float, cap_fraction: float = 1.0) -> float:
        """Seconds to move `nbytes` over a link of `link_bw` bytes/s, using `cap_fraction` of it."""
        if link_bw <= 0 or not 0.0 < cap_fraction <= 1.0:
            raise ValueError("link_bw must be > 0 and cap_fraction in (0, 1]")
        return nbytes / (link_bw * cap_fraction)

    def weight_load_time(self, bw: float) -> float:
        """Seconds for every rank to load its 1/(tp*pp) share of the weights in parallel at `bw`."""
        if bw <= 0:
            raise ValueError("bw must be > 0")
        return self.model.weight_bytes / (self.tp * self.pp) / bw

    def capacity_kv_tokens(self, scratch_fraction: float = 0.1, scratch_bytes: float = 0.0) -> int:
        """KV tokens that fit in the group's memory after weights and scratch.

        scratch = scratch_fraction of the total memory (activations, workspaces, allocator slack;
        0.1 matches vLLM's default 0.9 memory utilisation) plus `scratch_bytes`.
        """
        if not 0.0 <= scratch_fraction < 1.0 or scratch_bytes < 0:
            raise ValueError("scratch_fraction must be in [0, 1) and scratch_bytes >= 0")
        total = self.hw.mem_bytes * self.tp * self.pp
        weights = self.model.weight_bytes
        if weights >= total:
            raise ValueError(
                f"{self.model.name} weights ({weights / 1e9:.1f} GB) do not fit in "
                f"{self.tp * self.pp} x {self.hw.name} ({total / 1e9:.0f} GB)"
            )
        free = total * (1.0 - scratch_fraction) - scratch_bytes - weights
        if free <= 0:
            raise ValueError(f"no memory left for KV cache after weights and {total - free - weights:.3g} B scratch")
        # every layer's KV per token, windowed ones too (the paged blocks hold them all): a
        # conservative count for a sliding-window model, whose long sequences need less
        per_token = self.model.kv_bytes_per_token * self.kv_share * self.tp  # replicated KV heads
        return int(free // per_token)

    def sim_config(self, sim):
        """`sim` (a SimConfig) with what this model knows of its hardware's runtime behaviour
        (contention, step jitter, remap time): for a datasheet roofline, only its PCIe link (what a
        host-tier KV load runs at)."""
        return replace(sim, kv_offloading_bw=sim.kv_offloading_bw or self.hw.pcie_bw)

    def kv_blocks(self, block_size: int = 16, scratch_fraction: float = 0.1, scratch_bytes: float = 0.0) -> int:
        """Paged-KV blocks of `block_size` tokens that fit (see capacity_kv_tokens)."""
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        return self.capacity_kv_tokens(scratch_fraction, scratch_bytes) // block_size


def _check_ep(model: ModelSpec, tp: int, ep: int) -> None:
    """ep: a positive divisor of tp and of a mixture's experts (1 for a dense model)."""
    if ep < 1 or int(ep) != ep or tp % ep:
        raise ValueError(f"ep must be a positive divisor of tp={tp}, got {ep}")
    if ep > 1 and not model.n_experts:
        raise ValueError(f"ep={ep} splits experts, and {model.name} has none")
    if model.n_experts % ep:
        raise ValueError(f"{model.name}'s {model.n_experts} experts do not split evenly over ep={ep}")
