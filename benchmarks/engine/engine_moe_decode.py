"""Decode speed of a mixture of experts against the dense model of the same active size, on this CPU.

A Mixtral-shaped model (8 layers, hidden 512, 8 experts of intermediate 768, top 2) and the dense
model whose MLP is as large as the two active experts together (intermediate 1536), random float32
weights, the same attention; median decode step at batch 1 and 8 after a 32-token prompt each
(`engine_decode_steps`), both with the same layer ops. An MoE decode computes 2 of 8 experts per token
but at batch 8 its tokens touch up to all 8: the weights it streams grow with the batch.

    .venv/bin/python benchmarks/engine/engine_moe_decode.py [--steps 32] [--repeats 3]

Last line: MoE decode tokens/s over the dense model's at batch 1 and 8 (goal: >= 1 / 1.5 at batch 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from engine_common import EngineConfig, LLMEngine, engine_decode_steps, median, random_prompts
from safetensors.torch import save_file
from tqdm import tqdm

from fluidpd.engine.loaders.dummy import random_tensors
from fluidpd.engine.model_config import ModelConfig

MOE = ModelConfig(
    architecture="mixtral",
    vocab_size=49152,  # random_prompts draws ids up to 40000
    hidden_size=512,
    intermediate_size=768,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    rope_theta=1e6,
    max_position_embeddings=1024,
    num_experts=8,
    num_experts_per_tok=2,
)
DENSE = replace(MOE, architecture="llama", intermediate_size=2 * 768, num_experts=0, num_experts_per_tok=0)
BATCHES = (1, 8)


def engine(cfg: ModelConfig, path: Path) -> LLMEngine:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(random_tensors(cfg, torch.float32, seed=0), str(path / "model.safetensors"))
    return LLMEngine(EngineConfig(model=str(path), quantization="none", kv_cache_dtype="float32", num_kv_blocks=64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"moe": engine(MOE, Path(tmp) / "moe"), "dense": engine(DENSE, Path(tmp) / "dense")}
        steps: dict[tuple[str, int], list[float]] = {}
        bar = tqdm(total=args.repeats * len(BATCHES) * 2, desc="decode steps", file=sys.stderr)
        for _ in range(args.repeats):  # interleaved: both models see the same host load
            for b in BATCHES:
                for name, eng in engines.items():
                    steps.setdefault((name, b), []).extend(
                        engine_decode_steps(eng, random_prompts([32] * b), args.steps)
                    )
                    bar.update(1)
        bar.close()
    tps = {k: k[1] / median(v) for k, v in steps.items()}
    for b in BATCHES:
        print(f"batch {b}: moe {tps['moe', b]:7.1f} tok/s, dense {tps['dense', b]:7.1f} tok/s")
    ratios = {b: tps["moe", b] / tps["dense", b] for b in BATCHES}
    print(
        f"MoE (8 experts, top 2) decode over the dense model of its active size: batch 1 {ratios[1]:.2f}x, "
        f"batch 8 {ratios[8]:.2f}x (goal at batch 1: >= {1 / 1.5:.2f}x)"
    )


if __name__ == "__main__":
    main()
