import dataclasses

import pytest

from fluidpd.specs.models import DTYPES, MODEL_NAMES, ModelSpec, get_model

GB = 1e9
GIB = 2**30


def test_catalog_names():
    assert set(MODEL_NAMES) == {
        "llama-3.3-70b",
        "llama-3.1-8b",
        "opt-13b",
        "opt-66b",
        "opt-175b",
        "qwen2.5-7b",
        "smollm2-135m",
        "llama-3.1-70b",
        "qwen3-8b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "mixtral-8x7b",
        "gemma-3-27b",
    }
    assert DTYPES == ("fp32", "bf16", "fp16", "fp8")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama-3.3-70b", 70.6e9),
        ("llama-3.1-8b", 8.03e9),
        ("opt-13b", 12.9e9),
        ("opt-66b", 65.7e9),
        ("opt-175b", 175e9),
        ("qwen2.5-7b", 7.6e9),
        ("smollm2-135m", 134.5e6),
        ("qwen3-30b-a3b", 30.5e9),
        ("qwen3-235b-a22b", 235e9),
        ("mixtral-8x7b", 46.7e9),
        ("gemma-3-27b", 27.0e9),  # the text model (27.4B with the vision tower)
    ],
)
def test_param_counts_within_1pct(name, expected):
    assert get_model(name).params == pytest.approx(expected, rel=0.01)


def test_param_counts_exact_against_published_checkpoints():
    # Hugging Face safetensors totals of the released checkpoints.
    assert get_model("llama-3.1-8b").params == 8_030_261_248
    assert get_model("llama-3.3-70b").params == 70_553_706_496
    assert get_model("qwen2.5-7b").params == 7_615_616_512
    assert get_model("smollm2-135m").params == 134_515_008
    assert get_model("llama-3.1-70b").params == 70_553_706_496
    assert get_model("qwen3-8b").params == 8_190_735_360
    assert get_model("qwen3-32b").params == 32_762_123_264
    assert get_model("qwen3-30b-a3b").params == 30_532_122_624
    assert get_model("qwen3-235b-a22b").params == 235_093_634_560
    assert get_model("mixtral-8x7b").params == 46_702_792_704


def test_smollm2_shape():
    m = get_model("smollm2-135m")
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.intermediate, m.vocab) == (
        30,
        576,
        9,
        3,
        64,
        1536,
        49152,
    )
    assert m.tied_embeddings and m.gated_mlp


def test_kv_bytes_70b_gqa_matches_seed():
    m = get_model("llama-3.3-70b")
    assert m.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert 512 * m.kv_bytes_per_token == 167_772_160  # the seed's ~168 MB per 512-token request


def test_kv_bytes_opt66b_matches_seed():
    m = get_model("opt-66b")
    kv512 = 512 * m.kv_bytes_per_token
    assert kv512 == 2 * 64 * 9216 * 2 * 512
    assert kv512 == pytest.approx(1.21e9, rel=0.005)
    assert kv512 / GIB == pytest.approx(1.125, abs=0.01)  # the paper's "1.13 GB"
    assert kv512 / (512 * get_model("llama-3.3-70b").kv_bytes_per_token) == pytest.approx(7.2, abs=0.05)


def test_flops_per_token_hand_computed():
    m = get_model("llama-3.1-8b")
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    mlp = 3 * 4096 * 14336
    assert m.flops_per_token == 2 * (32 * (attn + mlp) + 128256 * 4096) == 15_009_316_864
    opt = get_model("opt-13b")  # 2-matrix MLP, tied LM head still multiplies
    assert opt.flops_per_token == 2 * (40 * (4 * 5120**2 + 2 * 5120 * 20480) + 50272 * 5120)
    assert m.attn_flops_per_pair == 4 * 32 * 32 * 128


def test_dtypes_and_kv_dtype():
    bf = get_model("llama-3.3-70b")
    f8 = get_model("llama-3.3-70b", "fp8")
    assert bf.weight_bytes == 2 * bf.params and f8.weight_bytes == bf.params
    assert f8.kv_dtype == "fp8" and f8.kv_bytes_per_token == bf.kv_bytes_per_token // 2
    mixed = get_model("llama-3.3-70b", "fp8", kv_dtype="bf16")
    assert mixed.kv_bytes_per_token == bf.kv_bytes_per_token and mixed.weight_bytes == f8.weight_bytes
    assert get_model("opt-13b", "fp32").dtype_bytes == 4


def test_unknown_names_raise_with_list():
    with pytest.raises(ValueError, match=r"llama-3\.1-8b"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match="bf16"):
        get_model("opt-13b", "int4")
    with pytest.raises(ValueError):
        get_model("opt-13b", "bf16", kv_dtype="int8")


def test_frozen_and_validated():
    m = get_model("opt-13b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.n_layers = 1
    with pytest.raises(ValueError):
        dataclasses.replace(m, n_kv_heads=7)
    assert isinstance(m, ModelSpec)
