"""Mixtures of experts in the roofline: active-expert FLOPs, touched-expert weight traffic, expert parallelism."""

import dataclasses
import math

import pytest

from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.profiled import latency_model
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

H100 = get_hardware("h100")
A3B = get_model("qwen3-30b-a3b")
COMPUTE_BOUND = dataclasses.replace(H100, mem_bw=1e18)  # memory traffic costs nothing
MEMORY_BOUND = dataclasses.replace(H100, peak_flops={"bf16": 1e30, "fp32": 1e30})  # FLOPs cost nothing
OVERHEAD = LatencyConfig().step_overhead_s


def test_decode_flops_scale_with_k_not_e():
    def decode_s(model, batch=64):
        return RooflineModel(model, COMPUTE_BOUND).decode_time(batch, 1) - OVERHEAD

    base = decode_s(A3B)
    gemm_s = 64 * A3B.flops_per_token / (989e12 * 0.5)
    attn_s = 64 * A3B.attn_flops_per_pair / (989e12 * 0.4)
    assert base == pytest.approx(gemm_s + attn_s, rel=1e-9)
    double_e = decode_s(dataclasses.replace(A3B, n_experts=256))
    double_k = decode_s(dataclasses.replace(A3B, experts_per_token=16))
    router_s = 64 * 2 * 48 * 2048 * 128 / (989e12 * 0.5)  # only the router grows with E
    assert double_e - base == pytest.approx(router_s, rel=1e-6)
    experts_s = 64 * 2 * 48 * 8 * A3B.expert_params / (989e12 * 0.5)
    assert double_k - base == pytest.approx(experts_s, rel=1e-6)


def test_experts_touched_by_a_batch():
    assert A3B.experts_touched(1) == pytest.approx(8)
    assert A3B.experts_touched(16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert A3B.experts_touched(4096) == pytest.approx(128, rel=1e-9)
    assert get_model("llama-3.1-8b").experts_touched(64) == 0


def test_weights_read_per_step_dense_plus_touched_experts():
    r = RooflineModel(A3B, H100)
    dense = A3B.weight_bytes - A3B.expert_weight_bytes
    expert = A3B.expert_weight_bytes / (48 * 128)  # one expert of one layer
    assert r.weight_bytes_read(1) == pytest.approx(dense + 48 * 8 * expert, rel=1e-9)
    assert r.weight_bytes_read(4096) == pytest.approx(A3B.weight_bytes, rel=1e-9)
    assert r.weight_bytes_read(1) == pytest.approx(2 * A3B.active_params, rel=1e-9)  # 3.4B of 30.5B
    reads = [r.weight_bytes_read(t) for t in (1, 2, 8, 32, 128)]
    assert reads == sorted(reads) and len(set(reads)) == 5
    dense_model = RooflineModel(get_model("llama-3.1-8b"), H100)
    assert dense_model.weight_bytes_read(1) == dense_model.weight_bytes_read(512) == pytest.approx(16.06e9, rel=1e-3)


def test_memory_bound_decode_streams_the_touched_weights():
    r = RooflineModel(A3B, MEMORY_BOUND)
    bw = 3.35e12 * 0.8
    one = r.decode_time(1, 1) - OVERHEAD
    assert one == pytest.approx(r.weight_bytes_read(1) / bw, rel=0.01)  # activations and KV: < 1%
    big = r.decode_time(4096, 1) - OVERHEAD
    assert big > A3B.weight_bytes / bw
    # batch 64 touches 126 of 128 experts: the MoE's step costs nearly all its weights, unlike batch 1
    assert r.decode_time(64, 1) - OVERHEAD > 8 * one


def test_expert_parallel_all_to_all_grows_with_tokens():
    c = LatencyConfig()
    tp_only, ep = RooflineModel(A3B, H100, tp=4), RooflineModel(A3B, H100, tp=4, ep=4)
    link = 450e9 * c.tp_comm_efficiency
    per_token = 48 * (2 * 8 * 2048 * 2 * 3 / 4 / 4 - 2 * 3 / 4 * 2048 * 2) / link  # all-to-all in, all-reduce out
    fixed = 48 * (2 * c.alltoall_latency_s - math.ceil(math.log2(4)) * c.allreduce_latency_s)
    gaps = []
    for batch in (1, 16, 256):
        gap = ep.decode_time(batch, 1024) - tp_only.decode_time(batch, 1024)
        assert gap == pytest.approx(batch * per_token + fixed, rel=1e-6)
        gaps.append(gap)
    assert 0 < gaps[0] < gaps[1] < gaps[2]


def test_expert_parallel_half_of_tp_keeps_the_expert_all_reduce():
    c = LatencyConfig()
    link = 450e9 * c.tp_comm_efficiency
    ep4, ep2 = RooflineModel(A3B, H100, tp=4, ep=4), RooflineModel(A3B, H100, tp=4, ep=2)
    s = StepShape(decode_tokens=32, decode_ctx=32 * 1024)
    a2a = 48 * 2 * 8 * 2048 * 2 * 32 / link  # per token: k * hidden * bytes * (ep - 1) / ep / ep
    reduce2 = 48 * 2 * 1 / 2 * 2048 * 2 * 32 / link + 48 * c.allreduce_latency_s  # over tp / ep = 2 ranks
    assert ep2.step_time(s) - ep4.step_time(s) == pytest.approx(a2a * (1 / 4 - 3 / 16) + reduce2, rel=1e-6)


def test_expert_parallel_needs_experts_and_a_divisor_of_tp():
    with pytest.raises(ValueError, match="divisor"):
        RooflineModel(A3B, H100, tp=4, ep=3)
    with pytest.raises(ValueError, match="divisor"):
        RooflineModel(A3B, H100, tp=1, ep=2)
    with pytest.raises(ValueError, match="has none"):
        RooflineModel(get_model("llama-3.1-8b"), H100, tp=2, ep=2)
    with pytest.raises(ValueError, match="evenly"):
        RooflineModel(get_model("mixtral-8x7b", "fp8"), H100, tp=6, ep=6)
    assert latency_model(A3B, H100, tp=2, ep=2).ep == 2


def test_capacity_counts_every_expert():
    fp8 = get_model("qwen3-30b-a3b", "fp8")
    r = RooflineModel(fp8, H100)
    free = 80e9 * 0.9 - fp8.weight_bytes  # all 30.5B parameters, not the 3.3B active
    assert r.capacity_kv_tokens() == int(free // fp8.kv_bytes_per_token)
    ep = RooflineModel(fp8, H100, tp=2, ep=2)
    assert ep.capacity_kv_tokens() == int((2 * 80e9 * 0.9 - fp8.weight_bytes) // fp8.kv_bytes_per_token)
    with pytest.raises(ValueError, match="do not fit"):
        RooflineModel(get_model("qwen3-235b-a22b", "fp8"), H100, tp=2, ep=2).capacity_kv_tokens()
    assert RooflineModel(get_model("qwen3-235b-a22b", "fp8"), H100, tp=4, ep=4).capacity_kv_tokens() > 0


def test_dense_models_unchanged_by_the_moe_terms():
    l8 = get_model("llama-3.1-8b")
    r = RooflineModel(l8, H100, tp=2)
    assert r.ep == 1
    assert r.weight_bytes_read(1) == pytest.approx(l8.weight_bytes / 2, rel=1e-12)
