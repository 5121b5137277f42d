"""Sliding-window KV (every layer windowed, as Mistral's): blocks no later token reads are freed as a
sequence advances, and that changes no token; a hybrid model (Gemma's global layers) frees none."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.block_manager import NULL_BLOCK
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

PROMPT = [(7 * i + 3) % 120 for i in range(40)]
GREEDY = SamplingParams(max_tokens=30, ignore_eos=True)


def write_model(path, arch: str, **quirks):
    from safetensors.torch import save_file

    cfg = replace(tiny_config(arch), **quirks)
    tensors = random_tensors(cfg, torch.float32, seed=9)
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * 50  # decisive logits: no near-ties in argmax
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(tensors, str(path / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float64, experts_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=30, do_sample=False, pad_token_id=0)
    return cfg, out[0, len(PROMPT) :].tolist()


def run(path, **kw) -> tuple[list[int], int, LLMEngine]:
    """Greedy tokens of PROMPT and the most KV blocks held after a decode step."""
    eng = LLMEngine(EngineConfig(model=str(path), quantization="none", kv_cache_dtype="float32", block_size=4, **kw))
    rid = eng.add_request(PROMPT, GREEDY)
    most, tokens = 0, None
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                tokens = o.output.token_ids
        if rid in eng.seqs and eng.seqs[rid].is_decoding:
            most = max(most, eng.stats().num_used_blocks)
    assert tokens is not None
    return tokens, most, eng


@pytest.mark.parametrize("chunk", [None, 12])
def test_a_windowed_model_holds_only_its_window_and_changes_no_token(tmp_path, chunk):
    cfg, ref = write_model(tmp_path, "mistral")
    assert cfg.kv_window == 8
    kw = {"max_num_batched_tokens": chunk} if chunk else {}
    tokens, most, eng = run(tmp_path, num_kv_blocks=64, **kw)
    assert tokens == ref
    assert most <= 3  # the next token's window, positions p - 7 .. p, spans at most 3 blocks of 4 (18 without)
    assert eng.stats().num_used_blocks == 0  # every block freed at the end


def test_freed_blocks_stay_cached_for_a_prompt_that_shares_the_prefix(tmp_path):
    _, ref = write_model(tmp_path, "mistral")
    eng = LLMEngine(
        EngineConfig(
            model=str(tmp_path), quantization="none", block_size=4, num_kv_blocks=64, enable_prefix_caching=True
        )
    )
    first = eng.generate([PROMPT], GREEDY)[0]
    again = eng.generate([PROMPT], GREEDY)[0]
    assert first.token_ids == again.token_ids == ref
    assert (
        again.num_cached_tokens == 39
    )  # its 10 full blocks, freed on the way, found in the cache (the last token recomputed)


def test_a_handoff_after_the_window_moves_only_live_blocks(tmp_path):
    _, ref = write_model(tmp_path, "mistral")
    cfg = dict(model=str(tmp_path), quantization="none", kv_cache_dtype="float32", block_size=4, num_kv_blocks=64)
    a, b = LLMEngine(EngineConfig(**cfg)), LLMEngine(EngineConfig(**cfg))
    rid = a.add_request(PROMPT, GREEDY)
    for _ in range(6):  # prefill, then a few decodes
        a.step()
    seq = a.seqs[rid]
    dead = seq.num_dead_blocks
    assert dead > 0 and seq.block_table[:dead] == [NULL_BLOCK] * dead
    payload = a.export_kv(rid)
    assert payload.dead_blocks == dead and payload.blocks.shape[0] <= 3
    moved = b.import_kv(payload)
    done = {}
    while b.has_unfinished():
        done |= {o.request_id: o.output.token_ids for o in b.step() if o.finished}
    assert done[moved] == ref
    assert b.stats().num_used_blocks == 0


def test_a_hybrid_model_keeps_every_block(tmp_path):
    cfg, ref = write_model(tmp_path, "gemma2")
    assert cfg.sliding_window == 8 and cfg.kv_window == 0  # its full layers read every token
    tokens, most, _ = run(tmp_path, num_kv_blocks=64)
    assert tokens == ref
    assert most == -(-(len(PROMPT) + 28) // 4)  # the K/V of every token computed before the last step


@pytest.mark.parametrize("arch", ["phi3", "mixtral"])
def test_phi3_and_mixtral_honour_their_window(tmp_path, arch):
    cfg, ref = write_model(tmp_path, arch, sliding_window=8)  # transformers applies both configs' sliding_window
    assert cfg.kv_window == 8
    tokens, most, _ = run(tmp_path, num_kv_blocks=64)
    assert tokens == ref and most <= 3
