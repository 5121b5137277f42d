"""Everything the engine and the server import, imported before anything runs (the GPU machine
has no package registry: a missing one must show here, not minutes into the run)."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

from fluidpd.bench.gpu_check.context import CheckContext

# third-party modules (their distributions' versions are recorded), then FluidPD's entry points
PACKAGES = {
    "torch": "torch",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "transformers": "transformers",
    "jinja2": "jinja2",
    "gguf": "gguf",
    "llguidance": "llguidance",
    "fastapi": "fastapi",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "pydantic": "pydantic",
    "httpx": "httpx",
    "prometheus_client": "prometheus_client",
    "rich": "rich",
    "tqdm": "tqdm",
    "matplotlib": "matplotlib",
}
MODULES = ("fluidpd.engine", "fluidpd.server.app", "fluidpd.runtime.build", "fluidpd.cli", "fluidpd.sim")


def check(ctx: CheckContext) -> dict:
    versions, missing = {}, {}
    for module, dist in PACKAGES.items():
        try:
            importlib.import_module(module)
            versions[dist] = _version(dist)
        except Exception as exc:  # ImportError, or a wheel built for another Python
            missing[module] = f"{type(exc).__name__}: {exc}"
    for module in MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:
            missing[module] = f"{type(exc).__name__}: {exc}"
    cuda = _cuda(ctx.device) if "torch" in versions else {}
    ok = not missing and (not ctx.on_gpu or bool(cuda.get("sum_ok")))
    return {"ok": ok, "versions": versions, "missing": missing, "cuda": cuda}


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def _cuda(device: str) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"available": False}
    dev = torch.device(device if device.startswith("cuda") else "cuda")
    x = torch.ones(1024, device=dev, dtype=torch.bfloat16)  # the device computes, not only answers
    return {"available": True, "version": torch.version.cuda, "name": torch.cuda.get_device_name(dev),
            "sum_ok": float((x @ x).item()) == 1024.0}  # fmt: skip
