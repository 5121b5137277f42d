"""The server tests' clients of the session's shared server (`served`, tests/served.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")


@pytest.fixture()
def client(served):
    import openai

    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture()
def model(served) -> str:
    return served.runtime.model_name
