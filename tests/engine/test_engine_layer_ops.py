"""The fused layer ops (fused_ops.c) against their torch reference, for the native build and the
portable x86-64 one: the residual add and the KV slots exact; RoPE exact where torch rounds each
product (ATEN_CPU_CAPABILITY=default; its AVX2/AVX-512 addcmul fuses a multiply-add); RoPE, RMSNorm
and silu * up otherwise within a few fp32 ulps; a whole forward through either gives the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.arena import KVArena
from fluidpd.engine.kernels import KernelUnavailable
from fluidpd.engine.layer_ops import FusedLayerOps, TorchLayerOps, gelu_mul
from fluidpd.engine.model import _layer_ops
from fluidpd.engine.model_config import ModelConfig

# (heads, kv heads, head dim, hidden, intermediate): SmolLM2's, and one that leaves vector tails everywhere
SHAPES = [(9, 3, 64, 576, 1536), (6, 2, 20, 100, 37)]
BLOCK, BLOCKS, LAYERS, MAX_POS = 4, 12, 2, 64


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to a few fp32 roundings (6e-8 relative each) of the largest term: another sum order,
    exp or an FMA; a misplaced or missing row is off by O(1)."""
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item())


def _ops(shape, march):
    h, kv, d, hidden, inter = shape
    try:
        return TorchLayerOps(h, kv, d), FusedLayerOps(h, kv, d, hidden, inter, march=march)
    except KernelUnavailable as exc:
        pytest.skip(f"no {march} build here: {exc}")


def _step(ops, shape, n, g):
    kv, d = shape[1:3]
    arena = KVArena(
        num_layers=LAYERS, num_kv_heads=kv, head_dim=d, block_size=BLOCK, num_blocks=BLOCKS,
        total_bytes=BLOCKS * LAYERS * 2 * BLOCK * kv * d * 4, dtype=torch.float32, device="cpu",
    )  # fmt: skip
    arena.buffer.copy_(torch.randn(arena.buffer.shape, generator=g))
    slots = torch.randperm(BLOCKS * BLOCK, generator=g)[:n]
    freqs = torch.arange(MAX_POS)[:, None] * torch.rand(d // 2, generator=g)[None, :]
    pos = torch.randint(0, MAX_POS, (n,), generator=g)
    return ops.begin(pos, slots // BLOCK, slots % BLOCK, freqs.cos(), freqs.sin(), arena)


@pytest.mark.parametrize("march", ["native", "x86-64"])
@pytest.mark.parametrize("shape", SHAPES, ids=["smollm2", "odd"])
def test_fused_ops_equal_torch(shape, march):
    ref, fused = _ops(shape, march)
    h, kv, d, hidden, inter = shape
    for n in (1, 3, 8):
        g = torch.Generator().manual_seed(n * d)
        st_r, st_f = _step(ref, shape, n, g), _step(fused, shape, n, torch.Generator().manual_seed(n * d))
        assert torch.equal(st_r.arena.buffer, st_f.arena.buffer)

        xr, res = torch.randn(n, hidden, generator=g) * 3, torch.randn(n, hidden, generator=g) * 3
        w, xf = torch.randn(hidden, generator=g), xr.clone()
        for r in (res, None):
            yr, yf = ref.add_rms_norm(xr, r, w, 1e-5, st_r), fused.add_rms_norm(xf, r, w, 1e-5, st_f)
            assert torch.equal(xr, xf)  # the residual add, in place
            close(yf, yr)

        qkv = torch.randn(n, (h + 2 * kv) * d, generator=g) * 2
        out_r = ref.rope_kv(qkv.clone(), st_r, 1)
        out_f = fused.rope_kv(qkv_f := qkv.clone(), st_f, 1)
        exact = torch.backends.cpu.get_cpu_capability() == "DEFAULT"
        for a, b in zip(out_r, out_f, strict=True):
            assert torch.equal(a, b) if exact else close(b, a) is None
        assert out_f[0].data_ptr() == qkv_f.data_ptr()  # rotated in place: views of the qkv rows
        close(st_f.arena.buffer, st_r.arena.buffer)  # K/V in the same slots, nothing else moved
        assert not torch.equal(
            st_r.arena.buffer, _step(ref, shape, n, torch.Generator().manual_seed(n * d)).arena.buffer
        )

        gu = torch.randn(n, 2 * inter, generator=g) * 4
        gu[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 1e4])  # exp's clamps: silu -> -0 and -> x
        close(fused.silu_mul(gu, st_f), ref.silu_mul(gu, st_r))


def test_gelu_mul_is_geglu_with_tanh_gelu():
    """Gemma's MLP activation: the tanh approximation of GELU on the gate half, times the up half."""
    gu = torch.randn(5, 2 * 7, generator=torch.Generator().manual_seed(3)) * 3
    gate, up = gu[:, :7], gu[:, 7:]
    tanh_gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)))
    close(gelu_mul(gu.clone()), tanh_gelu * up)


def test_fused_begin_rejects_slots_it_cannot_write():
    _, fused = _ops(SHAPES[0], "native")
    st = _step(fused, SHAPES[0], 2, torch.Generator().manual_seed(0))
    with pytest.raises(IndexError):
        fused.begin(torch.tensor([0, MAX_POS]), st.slot_blocks, st.slot_offsets, st.cos, st.sin, st.arena)
    with pytest.raises(IndexError):
        fused.begin(st.positions, torch.tensor([0, BLOCKS]), st.slot_offsets, st.cos, st.sin, st.arena)
    with pytest.raises(ValueError, match="int64"):
        fused.begin(st.positions.int(), st.slot_blocks, st.slot_offsets, st.cos, st.sin, st.arena)


TINY = ModelConfig(
    architecture="llama", vocab_size=96, hidden_size=60, intermediate_size=44, num_layers=2, num_heads=6,
    num_kv_heads=2, head_dim=10, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
    tie_word_embeddings=False, attention_bias=False,
)  # fmt: skip


def test_forward_through_fused_and_torch_ops_agree(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    kw = dict(model=str(tmp_path / "config.json"), load_format="dummy", num_kv_blocks=16, quantization="none")
    kw |= dict(seed=5, attention="gather")  # head_dim 10: no paged kernel
    fused, ref = (LLMEngine(EngineConfig(layer_ops=k, **kw)) for k in ("fused", "torch"))
    assert (fused.model.layer_ops, ref.model.layer_ops) == ("fused", "torch")
    ids = list(range(3, 40))
    chunks = [20, 5, 1, 1, 9, 1]  # prefill, prefill over earlier context, decodes
    a, b = fused.prompt_logits(ids, chunks), ref.prompt_logits(ids, chunks)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())


def test_layer_ops_fall_back_to_torch(monkeypatch):
    cpu = torch.device("cpu")
    assert isinstance(_layer_ops(TINY, torch.bfloat16, cpu, "auto"), TorchLayerOps)
    with pytest.raises(ValueError, match="float32"):
        _layer_ops(TINY, torch.bfloat16, cpu, "fused")

    def unavailable(*a, **kw):
        raise KernelUnavailable("no compiler")

    monkeypatch.setattr("fluidpd.engine.model.FusedLayerOps", unavailable)
    with pytest.warns(RuntimeWarning, match="fall back to torch"):
        assert isinstance(_layer_ops(TINY, torch.float32, cpu, "auto"), TorchLayerOps)
    with pytest.raises(ValueError, match="unavailable: no compiler"):
        _layer_ops(TINY, torch.float32, cpu, "fused")
    with pytest.raises(ValueError, match="layer_ops"):
        EngineConfig(layer_ops="triton")
