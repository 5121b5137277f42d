"""The shipped prompt corpus (data/corpus): public-domain English text cut into exact-length prompts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

CORPUS_DIR_ENV = "FLUIDPD_CORPUS_DIR"


def corpus_dir() -> Path:
    """$FLUIDPD_CORPUS_DIR, else data/corpus next to the package."""
    env = os.environ.get(CORPUS_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data" / "corpus"


def load_corpus(directory: str | Path | None = None) -> str:
    """Every .txt file of the corpus folder, in name order, joined by blank lines."""
    d = Path(directory) if directory is not None else corpus_dir()
    files = sorted(d.glob("*.txt")) if d.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no corpus .txt files in {d} (set {CORPUS_DIR_ENV} to the folder holding them)")
    return "\n\n".join(f.read_text(encoding="utf-8").strip() for f in files)


class PromptMaker:
    """Prompts of exactly n tokens: windows of the corpus tokens at seeded offsets (wrapping around)."""

    def __init__(self, token_ids: list[int], seed: int = 0) -> None:
        if not token_ids:
            raise ValueError("the corpus tokenized to nothing")
        self.ids = np.asarray(token_ids, dtype=np.int64)
        self.rng = np.random.default_rng(seed)

    def make(self, n: int) -> list[int]:
        if n < 1:
            raise ValueError(f"prompt length must be >= 1, got {n}")
        start = int(self.rng.integers(len(self.ids)))
        idx = (start + np.arange(n)) % len(self.ids)
        return self.ids[idx].tolist()
