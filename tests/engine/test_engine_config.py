"""EngineConfig as command-line flags: importable without torch, knobs round-trip through argparse."""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.engine.config import DTYPES, LOAD_FORMATS, EngineConfig
from fluidpd.engine.loaders import LOADERS


def test_config_imports_without_torch():
    code = "import sys, fluidpd.engine.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_knobs_become_flags_and_build_the_config():
    p = argparse.ArgumentParser()
    add_flags(p, EngineConfig)
    args = p.parse_args(
        [
            "--model",
            "llama-3.2-1b",
            "--load-format",
            "dummy",
            "--dtype",
            "bf16",
            "--num-kv-blocks",
            "4",
            "--max-model-len",
            "128",
            "--seed",
            "7",
        ]
    )
    cfg = EngineConfig(**flag_values(args, EngineConfig))
    assert (cfg.model, cfg.load_format, cfg.num_kv_blocks, cfg.max_model_len, cfg.seed) == (
        "llama-3.2-1b",
        "dummy",
        4,
        128,
        7,
    )
    assert cfg.torch_dtype == torch.bfloat16 and cfg.torch_device == torch.device("cpu")
    assert EngineConfig(**flag_values(p.parse_args([]), EngineConfig)) == EngineConfig()


def test_load_formats_and_dtypes_match_the_engine():
    assert set(LOAD_FORMATS) == {"auto", *LOADERS.names()}
    assert {EngineConfig(dtype=d).torch_dtype for d in DTYPES} == {torch.float32, torch.bfloat16, torch.float16}
    assert EngineConfig().torch_dtype == torch.float32
