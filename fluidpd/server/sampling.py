"""The sampling controls that need the tokenizer: `bad_words` as token sequences and `logit_bias` keys as token ids."""

from __future__ import annotations

from fluidpd.server.errors import bad_request

MAX_BAD_WORDS = 128  # vLLM's GPU model runner's bound: each one is checked at every step


def bad_words_token_ids(tokenizer, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """vLLM's `SamplingParams.update_from_tokenizer`: each word without special tokens, as is and after a space."""
    if len(words) > MAX_BAD_WORDS:
        raise bad_request(f"bad_words may hold at most {MAX_BAD_WORDS} words, got {len(words)}", "bad_words")
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False) if word.strip() else []
        if not plain:
            raise bad_request(f"bad_words must be non-empty words, got {word!r}", "bad_words")
        out.append(tuple(plain))
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != plain[0] and len(spaced) == len(plain):  # the word has its own token after a space
            out.append(tuple(spaced))
    return tuple(out)


def logit_bias_token_ids(bias: dict[str, float], vocab_size: int | None) -> dict[int, float]:
    """`bias` keyed by token id; a 400 naming logit_bias for a key that is not a token id of the vocabulary."""
    out = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isdecimal() and len(key) <= 12 else -1
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            within = f" below {vocab_size}" if vocab_size is not None else ""
            raise bad_request(f"logit_bias keys must be token ids{within}, got {key[:32]!r}", "logit_bias")
        out[token] = value
    return out


def tokenized_controls(req, tokenizer) -> dict:
    """SamplingParams' `logit_bias` and `bad_words_token_ids` for request `req` (a 400 naming the field if bad)."""
    vocab_size = tokenizer.vocab_size if tokenizer is not None else None
    controls = {"logit_bias": logit_bias_token_ids(req.logit_bias or {}, vocab_size)}
    if req.bad_words:
        if tokenizer is None:
            raise bad_request("bad_words needs the model's tokenizer", "bad_words")
        controls["bad_words_token_ids"] = bad_words_token_ids(tokenizer, req.bad_words)
    return controls
