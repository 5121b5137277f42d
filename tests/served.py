"""One real server for the tests that talk to one: `fluidpd serve --workers 1` (the coordinator with
one in-process SmolLM2 worker on CPU), uvicorn on a thread, shared by the whole session.

Set FLUIDPD_TEST_RUNTIME=module:function to serve another runtime instead (e.g. the multi-worker
coordinator): the function takes no arguments and returns a ServingRuntime (not started).
"""

from __future__ import annotations

import importlib
import os

import pytest

MAX_MODEL_LEN = 512
NUM_KV_BLOCKS = 128


def make_runtime():
    spec = os.environ.get("FLUIDPD_TEST_RUNTIME")
    if spec:
        module, _, func = spec.partition(":")
        return getattr(importlib.import_module(module), func)()
    from fluidpd.engine import EngineConfig
    from fluidpd.runtime.build import build_coordinator
    from fluidpd.runtime.config import RuntimeConfig

    config = EngineConfig(model="smollm2", max_model_len=MAX_MODEL_LEN, num_kv_blocks=NUM_KV_BLOCKS)
    runtime = RuntimeConfig(workers=1, backend="inprocess", admit_ttft_factor=0)  # the overload tests turn it on
    return build_coordinator(config, runtime, log=lambda m: None)


@pytest.fixture(scope="session")
def served():
    for module in ("fastapi", "uvicorn", "openai", "prometheus_client"):
        pytest.importorskip(module)
    import torch

    from fluidpd.server import BackgroundServer, build_app

    torch.set_num_threads(1)
    runtime = make_runtime()
    app = build_app(runtime)
    with BackgroundServer(app) as srv:
        srv.runtime = runtime
        srv.app = app
        yield srv
