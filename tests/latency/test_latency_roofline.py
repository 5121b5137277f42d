import pytest

from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

H100 = get_hardware("h100")
L8 = get_model("llama-3.1-8b")
L70 = get_model("llama-3.3-70b")


def test_batch1_decode_is_weight_streaming():
    r = RooflineModel(L8, H100)
    expected = L8.weight_bytes / (3.35e12 * 0.8) + 2e-3  # ~8.0 ms
    assert r.decode_time(1, 1) == pytest.approx(expected, rel=0.02)
    compute = L8.flops_per_token / (989e12 * 0.5)
    assert compute < 0.01 * r.decode_time(1, 1)  # memory-bound by far


def test_long_prefill_is_compute_bound():
    r = RooflineModel(L8, H100)
    s = 8192
    gemm = 2 * (L8.matmul_params - L8.vocab * L8.hidden) * s + 2 * L8.vocab * L8.hidden  # LM head: 1 row
    attn = L8.attn_flops_per_pair * s * (s + 1) / 2
    expected = gemm / (989e12 * 0.5) + attn / (989e12 * 0.4) + 2e-3
    assert r.prefill_time(s) == pytest.approx(expected, rel=0.02)
    assert L8.weight_bytes / (3.35e12 * 0.8) < 0.05 * r.prefill_time(s)


def test_seed_notional_single_h100_prefill():
    # DistServe seed: 512-token prefill of the 70B model at 50 % MFU on one H100, D ~ 0.15 s.
    assert RooflineModel(L70, H100).prefill_time(512) == pytest.approx(0.15, rel=0.1)


def test_monotone_in_tokens_and_context():
    r = RooflineModel(L70, H100, tp=4)
    prev = 0.0
    for n in (1, 16, 64, 128, 256, 512, 1024, 4096):
        t = r.prefill_time(n)
        assert t >= prev
        prev = t
    prev = 0.0
    for ctx in (0, 128, 1024, 8192, 32768):
        t = r.decode_time(32, ctx)
        assert t > prev or ctx == 0
        prev = t
    assert r.prefill_time(512, prior=4096) > r.prefill_time(512)
    assert r.decode_time(64, 1024) > r.decode_time(32, 1024)


def test_mixed_step_costs_more_than_either_part():
    r = RooflineModel(L8, H100)
    s = StepShape()
    s.add_decodes(64, 64 * 2048)
    dec = r.step_time(s)
    s.add_chunk(1024, 0)
    assert s.tokens == 1088
    assert r.step_time(s) > max(dec, r.prefill_time(1024))
    assert r.step_time(StepShape()) == 0.0


def test_tensor_parallel_speedup_between_1_and_2():
    r1, r2 = RooflineModel(L70, H100, tp=1), RooflineModel(L70, H100, tp=2)
    for t1, t2 in ((r1.prefill_time(512), r2.prefill_time(512)), (r1.decode_time(32, 1024), r2.decode_time(32, 1024))):
        assert 1.0 < t1 / t2 < 2.0


def test_pipeline_step_vs_stage():
    r1 = RooflineModel(L70, H100, tp=2)
    r2 = RooflineModel(L70, H100, tp=2, pp=2)
    s = StepShape(decode_tokens=32, decode_ctx=32 * 1024)
    assert r1.step_time(s) == r1.stage_time(s)
    assert r2.step_time(s) > r2.stage_time(s)
    assert r2.step_time(s) >= r1.step_time(s)  # PP does not shorten a token's path
    assert r2.stage_time(s) < 0.7 * r1.stage_time(s)  # but it raises throughput


def test_fp8_on_a100_raises():
    with pytest.raises(ValueError, match="fp8"):
        RooflineModel(get_model("llama-3.1-8b", "fp8"), get_hardware("a100-80g"))
    RooflineModel(get_model("llama-3.1-8b", "fp8"), H100)  # fine on H100


def test_fp8_halves_decode_weight_time():
    t16 = RooflineModel(L70, H100, tp=8).decode_time(1, 1)
    t8 = RooflineModel(get_model("llama-3.3-70b", "fp8"), H100, tp=8).decode_time(1, 1)
    assert 0.5 < t8 / t16 < 0.8


def test_kv_transfer_times_match_seed():
    r = RooflineModel(L70, H100, tp=2)
    nbytes = r.kv_bytes(512)
    assert nbytes == 167_772_160
    # We pass the link rate explicitly: 900 GB/s is H100's aggregate bidirectional NVLink figure,
    # a one-way copy gets half of it (the seed's 0.37 ms).
    assert r.kv_transfer_time(nbytes, 900e9) * 1e3 == pytest.approx(0.186, rel=0.01)
    assert r.kv_transfer_time(nbytes, H100.nvlink_bw_unidir) * 1e3 == pytest.approx(0.37, rel=0.02)
    assert r.kv_transfer_time(nbytes, 25e9 / 8) * 1e3 == pytest.approx(54, rel=0.01)
    assert r.kv_transfer_time(nbytes, 25e9 / 8, cap_fraction=0.5) * 1e3 == pytest.approx(107.4, rel=0.01)
    with pytest.raises(ValueError):
        r.kv_transfer_time(nbytes, 900e9, cap_fraction=0.0)


def test_weight_load_time():
    r = RooflineModel(L70, H100, tp=4)
    assert r.weight_load_time(25e9) == pytest.approx(L70.weight_bytes / 4 / 25e9)


def test_capacity_and_blocks():
    r = RooflineModel(L70, H100, tp=2)
    tokens = r.capacity_kv_tokens(scratch_fraction=0.0)
    assert tokens == (160e9 - L70.weight_bytes) // 327_680  # ~57.6k tokens
    assert tokens // 1024 == pytest.approx(59, abs=4)  # the seed's ~59 requests of 1024 tokens
    assert r.kv_blocks(16, scratch_fraction=0.0) == tokens // 16
    assert r.capacity_kv_tokens(0.1) == int((144e9 - L70.weight_bytes) // 327_680)
    assert r.kv_blocks(16, scratch_bytes=1e9) < r.kv_blocks(16)


def test_capacity_errors():
    with pytest.raises(ValueError, match="do not fit"):
        RooflineModel(L70, H100).capacity_kv_tokens()
    with pytest.raises(ValueError, match="do not fit"):
        RooflineModel(get_model("opt-175b"), get_hardware("a100-80g"), tp=4).capacity_kv_tokens()
    with pytest.raises(ValueError):
        RooflineModel(L70, H100, tp=2).capacity_kv_tokens(scratch_fraction=0.2)  # 128 GB < 141 GB


def test_replicated_kv_heads_cost_capacity():
    m = get_model("smollm2-135m")  # 3 KV heads: TP=2 keeps 2 heads per rank
    r = RooflineModel(m, H100, tp=2)
    free = 160e9 * 0.9 - m.weight_bytes
    assert r.capacity_kv_tokens() == int(free // (m.kv_bytes_per_token * 4 / 3))


def test_bad_parallelism():
    with pytest.raises(ValueError):
        RooflineModel(L8, H100, tp=0)
    with pytest.raises(ValueError):
        RooflineModel(L8, H100, pp=33)


def test_custom_config_changes_time():
    base = RooflineModel(L8, H100).decode_time(1, 1)
    slow = RooflineModel(L8, H100, config=LatencyConfig(bw_efficiency=0.4)).decode_time(1, 1)
    assert slow - 2e-3 == pytest.approx(2 * (base - 2e-3), rel=0.01)


def _layers_general(m: RooflineModel, s: StepShape, tok: int) -> float:
    """`_layers` as written before its dense shortcut: the weights always through `_weights_s`."""
    dense_c = tok * m._t_tok + (s.prefill_seqs + s.decode_tokens) * m._t_row
    dense_m = m._weights_s(tok) + tok * m._t_act
    pairs = s.prefill_attn_pairs + s.decode_ctx
    reads: float = s.prefill_kv_read + s.decode_ctx
    if m._window:
        w, f = m._window, m._windowed
        recent = min(s.decode_ctx, s.decode_tokens * w)
        pairs -= f * (pairs - min(s.prefill_attn_pairs, s.prefill_tokens * w) - recent)
        reads -= f * (reads - min(s.prefill_kv_read, s.prefill_seqs * w) - recent)
    attn_c, attn_m, k = pairs * m._t_pair, (reads + tok) * m._t_kv, m._exposed
    dense = dense_c + k * dense_m if dense_c > dense_m else dense_m + k * dense_c
    attn = attn_c + k * attn_m if attn_c > attn_m else attn_m + k * attn_c
    return dense + attn + tok * m._ar_tok + m._ar_fixed


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.3-70b", "gemma-3-27b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_step_times_are_bit_identical_to_the_general_weights_path(name):
    import random

    dtype = "fp8" if name == "llama-3.3-70b" else "bf16"
    m = RooflineModel(get_model(name, dtype), get_hardware("h100"), tp=2 if name == "mixtral-8x7b" else 1)
    rng = random.Random(1)
    for _ in range(300):
        s = StepShape()
        for _ in range(rng.randint(0, 3)):
            s.add_chunk(rng.randint(1, 4096), rng.randint(0, 8192))
        s.add_decodes(n := rng.randint(0, 256), n * rng.randint(1, 4096))
        tok = s.prefill_tokens + s.decode_tokens
        if tok:
            assert m._layers(s, tok) == _layers_general(m, s, tok)  # exact: not approx
