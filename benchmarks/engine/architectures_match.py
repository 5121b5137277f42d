"""Every architecture the engine serves, as a user meets it: a tiny random-weight checkpoint written
as transformers writes one (config.json and safetensors, SmolLM2's vocabulary), run through
`fluidpd generate` (a subprocess, greedy) and through transformers' generate loading the same
directory (float64); the continuations compared token for token.

    .venv/bin/python benchmarks/engine/architectures_match.py [--max-tokens 24] [--out results/architectures_match]

Last line: "N of N architectures match".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from fluidpd.engine.architectures import ARCHITECTURES
from fluidpd.engine.loaders import smollm2_gguf
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.tokenizer import Tokenizer

PROMPT = "The paged KV cache of a serving engine"


def checkpoint(arch: str, vocab: int, path: Path) -> None:
    """A tiny `arch` model with random weights (a sharp lm_head: no near-ties for greedy to break)."""
    cfg = tiny_config(arch, vocab)
    tensors = random_tensors(cfg, torch.float32, seed=7)
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * 50
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    save_file(tensors, str(path / "model.safetensors"))


def ours(path: Path, max_tokens: int) -> str:
    cmd = [sys.executable, "-m", "fluidpd.cli", "generate", "--model", str(path), "--tokenizer", "smollm2"]
    cmd += ["--prompt", PROMPT, "--max-tokens", str(max_tokens), "--kv-cache-dtype", "float32"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.rstrip("\n")


def reference(path: Path, ids: list[int], max_tokens: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(  # eager experts: float64 has no grouped GEMM
        str(path), dtype=torch.float64, experts_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    return out[0, len(ids) :].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--out", default="results/architectures_match")
    args = ap.parse_args()
    if args.max_tokens < 1:
        ap.error("--max-tokens must be >= 1")
    tok = Tokenizer.from_gguf(smollm2_gguf())
    ids = tok.encode(PROMPT)
    archs = [*sorted(set(ARCHITECTURES.values())), "mistral"]  # mistral: Llama with a sliding window
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in tqdm(archs, desc="architectures", file=sys.stderr):
            path = Path(tmp) / arch
            checkpoint(arch, tok.vocab_size, path)
            text = ours(path, args.max_tokens)
            expected = tok.decode(reference(path, ids, args.max_tokens))
            name = tiny_config(arch).to_hf()["architectures"][0]
            rows.append({"architecture": name, "match": text == expected, "fluidpd": text, "transformers": expected})
            print(f"{name:20s} {'match' if text == expected else 'DIFFER'}  {text!r}", flush=True)
            if text != expected:
                print(f"{'':20s} transformers: {expected!r}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "architectures_match.json").write_text(json.dumps({"prompt": PROMPT, "rows": rows}, indent=1))
    print(f"{sum(r['match'] for r in rows)} of {len(rows)} architectures match")


if __name__ == "__main__":
    main()
