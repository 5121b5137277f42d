"""A request's prompt: text, token ids or chat messages, turned into checked token ids."""

from __future__ import annotations

from fluidpd.engine.tokenizer import Tokenizer

Prompt = str | list[int] | list[dict[str, str]]


def prompt_ids(prompt: Prompt, tokenizer: Tokenizer | None, chat: bool) -> list[int]:
    """The prompt's token ids: text is encoded (as one user message with `chat`), messages through the chat template."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], dict)):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids (or set EngineConfig.tokenizer)")
        if isinstance(prompt, str) and not chat:
            return tokenizer.encode(prompt)
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return tokenizer.encode_chat(msgs)
    return [int(t) for t in prompt]


def check_prompt(ids: list[int], max_model_len: int, vocab_size: int) -> None:
    """ValueError for an empty prompt, one longer than `max_model_len`, or a token id outside the vocabulary."""
    if not ids:
        raise ValueError("prompt is empty")
    if len(ids) > max_model_len:
        raise ValueError(f"prompt has {len(ids)} tokens, longer than max_model_len {max_model_len}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} out of range for vocab size {vocab_size}")
