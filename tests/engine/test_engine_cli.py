"""`fluidpd generate`."""

from __future__ import annotations

import pytest

from fluidpd import cli


@pytest.mark.slow
def test_generate_prints_paris(capsys):
    assert cli.main(["generate", "--prompt", "The capital of France is", "--max-tokens", "6"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_generate_user_errors_exit_2(capsys, tmp_path):
    assert cli.main(["generate", "--model", str(tmp_path / "missing.gguf"), "--prompt", "x"]) == 2
    assert "model not found" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--kv-cache-dtype", "fp8"]) == 2
    assert "kv_cache_dtype" in capsys.readouterr().err
