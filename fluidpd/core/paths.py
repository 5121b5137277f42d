"""Where fluidpd keeps what it builds or measures once per machine: `$FLUIDPD_CACHE`, default ~/.cache/fluidpd."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The per-machine cache directory (compiled kernels, llama.cpp's server, engine profiles)."""
    return Path(os.environ.get("FLUIDPD_CACHE") or Path.home() / ".cache" / "fluidpd")
