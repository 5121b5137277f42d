"""Incremental detokenization: partial UTF-8 held back, stop strings held back and cut."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tok(served):
    return served.runtime.tokenizer  # the served model's (loading a GGUF tokenizer alone is slow)


def _stream(tok, prompt, text, stop=(), include=False, reason="length"):
    from fluidpd.server.detokenizer import IncrementalDetokenizer

    d = IncrementalDetokenizer(tok, tok.encode(prompt), tuple(stop), include)
    ids = tok.encode(text, add_special_tokens=False)
    deltas = [d.add([t]) for t in ids]
    deltas.append(d.finish(reason))
    return deltas


def test_pieces_join_to_the_whole_decode(tok):
    text = " Paris is the capital of France. Café, naïve, 東京, emoji 🚀🎉 done."
    deltas = _stream(tok, "The city:", text)
    assert "".join(deltas) == tok.decode(tok.encode(text, add_special_tokens=False))
    assert not any("\ufffd" in d for d in deltas)


def test_leading_space_of_the_first_token_is_kept(tok):
    deltas = _stream(tok, "The capital of France is", " Paris")
    assert "".join(deltas) == " Paris"


def test_stop_string_is_never_streamed(tok):
    deltas = _stream(tok, "Q:", " one two\n\nthree", stop=["\n\n"], reason="stop")
    assert "".join(deltas) == " one two"
    assert all("\n" not in d for d in deltas)
    kept = _stream(tok, "Q:", " one two\n\nthree", stop=["\n\n"], include=True, reason="stop")
    assert "".join(kept) == " one two\n\n"


def test_held_back_prefix_is_released_when_it_is_no_stop(tok):
    deltas = _stream(tok, "Q:", " a END b", stop=["ENDING"], reason="length")
    assert "".join(deltas) == " a END b"
