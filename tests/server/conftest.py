"""One real server for the server tests: `fluidpd serve --workers 1` (the coordinator with one
in-process SmolLM2 worker on CPU), uvicorn on a thread.

Set FLUIDPD_TEST_RUNTIME=module:function to serve another runtime instead (e.g. the multi-worker
coordinator): the function takes no arguments and returns a ServingRuntime (not started).
"""

from __future__ import annotations

import importlib
import os

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

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
    import torch

    from fluidpd.server import BackgroundServer, build_app

    torch.set_num_threads(1)
    runtime = make_runtime()
    app = build_app(runtime)
    with BackgroundServer(app) as srv:
        srv.runtime = runtime
        srv.app = app
        yield srv


@pytest.fixture()
def client(served):
    import openai

    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture()
def model(served) -> str:
    return served.runtime.model_name
