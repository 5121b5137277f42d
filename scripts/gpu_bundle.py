"""The wheels the GPU machine lacks, for its Python (3.12, manylinux x86-64), in `.whl/` (git-ignored).

The GPU image has PyTorch, transformers, numpy, safetensors, tokenizers, jinja2, httpx, rich, tqdm
and the rest of KINDS.md's list, but no package registry: what FluidPD's engine and server need
beyond that travels with the working tree (`run(carry=[".whl"])`) and `scripts/gpu_check.sh`
installs it with `pip --no-index`. Each wheel is the version installed in this .venv, the one the
test suite ran. The bundle must stay under 60 MB (the whole working tree that travels is 64 MiB).

    .venv/bin/python scripts/gpu_bundle.py            # download into .whl/, print the sizes
    .venv/bin/python scripts/gpu_bundle.py --check    # the list and the pins only (no network)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / ".whl"
LIMIT_BYTES = 60 * 2**20
PYTHON = "3.12"  # the GPU image's (KINDS.md: /opt/torch/.venv/bin/python3 is 3.12.3)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + ["manylinux2014_x86_64"]
# the engine's and the server's imports that the image lacks, and what those need in turn
NEEDED = (
    "gguf",  # the GGUF reader (engine)
    "llguidance",  # structured outputs (engine, server)
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "opentelemetry_api",  # fastapi's requirement
    "anyio",  # starlette's, at least the version the suite ran (the image's may be older)
    "typing_extensions",  # pydantic's, likewise
)


def pins() -> list[str]:
    """NAME==VERSION of each needed distribution, as installed here."""
    return [f"{name}=={version(name)}" for name in NEEDED]


def download(dest: Path) -> list[Path]:
    dest.mkdir(exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           PYTHON, "--implementation", "cp", *platforms, "-d", str(dest), *pins()]  # fmt: skip
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print the pins; download nothing")
    ap.add_argument("--dest", type=Path, default=BUNDLE)
    args = ap.parse_args()
    if args.check:
        print("\n".join(pins()))
        return 0
    wheels = download(args.dest)
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:6.1f} MB  {w.name}")
    print(
        f"GPU bundle: {len(wheels)} wheels, {total / 2**20:.1f} MB in {args.dest} (limit {LIMIT_BYTES / 2**20:.0f} MB)"
    )
    return 0 if total <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
