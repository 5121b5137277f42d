"""The paged decode kernel: equal to gather + SDPA on random pages, the engine's outputs equal
through either path, and a clear fallback where it cannot be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_testdata import MAX_TOKENS, PROMPTS

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, load_model
from fluidpd.engine.kernels import KernelUnavailable, load
from fluidpd.engine.loaders import load_checkpoint
from fluidpd.engine.model import _paged_kernel
from fluidpd.engine.paged_attention import PagedDecodeAttention, PagedDecodes


def _reference(q, kc, vc, tables, ctx):
    """Each row alone: its pages gathered, one SDPA over its own context (GQA by repeat)."""
    h, kv = q.shape[1], kc.shape[2]
    out = []
    for b, n in enumerate(ctx):
        k = kc[tables[b]].flatten(0, 1)[:n].transpose(0, 1).repeat_interleave(h // kv, 0)
        v = vc[tables[b]].flatten(0, 1)[:n].transpose(0, 1).repeat_interleave(h // kv, 0)
        out.append(F.scaled_dot_product_attention(q[b][:, None], k, v).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "bs"),
    [(9, 3, 64, 16), (9, 3, 64, 8), (8, 2, 64, 16), (32, 4, 128, 16), (6, 6, 24, 16)],
)
def test_kernel_equals_gather_and_sdpa(heads, kv_heads, head_dim, bs):
    """Common shapes at block size 16 take the kernel's constant-shape paths; block size 8 the general one."""
    g = torch.Generator().manual_seed(heads * head_dim)
    num_blocks, layers = 80 * 16 // bs, 2
    arena = torch.randn(num_blocks, layers, 2, bs, kv_heads, head_dim, generator=g)
    kc, vc = arena[:, 1, 0], arena[:, 1, 1]  # strided views, as the arena hands out
    ctx = [1, 7, 8, 9, 16, 17, 100, 255]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for n in ctx:
        nb = -(-n // bs)
        tables.append(perm[used : used + nb])
        used += nb
    width = max(map(len, tables))
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qk = torch.randn(len(ctx), heads + kv_heads, head_dim, generator=g) * 3
    q = qk[:, :heads]  # rows strided like the model's q
    rows = PagedDecodes(0, len(ctx), padded, torch.tensor(ctx, dtype=torch.int32), torch.empty(heads * max(ctx)))
    out = PagedDecodeAttention(heads, kv_heads, head_dim)(q, kc, vc, rows)
    ref = _reference(q, kc, vc, [torch.tensor(t) for t in tables], ctx)
    assert out.shape == (len(ctx), heads * head_dim)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_kernel_rejects_what_it_cannot_run():
    with pytest.raises(KernelUnavailable, match="head_dim"):
        PagedDecodeAttention(64, 2, 64)  # 32 query heads per KV head
    att = PagedDecodeAttention(9, 3, 64)
    rows = PagedDecodes(0, 1, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), torch.empty(9))
    kc = torch.zeros(2, 16, 3, 64)
    with pytest.raises(ValueError, match="float32"):
        att(torch.zeros(1, 9, 64, dtype=torch.float64), kc, kc, rows)
    with pytest.raises(ValueError, match="query rows"):
        att(torch.zeros(2, 9, 64), kc, kc, rows)
    with pytest.raises(ValueError, match="int32 tables"):
        PagedDecodes(0, 2, torch.zeros(1, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32), torch.empty(9))
    with pytest.raises(ValueError, match="int32"):
        PagedDecodes(0, 1, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int32), torch.empty(9))


@pytest.fixture(scope="module")
def smol_gather():
    return load_model(EngineConfig(quantization="none", attention="gather"))


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
def test_engine_outputs_equal_through_paged_and_gather(smol, smol_gather, kv_dtype):
    """The same batch of greedy requests through both decode paths (reading the same float16 or float32 KV
    pages): same tokens, logprobs within 1e-4 over float32 KV. Over float16 KV within 5e-3 (measured 8e-4):
    the paths' fp32 attention outputs differ by a few ulps, and where that moves a later K/V element across
    a float16 rounding boundary, the pages differ by a float16 ulp (5e-4 relative) from there on."""
    assert smol[0].attention == "paged" and smol_gather[0].attention == "gather"
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    outs = []
    for model, tok in (smol, smol_gather):
        cfg = EngineConfig(quantization="none", num_kv_blocks=128, kv_cache_dtype=kv_dtype)
        eng = LLMEngine(cfg, model=model, tokenizer=tok)
        assert str(eng.arena.dtype) == f"torch.{kv_dtype}"
        outs.append(eng.generate(PROMPTS, params))
    for paged, gather in zip(*outs):
        assert paged.token_ids == gather.token_ids
        lp = torch.tensor([x.logprob for x in paged.logprobs]), torch.tensor([x.logprob for x in gather.logprobs])
        torch.testing.assert_close(lp[0], lp[1], atol=1e-4 if kv_dtype == "float32" else 5e-3, rtol=0)


def test_config_and_shared_model_checks(smol):
    with pytest.raises(ValueError, match="CPU in float32"):
        EngineConfig(attention="paged", dtype="bfloat16")
    with pytest.raises(ValueError, match="attention"):
        EngineConfig(attention="flash")
    model, tok = smol
    with pytest.raises(ValueError, match="decode attention is 'paged'"):
        LLMEngine(EngineConfig(quantization="none", attention="gather"), model=model, tokenizer=tok)


@pytest.mark.slow
def test_no_compiler_falls_back_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("FLUIDPD_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(KernelUnavailable):
        load.__wrapped__("paged_attention")
    load.cache_clear()
    cfg = load_checkpoint("smollm2", "dummy").config
    try:
        with pytest.warns(RuntimeWarning, match="falls back to page gathers"):
            assert _paged_kernel(cfg, torch.float32, torch.device("cpu"), "auto") is None
        with pytest.raises(ValueError, match="paged attention unavailable"):
            _paged_kernel(cfg, torch.float32, torch.device("cpu"), "paged")
    finally:
        monkeypatch.undo()
        load.cache_clear()
    assert list(tmp_path.iterdir()) == [tmp_path / "kernels"]  # nothing half-built left behind
    assert not list((tmp_path / "kernels").iterdir())


def test_build_is_cached_per_source_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("FLUIDPD_CACHE", str(tmp_path))
    load.__wrapped__("paged_attention")
    load.__wrapped__("paged_attention")
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
