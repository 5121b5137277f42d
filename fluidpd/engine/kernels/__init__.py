"""CPU kernels in C (one file each, next to this module), compiled on first use with the machine's
C compiler for its own CPU (-march=native) and called through ctypes.

A build is cached under `$FLUIDPD_CACHE` (default ~/.cache/fluidpd) by a hash of the source, the
flags, the compiler and the CPU's feature flags, so a cache shared between machines never runs a
binary built for another CPU. No compiler, or a failed build: `load` raises `KernelUnavailable`
and the caller falls back to its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from fluidpd.core.cpu import cpu_flags
from fluidpd.core.paths import cache_root

SOURCE_DIR = Path(__file__).parent
CFLAGS = ("-O3", "-fopenmp-simd", "-fPIC", "-shared")  # plus -march=`march` (native unless asked)


class KernelUnavailable(RuntimeError):
    """A kernel could not be built or loaded on this machine (the message says why)."""


def cache_dir() -> Path:
    return cache_root() / "kernels"


@functools.cache
def load(name: str, march: str = "native") -> ctypes.CDLL:
    """The compiled kernel library `name` (source `name`.c), built here on first use for -march=`march`
    (tests build the portable x86-64 path with "x86-64")."""
    src = SOURCE_DIR / f"{name}.c"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise KernelUnavailable(f"no C compiler (cc, gcc or $CC) to build {src.name}")
    text, flags = src.read_bytes(), (*CFLAGS, f"-march={march}")
    key = hashlib.sha256(
        b"\0".join([text, " ".join(flags).encode(), cc.encode(), " ".join(sorted(cpu_flags())).encode()])
    )
    lib = cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)  # concurrent builders: last rename wins
        os.close(fd)
        try:
            try:
                run = subprocess.run([cc, *flags, "-o", tmp, str(src), "-lm"], capture_output=True, text=True)
            except OSError as exc:
                raise KernelUnavailable(f"cannot run the C compiler {cc}: {exc}") from None
            if run.returncode != 0:
                raise KernelUnavailable(f"{cc} failed to build {src.name}: {run.stderr.strip()[-500:]}")
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    try:
        return ctypes.CDLL(str(lib))
    except OSError as exc:
        raise KernelUnavailable(f"cannot load {lib}: {exc}") from None
