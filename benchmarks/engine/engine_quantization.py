"""Quantised weights vs the fp32 reference on the shipped SmolLM2 GGUF: perplexity drift, logit error, greedy agreement.

For each weight format (`--quantization`: none is the reference, fp16, int8, gguf, gguf-q8): perplexity over
held texts (two windows of the seed documents, 1024 tokens each, never used to pick a
tolerance), the largest |logit - reference logit| relative to the largest logit, top-1
agreement with the reference at every position, how many greedy 32-token continuations of
the engine tests' prompts equal the reference's (and where the first differs), and the bytes of
weights a decode step streams (MB).

    .venv/bin/python benchmarks/engine/engine_quantization.py [--tokens 1024] [--formats fp16,int8,gguf,gguf-q8]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
from engine_common import engine, progress

from fluidpd.engine import SamplingParams

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "engine"))
from engine_testdata import PROMPTS  # noqa: E402

SEEDS = os.path.join(ROOT, "..", "shared", "seeds")


def held_texts() -> dict[str, str]:
    out = {}
    for name in ("distserve.txt", "fluidpd.txt"):
        path = os.path.join(SEEDS, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            out[name] = text[len(text) // 3 : len(text) // 3 + 8000]
    if not out:  # the seeds live beside the repository; fall back to the README
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            out["README.md"] = f.read()[:8000]
    return out


def nll(logits: torch.Tensor, ids: list[int]) -> float:
    lp = torch.log_softmax(logits[:-1].double(), -1)
    return -lp.gather(1, torch.tensor(ids[1:])[:, None]).mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--formats", default="fp16,int8,gguf,gguf-q8", help="formats beside the reference none")
    args = ap.parse_args()
    formats = ("none", *(q for q in args.formats.split(",") if q != "none"))
    engines = {q: engine(256, quantization=q, max_num_batched_tokens=args.tokens) for q in formats}
    tok = engines["none"].tokenizer
    texts = {k: tok.encode(v)[: args.tokens] for k, v in held_texts().items()}
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    logits, greedy = {}, {}
    for q in progress(formats, "formats"):
        logits[q] = {k: engines[q].prompt_logits(ids) for k, ids in texts.items()}
        greedy[q] = [engines[q].generate([p], params)[0].token_ids for p in PROMPTS]
    print(
        f"{'format':6} {'MB':>6} " + " ".join(f"{'ppl ' + k[:9]:>14}" for k in texts) + "  max|dlogit|  top-1  greedy"
    )
    summary = {}
    for q in formats:
        ppl = {k: math.exp(nll(logits[q][k], ids)) for k, ids in texts.items()}
        drift = max(ppl[k] / math.exp(nll(logits["none"][k], ids)) - 1 for k, ids in texts.items())
        rel = max(
            ((logits[q][k] - logits["none"][k]).abs().max() / logits["none"][k].abs().max()).item() for k in texts
        )
        top1 = sum((logits[q][k].argmax(-1) == logits["none"][k].argmax(-1)).sum().item() for k in texts) / sum(
            len(ids) for ids in texts.values()
        )
        same = sum(a == b for a, b in zip(greedy[q], greedy["none"]))
        first = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(greedy[q], greedy["none"])
        ]
        summary[q] = (drift, top1, same)
        print(
            f"{q:6} {engines[q].model.weight_bytes() / 1e6:6.1f} "
            + " ".join(f"{ppl[k]:14.3f}" for k in texts)
            + f"  {rel:10.2%}  {top1:6.1%}  {same}/{len(PROMPTS)} equal (first difference at {first})"
        )
    print(
        "engine_quantization: perplexity drift vs fp32 "
        + ", ".join(f"{q} {d:+.2%}" for q, (d, _, _) in summary.items() if q != "none")
        + "; top-1 agreement "
        + ", ".join(f"{q} {t:.1%}" for q, (_, t, _) in summary.items() if q != "none")
        + "; greedy equal "
        + ", ".join(f"{q} {s}/{len(PROMPTS)}" for q, (_, _, s) in summary.items() if q != "none")
    )


if __name__ == "__main__":
    main()
