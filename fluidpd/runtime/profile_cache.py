"""Engine profiles kept per machine, so that a restart of `fluidpd serve` does not spend its startup
re-timing the same engine (15-20 s of prefills on a 2-core host).

A profile is stored under `$FLUIDPD_CACHE/profiles/<key>.json`, the key a hash of everything its step times
depend on: the engine config, the model file (path, size, modification time), the worker's torch threads,
weight format and decode attention, the CPU (name and feature flags), the torch version and the engine's
own source (Python and C). Change any of them and the profile is measured again; `--no-profile-cache`
always measures. Before a kept profile is used, worker 0 times a few decode steps: if a step now takes more
than PROFILE_DRIFT times (or less than 1/PROFILE_DRIFT of) the profile's, the host is busier or quieter than
when it was measured, and it is measured again. Torch-free: the server process reads and writes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from fluidpd.core.cpu import cpu_flags, cpu_name
from fluidpd.core.paths import cache_root
from fluidpd.core.polynomial import Polynomial
from fluidpd.engine.model_source import resolve_model
from fluidpd.runtime.profile import EngineProfile

ENGINE_SOURCE = Path(__file__).parent.parent / "engine"
PROFILE_DRIFT = 1.25  # a kept profile is used while a decode step takes within this factor of its own


def profile_key(config: Any, info: Any) -> str:
    """The cache key of the profile of an engine of EngineConfig `config` started as StartInfo `info` says."""
    try:
        model = resolve_model(config.model, config.load_format)[0]
    except (OSError, ValueError):
        model = config.model
    stat = os.stat(model) if os.path.isfile(model) else None
    parts = {
        "engine": {k: v for k, v in asdict(config).items() if k != "kv_store"},  # the store's path is per run
        "model_file": [os.path.abspath(model), stat.st_size, stat.st_mtime_ns] if stat else None,
        "worker": [info.threads, info.quantization, info.attention, info.device],
        "cpu": [cpu_name(), sorted(cpu_flags())],
        "torch": _version("torch"),
        "engine_source": _source_hash(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load_profile(key: str) -> tuple[EngineProfile, str] | None:
    """The profile stored under `key` and when it was measured (ISO UTC), or None (none, or unreadable)."""
    path = _path(key)
    try:
        d = json.loads(path.read_text())
        p = d["profile"]
        profile = EngineProfile(
            tuple((int(n), float(t)) for n, t in p["prefill_points"]),
            tuple((int(n), float(t)) for n, t in p["chunk_points"]),
            float(p["decode_step_s"]),
            Polynomial(tuple(p["prefill_time"]["coeffs"]), p["prefill_time"]["floor"]),
            Polynomial(tuple(p["chunk_time"]["coeffs"]), p["chunk_time"]["floor"]),
            int(p["prefill_batch_tokens"]),
        )
        return profile, str(d["measured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_profile(key: str, profile: EngineProfile) -> None:
    """Keep `profile` under `key` (written whole, then renamed: a reader never sees half a file); a cache
    that cannot be written is skipped."""
    path = _path(key)
    body = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": asdict(profile)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)
    except OSError:
        pass


def _path(key: str) -> Path:
    return cache_root() / "profiles" / f"{key}.json"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def _source_hash() -> str:
    h = hashlib.sha256()
    for f in sorted(ENGINE_SOURCE.rglob("*")):
        if f.suffix in (".py", ".c") and f.is_file():
            h.update(f.relative_to(ENGINE_SOURCE).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()
