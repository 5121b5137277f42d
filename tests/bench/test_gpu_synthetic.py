"""The GPU check's random-weight checkpoint (`synthetic.write_checkpoint`, tiny shape) as the engine,
transformers and the tokenizer read it; `fluidpd generate --json`; the generate check's verdict."""

from __future__ import annotations

import json

import pytest
import torch

from fluidpd import cli
from fluidpd.bench.gpu_check import generate_check, synthetic
from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.tokenizer import Tokenizer

IDS = [1000, 70, 84, 73, 68, 3, 255, 511, 1023, 17, 400]  # BOS, bytes, fillers, the last id


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synthetic.write_checkpoint(tmp_path_factory.mktemp("synthetic") / "tiny", "tiny")


def test_engine_and_transformers_load_it_with_the_same_logits(tiny):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(str(tiny / synthetic.WEIGHTS), "pt") as f:
        names = f.keys()  # every weight of the shape, in bfloat16
        assert {f.get_tensor(k).dtype for k in names} == {torch.bfloat16} and len(names) == 3 + 2 * 9
        assert f.metadata() == {"format": "pt"}
    eng = LLMEngine(EngineConfig(model=str(tiny), device="cpu", kv_cache_dtype="float32", max_model_len=256))
    assert eng.model_config.vocab_size == 1024 and eng.tokenizer is not None
    ours = eng.prompt_logits(IDS)
    ref_model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([IDS])).logits[0]
    assert ours.shape == ref.shape == (len(IDS), 1024)
    assert ref.std() > 0.1  # not a degenerate model
    assert (ours - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


def test_the_tokenizer_round_trips_text_decodes_every_id_and_renders_llama3_chats(tiny):
    tok = Tokenizer.load(str(tiny))
    assert tok.vocab_size == 1024 and tok.bos_token_id == 1000 and tok.eos_token_ids == (1009,)
    text = "Héllo, wörld! 3.14 — 日本語 🙂\n\ttabs"
    ids = tok.encode(text)
    assert ids[0] == 1000 and len(ids) == 1 + len(text.encode())  # BOS, then one token a byte
    assert tok.decode(ids) == text
    pieces = [tok.decode([i], skip_special_tokens=False) for i in range(1024)]
    assert all(pieces) and len(set(pieces[256:])) == 1024 - 256  # fillers and control tokens all distinct
    assert tok.decode(list(range(1024)))  # whatever the random model samples decodes
    chat = tok.apply_chat_template([{"role": "user", "content": " hi "}])
    assert chat == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[:2] == [1000, 1006] and ids.count(1000) == 1 and 1009 in ids and ids[-3] == 1007


def test_a_finished_checkpoint_is_reused_and_another_seed_rewrites_it(tiny):
    weights = tiny / synthetic.WEIGHTS
    before = weights.stat()
    assert synthetic.write_checkpoint(tiny, "tiny") == tiny
    assert weights.stat().st_mtime_ns == before.st_mtime_ns and weights.stat().st_ino == before.st_ino
    other = tiny.parent / "tiny-seed1"
    synthetic.write_checkpoint(other, "tiny", seed=1)
    assert (other / synthetic.WEIGHTS).read_bytes() != weights.read_bytes()
    assert json.loads((other / synthetic.DONE).read_text()) == {"shape": "tiny", "dtype": "bfloat16", "seed": 1}
    assert not list(other.glob("*.part"))


def test_generate_json_prints_ids_and_text(tiny, capsys):
    argv = ["generate", "--model", str(tiny), "--prompt", "Hello", "--max-tokens", "5", "--ignore-eos", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "prompt_token_ids", "finish_reason"}
    tok = Tokenizer.load(str(tiny))
    assert out["prompt_token_ids"] == tok.encode("Hello") and len(out["prompt_token_ids"]) == 6
    assert len(out["token_ids"]) == 5 and out["finish_reason"] == "length"
    assert out["text"] == tok.decode(out["token_ids"])


def test_a_flip_passes_only_under_a_bf16_near_tie():
    n = generate_check.MAX_TOKENS
    same = list(range(n))
    ref = {"token_ids": same, "tops": [5.0] * n, "margins": [0.3] * n, "ours_logits": [5.0] * n}
    assert generate_check.compare(same, ref)["ok"]  # top logit in [4, 8): ulp 1/32, tolerance 0.125
    assert not generate_check.compare(same[:-1], ref)["ok"]  # stopped early
    flipped = [*same[:7], 999, *same[8:]]
    ref["ours_logits"][7] = 4.7  # our token 0.3 under transformers' top one: a wrong token
    assert not generate_check.compare(flipped, ref)["ok"]
    ref["margins"][7], ref["ours_logits"][7] = 0.0, 4.7  # a tie at the top, but our token is not in it
    assert not generate_check.compare(flipped, ref)["ok"]
    ref["margins"][7], ref["ours_logits"][7] = 0.0625, 4.875  # our token within 4 ulps: a near-tie
    verdict = generate_check.compare(flipped, ref)
    assert verdict["ok"] and not verdict["equal"] and verdict["first_diff"] == 7
    assert (verdict["margin"], verdict["gap"], verdict["tolerance"]) == (0.0625, 0.125, 0.125)
    assert (verdict["fluidpd_token"], verdict["transformers_token"]) == (999, 7)
    assert generate_check.bf16_ulp(1.0) == 2**-7 and generate_check.bf16_ulp(-0.75) == 2**-8
