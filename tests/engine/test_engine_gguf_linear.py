"""The `gguf` linear layer: GGUF Q4_1 / Q8_0 blocks read as shipped, against dequantise-then-matmul."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from engine_testdata import MAX_TOKENS, PROMPTS
from gguf import GGMLQuantizationType
from gguf.quants import quantize

import fluidpd.engine.gguf_linear as gl
from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, load_model
from fluidpd.engine.kernels import KernelUnavailable
from fluidpd.engine.linear import LINEARS, Fp16Linear
from fluidpd.engine.quantized import QuantizedTensor

# Stated tolerance: every output within ROUNDING * cols * eps32 * sum_k (|d q_k| + |m|) |x_k| of the
# float64 product of the exactly dequantised weights (the kernel sums d * sum(q x) + m * sum(x) in
# float32; a sum of n float32 terms errs by at most about n * eps of the sum of their magnitudes).
ROUNDING = 2.0
EPS32 = torch.finfo(torch.float32).eps
KINDS = ("Q4_1", "Q8_0")


def _weight(kind: str, rows: int, cols: int, seed: int = 0) -> tuple[QuantizedTensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.1 + 0.02  # an offset, so Q4_1's minimum m matters
    data = torch.from_numpy(quantize(w.numpy(), GGMLQuantizationType[kind]).copy())
    qt = QuantizedTensor(kind, (rows, cols), data)
    return qt, qt.dequantize()


def _magnitudes(qt: QuantizedTensor) -> torch.Tensor:
    """|d q| + |m| per weight, decoded from the blocks here (ggml's layout, independently of the kernel)."""
    rows, cols = qt.shape
    b = qt.data.numpy().reshape(rows, cols // 32, -1)
    d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float32))
    if qt.kind == "Q4_1":
        m = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float32))
        q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1).astype(np.float32)
    else:
        m = np.zeros_like(d)
        q = np.abs(b[..., 2:].view(np.int8).astype(np.float32))
    return torch.from_numpy((d * q + m).reshape(rows, cols))


def _check(lin: gl.GgufLinear, qt: QuantizedTensor, ref_w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = lin(x)
    exact = x.double() @ ref_w.double().t()
    bound = ROUNDING * qt.shape[1] * EPS32 * (x.abs().double() @ _magnitudes(qt).double().t())
    assert y.dtype == torch.float32 and y.shape == exact.shape
    assert ((y.double() - exact).abs() <= bound).all()
    return y


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(37, 96), (130, 160), (960, 576)])
def test_kernel_matches_dequantise_then_matmul(kind, shape):
    qt, ref_w = _weight(kind, *shape)
    lin = gl.GgufLinear(qt)
    for n in (1, 3, 8, 64):  # 64: the dequantise + torch.mm path
        x = torch.randn(n, shape[1], generator=torch.Generator().manual_seed(n))
        _check(lin, qt, ref_w, x)
    x = torch.randn(5, 2 * shape[1])[:, ::2]  # strided columns are copied, strided rows read in place
    _check(lin, qt, ref_w, x)
    _check(lin, qt, ref_w, torch.randn(5, shape[1] + 32)[:, : shape[1]])


@pytest.mark.parametrize("kind", KINDS)
def test_every_instruction_set_path_gives_the_same_bits(kind):
    qt, ref_w = _weight(kind, 131, 224, seed=3)
    lin, k = gl.GgufLinear(qt), gl.kernel()
    before = k.isa
    try:
        for n in (1, 2, 3, 8, 11):
            x = torch.randn(n, 224, generator=torch.Generator().manual_seed(n))
            outs = {}
            for isa in range(len(gl.ISAS)):
                outs[k.set_isa(isa)] = lin(x)
            assert 0 in outs  # the scalar path always exists
            for isa, y in outs.items():
                assert torch.equal(y, outs[0]), f"{gl.ISAS[isa]} differs from the scalar path"
            _check(lin, qt, ref_w, x)
    finally:
        k.set_isa(before)


def test_threads_split_rows_without_changing_a_bit():
    qt, _ = _weight("Q4_1", 1000, 256, seed=5)
    lin, x = gl.GgufLinear(qt), torch.randn(4, 256)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lin(x)
        torch.set_num_threads(4)  # more threads than cores is allowed, and each row is summed alike
        assert torch.equal(lin(x), one)
    finally:
        torch.set_num_threads(threads)


def test_the_pool_survives_back_to_back_calls_of_every_size():
    """Thousands of calls in a row, big and small, Q4_1 and Q8_0, linear and q8 and dequantise, on more threads
    than cores: workers join late or not at all (chunks claimed from one counter), and every result still
    equals the one-thread one."""
    shapes = [("Q4_1", 1000, 1, False), ("Q8_0", 130, 3, False), ("Q4_1", 64, 2, True), ("Q8_0", 2000, 8, True)]
    cases = [(gl.GgufLinear(_weight(k, r, 96, seed=r)[0], act8=a8), torch.randn(n, 96)) for k, r, n, a8 in shapes]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [lin(x) for lin, x in cases] + [cases[0][0].rows(torch.arange(0, 1000, 7))]
        torch.set_num_threads(3)
        for i in range(2000):
            lin, x = cases[i % 4]
            assert torch.equal(lin(x), want[i % 4])
            if i % 50 == 0:
                assert torch.equal(cases[0][0].rows(torch.arange(0, 1000, 7)), want[4])
    finally:
        torch.set_num_threads(threads)


def test_the_isa_env_var_forces_a_path():
    code = "import fluidpd.engine.gguf_linear as g; print(g.ISAS[g.kernel().isa])"
    env = {**os.environ, gl.ISA_ENV: "scalar"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "scalar"
    env[gl.ISA_ENV] = "avx9"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "must be one of" in bad.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_rows_are_the_exactly_dequantised_rows(kind):
    qt, ref_w = _weight(kind, 50, 64)
    lin = gl.GgufLinear(qt, lookups=True)
    ids = torch.tensor([[0, 7], [49, 7]])
    assert torch.equal(lin.rows(ids), ref_w[ids])
    with pytest.raises(IndexError):
        lin.rows(torch.tensor([50]))


def test_bias_nbytes_and_bad_input():
    qt, ref_w = _weight("Q4_1", 40, 64)
    bias = torch.randn(40)
    lin = LINEARS.build("gguf", qt, bias)
    x = torch.randn(2, 64)
    assert torch.allclose(lin(x), x @ ref_w.t() + bias, atol=1e-5)
    assert lin.nbytes == 40 * 2 * 20 + 40 * 4  # the blocks as shipped (20 bytes per 32 weights) and the bias
    with pytest.raises(ValueError, match="float32"):
        lin(x.double())
    with pytest.raises(ValueError, match="whole blocks"):
        QuantizedTensor("Q4_1", (4, 40), torch.zeros(4, 25, dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be one of"):
        QuantizedTensor("Q5_K", (4, 32), torch.zeros(4, 20, dtype=torch.uint8))


def test_fusing_rows_concatenates_blocks_and_mixed_kinds_fall_back_to_float():
    a, wa = _weight("Q4_1", 8, 64, seed=1)
    b, wb = _weight("Q4_1", 4, 64, seed=2)
    c, wc = _weight("Q8_0", 4, 64, seed=3)
    fused = torch.cat([a, b])
    assert isinstance(fused, QuantizedTensor) and fused.shape == (12, 64)
    assert torch.equal(fused.dequantize(), torch.cat([wa, wb]))
    mixed = torch.cat([a, c])
    assert isinstance(mixed, torch.Tensor) and torch.equal(mixed, torch.cat([wa, wc]))
    assert a.to(torch.float32) is a


def test_float_weights_and_a_missing_kernel_fall_back_to_fp16(monkeypatch):
    qt, _ = _weight("Q8_0", 16, 64)
    assert isinstance(LINEARS.build("gguf", torch.randn(16, 64)), Fp16Linear)

    def unavailable():
        raise KernelUnavailable("no C compiler")

    monkeypatch.setattr(gl, "kernel", unavailable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lin = LINEARS.build("gguf", qt)
    assert isinstance(lin, Fp16Linear)
    assert any("falls back to fp16" in str(w.message) for w in caught)


def test_auto_is_gguf_for_a_gguf_on_the_cpu_in_float32():
    assert EngineConfig().weight_format == "gguf"
    assert EngineConfig(load_format="dummy").weight_format == "fp16"
    assert EngineConfig(dtype="bfloat16").weight_format == "none"
    with pytest.raises(ValueError, match="runs on the CPU in float32"):
        EngineConfig(quantization="gguf", dtype="bfloat16")


@pytest.fixture(scope="module")
def gguf_model():
    return load_model(EngineConfig())


def test_smollm2_streams_the_blocks_as_shipped(gguf_model, smol):
    model = gguf_model[0]
    assert model.quantization == "gguf"
    assert 95e6 < model.weight_bytes() < 98e6  # 96.6 MB: the file's Q4_1 layers, Q8_0 embedding, F32 norms
    ids = torch.tensor([0, 17, 4000, 49151])
    assert torch.equal(model.embed_tokens(ids), smol[0].embed_tokens(ids))  # Q8_0 rows, exactly dequantised


@pytest.mark.slow
def test_smollm2_greedy_outputs_equal_the_reference(gguf_model, reference):
    model, tok = gguf_model
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    alone = LLMEngine(EngineConfig(num_kv_blocks=64), model=model, tokenizer=tok)
    assert [alone.generate([p], params)[0].token_ids for p in PROMPTS] == reference
    batched = LLMEngine(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=16), model=model, tokenizer=tok)
    assert [o.token_ids for o in batched.generate(PROMPTS, params)] == reference


def _q8_reference(qt: QuantizedTensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's int8-activation product in float64 from the exact integers, and its rounding bound."""
    rows, cols = qt.shape
    xb = x.float().reshape(x.shape[0], cols // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0  # float32 operations, as the kernel's
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv).clamp(-127, 127)  # torch.round: to nearest-even
    s = d.squeeze(-1).double() * q.sum(-1).double()
    b = qt.data.numpy().reshape(rows, cols // 32, -1)
    dw = torch.from_numpy(b[..., 0:2].copy().view(np.float16).astype(np.float64)).squeeze(-1)
    if qt.kind == "Q4_1":
        mw = torch.from_numpy(b[..., 2:4].copy().view(np.float16).astype(np.float64)).squeeze(-1)
        wq = torch.from_numpy(np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1).astype(np.float64))
    else:
        mw = torch.zeros_like(dw)
        wq = torch.from_numpy(b[..., 2:].view(np.int8).astype(np.float64))
    dots = torch.einsum("nbk,rbk->nrb", q.double(), wq)  # exact integers
    terms = dw[None] * d.squeeze(-1).double()[:, None] * dots + mw[None] * s[:, None]
    mags = (dw.abs()[None] * d.squeeze(-1).double()[:, None]) * torch.einsum("nbk,rbk->nrb", q.abs().double(), wq.abs())
    mags = mags + mw.abs()[None] * s.abs()[:, None]
    return terms.sum(-1), ROUNDING * cols * EPS32 * mags.sum(-1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(37, 96), (130, 160), (960, 576)])
def test_q8_kernel_is_llama_cpp_arithmetic(kind, shape):
    qt, ref_w = _weight(kind, *shape)
    lin = gl.GgufLinear(qt, act8=True)
    for n in (1, 3, 8, 64):  # the kernel at every batch size
        x = torch.randn(n, shape[1], generator=torch.Generator().manual_seed(n))
        x[0, :32] = 0.0  # an all-zero block quantises to scale 0
        y = lin(x)
        ref, bound = _q8_reference(qt, x)
        assert y.dtype == torch.float32 and y.shape == ref.shape
        assert ((y.double() - ref).abs() <= bound).all()
        exact = x.double() @ ref_w.double().t()  # int8 activations drift from the exact product, boundedly
        scale = x.abs().double() @ ref_w.abs().double().t()
        assert ((y.double() - exact).abs() <= 0.02 * scale).all()


@pytest.mark.parametrize("kind", KINDS)
def test_q8_every_instruction_set_path_and_batch_gives_the_same_bits(kind):
    qt, _ = _weight(kind, 131, 224, seed=3)
    lin, k = gl.GgufLinear(qt, act8=True), gl.kernel()
    before = k.isa
    x = torch.randn(11, 224, generator=torch.Generator().manual_seed(4))
    try:
        outs = {k.set_isa(isa): lin(x) for isa in range(len(gl.ISAS))}
        for isa, y in outs.items():
            assert torch.equal(y, outs[0]), f"{gl.ISAS[isa]} differs from the scalar path"
        alone = torch.cat([lin(x[i : i + 1]) for i in range(11)])
        assert torch.equal(alone, outs[0])  # a row's result does not depend on its batch
    finally:
        k.set_isa(before)


def test_gguf_q8_is_registered_and_configurable(monkeypatch):
    qt, _ = _weight("Q4_1", 40, 64)
    lin = LINEARS.build("gguf-q8", qt)
    assert isinstance(lin, gl.GgufLinear) and lin.mm_from_rows is None
    assert isinstance(LINEARS.build("gguf-q8", torch.randn(16, 64)), Fp16Linear)
    assert EngineConfig(quantization="gguf-q8").weight_format == "gguf-q8"

    def unavailable():
        raise KernelUnavailable("no C compiler")

    monkeypatch.setattr(gl, "kernel", unavailable)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert isinstance(LINEARS.build("gguf-q8", qt), Fp16Linear)


@pytest.mark.slow
def test_smollm2_gguf_q8_generates_the_references_first_tokens(reference):
    config = EngineConfig(num_kv_blocks=64, quantization="gguf-q8")
    model, tok = load_model(config)
    assert model.quantization == "gguf-q8" and 95e6 < model.weight_bytes() < 98e6
    engine = LLMEngine(config, model=model, tokenizer=tok)
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=2, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r[:2] for r in reference]  # drifts later (docs/engine.md)
