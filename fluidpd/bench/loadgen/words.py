"""Plain-word text for session prompts: a chunk named by a key is the same text wherever it appears."""

from __future__ import annotations

import hashlib
import re

DEFAULT_TOKENS_PER_WORD = 1.3  # English words in BPE tokenizers, when the server cannot tokenize
_WORD = re.compile(r"[A-Za-z]+")


class WordSource:
    """Words of a text (letters only, so any tokenizer reads them) cut into chunks by key: equal keys
    and lengths give identical text; a chunk's length is set in tokens via `tokens_per_word`."""

    def __init__(self, text: str, tokens_per_word: float = DEFAULT_TOKENS_PER_WORD) -> None:
        self.words = _WORD.findall(text)
        if len(self.words) < 100:
            raise ValueError(f"the text has {len(self.words)} words; need at least 100 to cut prompts from")
        if not tokens_per_word > 0:
            raise ValueError(f"tokens_per_word must be > 0, got {tokens_per_word}")
        self.tokens_per_word = float(tokens_per_word)

    def word_count(self, tokens: float) -> int:
        """Words that make about `tokens` tokens (at least one for any positive count)."""
        return max(round(tokens / self.tokens_per_word), 1) if tokens > 0 else 0

    def chunk(self, key: object, n_words: int) -> str:
        """`n_words` consecutive words from an offset fixed by `key` (stable across processes)."""
        if n_words <= 0:
            return ""
        digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
        start = int.from_bytes(digest, "little") % len(self.words)
        n = len(self.words)
        return " ".join(self.words[(start + i) % n] for i in range(n_words))
