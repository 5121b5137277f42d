"""Each architecture beyond Llama through the engine's whole path, against transformers on the same
tiny random weights: logits within float32's tolerance and greedy continuations equal, through paged
attention, prefix caching, a P/D hand-off between two engines, FluidRole's KV resize mid-decode, and
the float16 KV arena. Windowed models (Gemma's sliding layers, Mistral's window) see prompts longer
than their 8-token windows."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from engine_tolerance import logits_tol

from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

ARCHS = (
    "qwen3",
    "phi3",
    "mixtral",
    "qwen3_moe",
    "gemma2",
    "gemma3",
    "mistral",
)  # Llama and Qwen2 are tests/engine/test_engine_model.py's and the SmolLM2 tests'
PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 26, 50, 8, 90, 1, 45, 19, 77, 30],
    [7, 7, 100, 3],
    list(range(40, 75)),
]
SHARED = [*PROMPTS[2][:32], 11, 12, 13]  # two full blocks in common with PROMPTS[2]
LONG = PROMPTS[0] + PROMPTS[2]
CHUNKS = [16, 1, 1, len(LONG) - 18]  # chunks after earlier context, within and across the windows
NEW = 10
GREEDY = SamplingParams(max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, tmp_path_factory):
    """(config, checkpoint dir, transformers' greedy continuations of PROMPTS and SHARED, and its logits
    of LONG, in float64)."""
    cfg = tiny_config(request.param)
    tensors = random_tensors(cfg, torch.float32, seed=5)
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * 50  # decisive logits: no near-ties in argmax
    path = tmp_path_factory.mktemp(request.param)
    from safetensors.torch import save_file

    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(tensors, str(path / "model.safetensors"))
    # as a user would load it (eager experts: float64 has no grouped GEMM)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float64, experts_implementation="eager"
    ).eval()
    refs = []
    with torch.no_grad():
        for p in [*PROMPTS, SHARED]:
            out = model.generate(
                torch.tensor([p]), max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None
            )
            refs.append(out[0, len(p) :].tolist())
        logits = model(torch.tensor([LONG])).logits[0].float()
    return cfg, path, refs, logits


def engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), quantization="none", **{"kv_cache_dtype": "float32", **kw}))


def drain(eng) -> dict:
    outs = {}
    while eng.has_unfinished():
        outs |= {o.request_id: o.output.token_ids for o in eng.step() if o.finished}
    return outs


def test_batched_greedy_equals_transformers(arch):
    cfg, path, refs, _ = arch
    eng = engine(path, num_kv_blocks=32)
    assert eng.model_config == cfg
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == refs[: len(PROMPTS)]


def test_prefix_caching_reuses_blocks_and_changes_no_token(arch):
    _, path, refs, _ = arch
    eng = engine(path, num_kv_blocks=32, enable_prefix_caching=True)
    assert eng.generate([PROMPTS[2]], GREEDY)[0].token_ids == refs[2]
    out = eng.generate([SHARED], GREEDY)[0]
    assert out.num_cached_tokens == 32 and out.token_ids == refs[-1]


def test_a_handoff_and_a_kv_resize_mid_decode_change_no_token(arch):
    _, path, refs, _ = arch
    a, b = engine(path, num_kv_blocks=32), engine(path, num_kv_blocks=32, scratch_bytes=1 << 20)
    rids = [a.add_request(p, GREEDY) for p in PROMPTS]
    while not all(a.request(r).is_decoding for r in rids):  # prefill (+ first token) on A
        a.step()
    moved = [b.import_kv(pickle.loads(pickle.dumps(a.export_kv(r)))) for r in rids]  # as if to another process
    assert a.stats().num_used_blocks == 0
    for _ in range(3):
        b.step()
    used = b.stats().num_used_blocks
    b.resize_kv(used + 1)  # FluidRole's re-slice: KV -> scratch with the decodes live
    outs = drain(b)
    assert [outs[r] for r in moved] == refs[: len(PROMPTS)]


def test_chunked_prompt_logits_match_transformers(arch):
    cfg, path, _, ref = arch
    got = engine(path, num_kv_blocks=32).prompt_logits(LONG, CHUNKS)
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= logits_tol(cfg, len(LONG), torch.float32, scale)


def test_float16_kv_tracks_float32_logits(arch):
    cfg, path, _, _ = arch
    exact = engine(path, num_kv_blocks=32).prompt_logits(LONG, CHUNKS)
    half = engine(path, num_kv_blocks=32, kv_cache_dtype="float16").prompt_logits(LONG, CHUNKS)
    scale = exact.abs().max().item()
    assert (half - exact).abs().max().item() <= logits_tol(cfg, len(LONG), torch.float16, scale)
