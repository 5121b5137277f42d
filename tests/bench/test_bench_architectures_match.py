"""architectures_match.py: the checkpoint it writes is what transformers and the engine both load."""

import json
import sys

import pytest
from benchscript import load

from fluidpd.engine.model_config import ModelConfig


def test_bad_max_tokens_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["architectures_match.py", "--max-tokens", "0"])
    with pytest.raises(SystemExit) as e:
        load("architectures_match").main()
    assert e.value.code == 2 and "--max-tokens must be >= 1" in capsys.readouterr().err


def test_the_checkpoint_reads_back_as_its_architecture(tmp_path):
    load("architectures_match").checkpoint("phi3", 300, tmp_path / "phi3")
    cfg = ModelConfig.from_hf(json.loads((tmp_path / "phi3" / "config.json").read_text()))
    assert cfg.architecture == "phi3" and cfg.vocab_size == 300
    assert (tmp_path / "phi3" / "model.safetensors").stat().st_size > 300 * 64 * 4
