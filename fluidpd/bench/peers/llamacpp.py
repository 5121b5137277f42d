"""llama.cpp's server as a peer: where scripts/install_llama_cpp.sh builds it, and how it is started."""

from __future__ import annotations

import os
from pathlib import Path

from fluidpd.core.paths import cache_root

INSTALL_HINT = "run scripts/install_llama_cpp.sh first (builds it once per machine; about 25 min on 2 cores)"


def cache_dir() -> Path:
    """${FLUIDPD_CACHE:-~/.cache/fluidpd}/llama.cpp, the install script's home."""
    return cache_root() / "llama.cpp"


def llama_server_binary() -> Path:
    """The built server; FileNotFoundError (saying how to build it) when there is none."""
    path = cache_dir() / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"llama.cpp's server is not at {path}: {INSTALL_HINT}")
    return path


def llama_server_cmd(binary: Path, gguf: str, port: int, threads: int, parallel: int = 8, ctx: int = 8192) -> list[str]:
    """`parallel` slots sharing `ctx` tokens of KV, continuous batching, one thread per core."""
    return [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-np", str(parallel), "-c", str(ctx), "--cont-batching"]  # fmt: skip
