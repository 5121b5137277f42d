"""Tokenizer and chat template built offline from the GGUF metadata."""

from __future__ import annotations

import json

import pytest

from fluidpd.engine.tokenizer import Tokenizer

CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tok(smol):
    return smol[1]


def test_encode_known_ids(tok):
    # ids from transformers' GGUF tokenizer for SmolLM2-135M-Instruct
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tok.encode("12345 <|im_start|>hi") == [33, 34, 35, 36, 37, 216, 1, 6004]
    assert not tok.add_bos and tok.bos_token_id == 1 and tok.eos_token_ids == (2,)


@pytest.mark.parametrize("text", ["naïve café — 日本語 🎉", "a  b\n\n\tc", "It's 2024, we'll see 100x", " x"])
def test_decode_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(msgs) == CHAT
    ids = tok.encode_chat(msgs)
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    assert tok.decode(ids, skip_special_tokens=False) == CHAT
    sys_msgs = [{"role": "system", "content": "Be brief."}, *msgs]
    assert tok.apply_chat_template(sys_msgs).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("assistant\n")


def test_tokenizer_json_directory(tmp_path, tok):
    tok.tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": tok.chat_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
    )
    t2 = Tokenizer.load(str(tmp_path))
    assert t2.encode("The capital of France is") == tok.encode("The capital of France is")
    assert t2.eos_token_ids == (2,) and t2.apply_chat_template([{"role": "user", "content": "x"}]).endswith(
        "<|im_start|>assistant\n"
    )
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(str(tmp_path / "missing"))


def test_a_long_text_encodes_in_pieces_exactly_as_whole(tok):
    """Past ENCODE_PIECE_CHARS the text is cut between a non-space and a space and encoded in
    pieces (no call holds the GIL for the whole text): the ids are the whole text's."""
    import random

    from fluidpd.engine.tokenizer import ENCODE_PIECE_CHARS

    rng = random.Random(0)
    words = ["hello", "The", "1234", "3.14", "don't", "we'll", "<|im_start|>", "naïve", "日本語", "\n", "\t"]
    words += ["  ", "!!", "x=y+1;", "'s", "   lead", "emoji😀", "\r\n", "a"]
    text = "".join(rng.choice(words) + rng.choice([" ", "", " ", "  ", "\n"]) for _ in range(60_000))
    assert len(text) > 4 * ENCODE_PIECE_CHARS and tok._splittable()
    assert tok.encode(text) == tok.tk.encode(text).ids
