"""Mixtures of experts and sliding windows in the model specs: active parameters, FLOPs and windowed KV."""

import dataclasses

import pytest

from fluidpd.specs.models import get_model


def test_qwen3_counts_its_qk_norms_and_untied_head():
    m = get_model("qwen3-8b")
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    layer = attn + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128  # two norms, q_norm and k_norm of head_dim
    assert m.params == 36 * layer + 2 * 151936 * 4096 + 4096
    assert m.active_params == m.params and m.expert_weight_bytes == 0


def test_gemma3_four_norms_per_layer_tied_embeddings():
    m = get_model("gemma-3-27b")
    attn = 5376 * (32 * 128 + 2 * 16 * 128) + 32 * 128 * 5376
    layer = attn + 3 * 5376 * 21504 + 4 * 5376 + 2 * 128
    assert m.params == 62 * layer + 262208 * 5376 + 5376 == 27_009_346_304


@pytest.mark.parametrize(
    "name, active",
    [("qwen3-30b-a3b", 3.3e9), ("qwen3-235b-a22b", 22.2e9), ("mixtral-8x7b", 12.9e9)],
)
def test_active_params_of_the_published_moes(name, active):
    assert get_model(name).active_params == pytest.approx(active, rel=0.02)


def test_moe_counts_every_expert_and_the_router_once():
    m = get_model("qwen3-30b-a3b")
    expert = 3 * 2048 * 768
    assert m.expert_params == expert and m.router_params == 2048 * 128
    assert m.mlp_params_per_layer == 128 * expert + 2048 * 128
    assert m.active_mlp_params_per_layer == 8 * expert + 2048 * 128
    assert m.params - m.active_params == 48 * 120 * expert
    assert m.expert_weight_bytes == 48 * 128 * expert * 2
    assert get_model("qwen3-30b-a3b", "fp8").expert_weight_bytes == 48 * 128 * expert


def test_moe_flops_scale_with_k_not_e():
    m = get_model("qwen3-30b-a3b")
    more_experts = dataclasses.replace(m, n_experts=256)
    more_active = dataclasses.replace(m, experts_per_token=16)
    router = 2 * 48 * 2048 * 128  # the router's GEMM grows with E, and only it
    assert more_experts.flops_per_token - m.flops_per_token == router
    assert more_active.flops_per_token - m.flops_per_token == 2 * 48 * 8 * m.expert_params
    assert more_experts.expert_weight_bytes == 2 * m.expert_weight_bytes


def test_sliding_window_kv_caps_windowed_layers():
    m = get_model("gemma-3-27b")
    assert (m.sliding_window, m.sliding_layers, m.n_layers) == (1024, 52, 62)
    per_layer = 2 * 16 * 128 * 2
    assert m.kv_bytes_per_token == 62 * per_layer
    assert m.kv_bytes(1000) == 1000 * m.kv_bytes_per_token  # inside the window: every layer
    assert m.kv_bytes(1024) == 1024 * m.kv_bytes_per_token
    assert m.kv_bytes(100_000) == per_layer * (10 * 100_000 + 52 * 1024)
    assert m.kv_bytes(100_001) - m.kv_bytes(100_000) == 10 * per_layer  # past it: global layers only
    full = get_model("llama-3.1-8b")
    assert full.kv_bytes(100_000) == 100_000 * full.kv_bytes_per_token
    assert get_model("mixtral-8x7b").sliding_window == 0  # v0.1's config: "sliding_window": null


def test_moe_and_window_fields_validated():
    m = get_model("llama-3.1-8b")
    with pytest.raises(ValueError, match="experts_per_token"):
        dataclasses.replace(m, n_experts=8, experts_per_token=9)
    with pytest.raises(ValueError, match="n_experts"):
        dataclasses.replace(m, experts_per_token=2)
    with pytest.raises(ValueError, match="window"):
        dataclasses.replace(m, sliding_window=1024)
    with pytest.raises(ValueError, match="sliding_layers"):
        dataclasses.replace(m, sliding_window=1024, sliding_layers=33)
