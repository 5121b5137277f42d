"""The engine on one device (`--device`: cpu in the suite, cuda in the GPU check's `engine` part), on a
tiny random-weight Llama written here (no SmolLM2, no network): logits against transformers on the same
device in float32 and bfloat16, prefill chunks and decode steps; decode attention over scattered pages
against a dense reference; prefix caching; KV resize around live requests; a KV export / import between
two engines. The token-equality tests compare runs whose batches are the same step for step, so their
tokens are equal bit for bit in either dtype; prefix caching changes the batches and runs in float32."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from engine_tolerance import logits_tol

from fluidpd.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, load_model
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.sequence import Sequence

transformers = pytest.importorskip("transformers")

DTYPES = ("float32", "bfloat16")
IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 26, 50, 8, 90, 1, 45, 19, 77, 30]
CHUNKS = [7, 5, 1, 1, 3, 1, 1, 1]  # prefill chunks after earlier context, and decode steps (chunks of 1)
PROMPTS = [IDS, list(range(40, 75)), [7, 7, 90, 3]]
SHARED = [*PROMPTS[1][:32], 11, 12, 13]  # two full blocks in common with PROMPTS[1]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
# (tokens before the step, tokens in it) of one attention step: prefill chunks first, then decodes by
# context length (the order the runner lays the rows out in)
ATTEND = [(20, 6), (0, 5), (0, 1), (8, 1), (15, 1), (16, 1), (33, 1), (70, 1)]
ATTEND_TOL = {"float32": 1e-4, "bfloat16": 5e-2}  # outputs up to ~3 (measured 2e-7, 7e-3): a misread page errs by ~1


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(config, float32 weights, a safetensors checkpoint of them)."""
    from safetensors.torch import save_file

    cfg = tiny_config("llama", vocab_size=96)
    tensors = random_tensors(cfg, torch.float32, seed=7)
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(tensors, str(path / "model.safetensors"))
    return cfg, tensors, path


@pytest.fixture(scope="module")
def tiny_engine(ckpt, device):
    """make(dtype, **config): an engine on `device`, KV in the model dtype; one model per dtype, shared."""
    path, models = str(ckpt[2]), {}

    def make(dtype: str = "float32", **kw) -> LLMEngine:
        base = dict(model=path, device=device, dtype=dtype, quantization="none")
        if dtype not in models:
            models[dtype] = load_model(EngineConfig(**base))
        config = EngineConfig(**{**base, "kv_cache_dtype": dtype, "num_kv_blocks": 32, **kw})
        return LLMEngine(config, model=models[dtype][0])

    return make


def drain(eng: LLMEngine) -> dict[str, RequestOutput]:
    outs: dict[str, RequestOutput] = {}
    while eng.has_unfinished():
        outs |= {o.request_id: o.output for o in eng.step() if o.finished}
    return outs


def hf_logits(cfg, tensors: dict[str, torch.Tensor], ids: list[int], device: str) -> torch.Tensor:
    """transformers' logits of `ids` with `tensors`, in float64 on `device` (exact for either dtype)."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf())).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    model = model.double().to(device)
    with torch.no_grad():
        return model(torch.tensor([ids], device=device)).logits[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_match_transformers_prefill_and_decode(ckpt, tiny_engine, device, dtype):
    cfg, tensors, _ = ckpt
    eng, wdt = tiny_engine(dtype), getattr(torch, dtype)
    assert eng.arena.buffer.device.type == torch.device(device).type and eng.arena.dtype == wdt
    assert eng.model.lm_head.weight.dtype == wdt
    # the engine's weights (rounded to the dtype), computed exactly: what is left is the engine's arithmetic
    ref = hf_logits(cfg, {k: v.to(wdt).float() for k, v in tensors.items()}, IDS, device)
    tol = logits_tol(cfg, len(IDS), wdt, ref.abs().max().item())
    prefill = eng.prompt_logits(IDS)  # one chunk
    steps = eng.prompt_logits(IDS, CHUNKS)  # chunks over earlier context, then decode steps
    assert prefill.dtype == steps.dtype == torch.float32 and prefill.device == ref.device
    for got in (prefill, steps):
        assert (got.double() - ref).abs().max().item() <= tol, dtype
    if dtype == "float32":
        assert torch.equal(prefill.argmax(-1), ref.argmax(-1))


def dense_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, chunks) -> torch.Tensor:
    """Each chunk's queries over its pages, causal, in float64: [rows, H*D]."""
    out, row = [], 0
    h, kv, d = q.shape[1], kc.shape[2], q.shape[2]
    for seq, n in chunks:
        t, start = seq.num_computed + n, seq.num_computed
        k = kc[seq.block_table].flatten(0, 1)[:t].double().repeat_interleave(h // kv, 1)  # [t, H, D]
        v = vc[seq.block_table].flatten(0, 1)[:t].double().repeat_interleave(h // kv, 1)
        s = torch.einsum("nhd,thd->hnt", q[row : row + n].double(), k) * d**-0.5
        keys, queries = torch.arange(t, device=q.device), torch.arange(start, t, device=q.device)
        s = s.masked_fill(keys[None, None, :] > queries[None, :, None], float("-inf"))
        out.append(torch.einsum("hnt,thd->nhd", s.softmax(-1), v).reshape(n, h * d))
        row += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_over_scattered_pages_matches_dense(tiny_engine, device, dtype):
    """One step's attention of a layer (KV write included) over random pages in shuffled blocks: the paged
    kernel on the CPU in float32, gathered decode groups elsewhere (one padded group on a GPU)."""
    eng = tiny_engine(dtype)
    arena, bs, layer = eng.arena, eng.config.block_size, eng.model.layers[1]
    g = torch.Generator().manual_seed(1)
    arena.kv.copy_(torch.randn(arena.kv.shape, generator=g))
    perm, chunks = torch.randperm(arena.num_blocks, generator=g).tolist(), []
    for i, (ctx, n) in enumerate(ATTEND):
        seq = Sequence(f"s{i}", list(range(ctx + n)), ctx + n, SamplingParams(max_tokens=1))
        seq.num_computed, seq.block_table = ctx, perm[: -(-(ctx + n) // bs)]
        perm = perm[len(seq.block_table) :]
        chunks.append((seq, n))
    ids, pos, meta, _, _ = eng.runner.prepare(chunks)
    assert pos.tolist() == [p for c, n in ATTEND for p in range(c, c + n)]  # rows in ATTEND's order
    on_cpu = torch.device(device).type == "cpu"
    assert (meta.paged is not None) == (on_cpu and dtype == "float32")
    assert on_cpu or len(meta.decodes) == 1
    mc, dt = eng.model_config, getattr(torch, dtype)
    q = torch.randn(len(ids), mc.num_heads, mc.head_dim, generator=g).to(device, dt)
    k, v = (torch.randn(len(ids), mc.num_kv_heads, mc.head_dim, generator=g).to(device, dt) for _ in "kv")
    out = layer.attention(q, k, v, meta, arena, 1)
    ref = dense_attention(q, arena.k_layers[1], arena.v_layers[1], chunks)
    torch.testing.assert_close(out.double(), ref, atol=ATTEND_TOL[dtype], rtol=0)


def test_prefix_cache_hit_changes_no_token(tiny_engine):
    eng = tiny_engine(enable_prefix_caching=True)
    first = eng.generate([PROMPTS[1]], GREEDY)[0]
    hit = eng.generate([SHARED], GREEDY)[0]  # its first two blocks are cached
    cold = tiny_engine(enable_prefix_caching=False).generate([SHARED], GREEDY)[0]
    assert first.num_cached_tokens == 0 and cold.num_cached_tokens == 0
    assert hit.num_cached_tokens == eng.stats().prefix_cache_hits == 2 * eng.config.block_size
    assert hit.token_ids == cold.token_ids and len(hit.token_ids) == GREEDY.max_tokens


def resize_script(eng: LLMEngine, resize: bool) -> list[list[int]]:
    """PROMPTS' tokens through the same steps, with (or without) a shrink and a grow of the KV mid-decode."""
    filler = eng.add_request(list(range(96)), GREEDY)  # holds the lowest blocks, then leaves
    eng.step()
    rids = [eng.add_request(p, GREEDY) for p in PROMPTS]
    for _ in range(3):
        eng.step()
    eng.abort(filler)
    if resize:
        buf, used = eng.arena.buffer.data_ptr(), eng.stats().num_used_blocks
        shrunk = eng.resize_kv(used + len(rids))  # KV -> scratch: the live blocks above move down
        assert shrunk.moved_blocks > 0 and eng.stats().num_kv_blocks == used + len(rids)
        assert max(b for r in rids for b in eng.request(r).block_table) < used + len(rids)
        assert eng.arena.buffer.data_ptr() == buf  # the same arena, re-sliced
    for _ in range(3):
        eng.step()
    if resize:
        grown = eng.resize_kv(eng.arena.max_blocks)  # scratch -> KV
        assert grown.moved_blocks == 0 and eng.stats().num_kv_blocks == eng.arena.max_blocks
    outs = drain(eng)
    assert all(outs[r].num_preemptions == 0 for r in rids)
    return [outs[r].token_ids for r in rids]


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_resize_around_live_requests_changes_no_token(tiny_engine, dtype):
    kw = dict(scratch_bytes=1 << 20)
    assert resize_script(tiny_engine(dtype, **kw), True) == resize_script(tiny_engine(dtype, **kw), False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_export_import_between_engines_changes_no_token(tiny_engine, device, dtype):
    """Two requests prefilled and decoding on A, moved to B (one staged on the host and pickled, as between
    processes; one device to device), finished there: the tokens of the run that never moved."""
    ref = tiny_engine(dtype).generate(PROMPTS[:2], GREEDY)
    a, b = tiny_engine(dtype), tiny_engine(dtype)
    rids = [a.add_request(p, GREEDY) for p in PROMPTS[:2]]
    for _ in range(3):  # prefill (+ first token), two decodes
        a.step()
    assert all(a.request(r).num_output_tokens == 3 for r in rids)
    payloads = [pickle.loads(pickle.dumps(a.export_kv(rids[0]))), a.export_kv(rids[1], device=None)]
    assert a.stats().num_used_blocks == 0 and not a.has_unfinished()
    assert payloads[0].blocks.device.type == "cpu" and payloads[1].blocks.device.type == b.arena.device.type
    moved = [b.import_kv(p) for p in payloads]
    outs = drain(b)
    assert [outs[r].token_ids for r in moved] == [o.token_ids for o in ref]
