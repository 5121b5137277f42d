"""llama.cpp's server as a peer: where scripts/install_llama_cpp.sh builds it, and how it is started."""

from __future__ import annotations

import os
from pathlib import Path

from fluidpd.core.paths import cache_root

INSTALL_HINT = "run scripts/install_llama_cpp.sh first (builds it once per machine; about 25 min on 2 cores)"
REBUILD_HINT = "rebuild with scripts/install_llama_cpp.sh"
FLAGS_FILE = "build-flags.txt"  # written by scripts/llama_cpp_build.py: `key: value` lines


def cache_dir() -> Path:
    """${FLUIDPD_CACHE:-~/.cache/fluidpd}/llama.cpp, the install script's home."""
    return cache_root() / "llama.cpp"


def llama_server_binary() -> Path:
    """The built server; FileNotFoundError (saying how to build it) when there is none."""
    path = cache_dir() / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"llama.cpp's server is not at {path}: {INSTALL_HINT}")
    return path


def build_flags() -> dict[str, str]:
    """What the install script recorded of the build (tier, isa, cmake, cpu, ...); empty when it recorded
    nothing (a server built before the script chose flags, with -march=native)."""
    try:
        text = (cache_dir() / FLAGS_FILE).read_text(errors="replace")
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in text.splitlines()) if sep}


def describe_build() -> str:
    """One line on how the server was built, for a benchmark's output."""
    flags = build_flags()
    if not flags:
        return f"no {FLAGS_FILE} (built with -march=native by an older install script: {REBUILD_HINT})"
    get = flags.get
    return f"tier {get('tier', '?')} ({get('isa', '?')}), built {get('built', '?')} on {get('cpu', '?')}"


def llama_server_cmd(binary: Path, gguf: str, port: int, threads: int, parallel: int = 8, ctx: int = 8192) -> list[str]:
    """`parallel` slots sharing `ctx` tokens of KV, continuous batching, one thread per core."""
    return [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-np", str(parallel), "-c", str(ctx), "--cont-batching"]  # fmt: skip
