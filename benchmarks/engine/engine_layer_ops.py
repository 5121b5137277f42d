"""Decode step time with the layer's small ops fused (C kernels) against the torch reference, same weights, same run.

SmolLM2 (GGUF, fp32 activations), one torch thread, pure decode steps at batch 1 (context 256)
and batch 8 (contexts 64..1024). Rounds alternate the two paths (`LlamaModel.ops` swapped on the
same engine), so both see the same machine load. Two figures per path: the whole step, and the
step with every linear (the LM head too) replaced by a stub returning a preallocated output ("no
linears": decode attention, the small ops, sampling and the Python around them). Medians
over rounds; a PNG of both.

    .venv/bin/python benchmarks/engine/engine_layer_ops.py [--rounds 7] [--steps 8] [--quantization fp16]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from engine_common import engine, median, random_prompts

from fluidpd.engine import SamplingParams, StepPlan
from fluidpd.engine.config import QUANTIZATIONS
from fluidpd.engine.layer_ops import FusedLayerOps, TorchLayerOps

LINEARS = ("qkv", "o", "gate_up", "down")


class StubLinear:
    """A linear layer's output shape at no cost: a slice of a preallocated buffer (`rows` from the real one)."""

    def __init__(self, lin, out_features: int, rows: int) -> None:
        self.out, self.rows = torch.zeros(rows, out_features), lin.rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.out[: x.shape[0]]


def set_ops(model, ops) -> None:
    model.ops = ops
    for layer in model.layers:
        layer.ops = ops


def swap_linears(model, stub: bool, saved: dict, rows: int) -> None:
    """Every linear (the LM head too) replaced by a stub, or put back."""
    owners = [(i, layer, name) for i, layer in enumerate(model.layers) for name in LINEARS]
    for i, owner, name in [*owners, (-1, model, "lm_head")]:
        if stub:
            saved[i, name] = lin = getattr(owner, name)
            out = lin.out_features if hasattr(lin, "out_features") else lin.weight.shape[1]
            setattr(owner, name, StubLinear(lin, out, rows))
        else:
            setattr(owner, name, saved[i, name])


def step_ms(eng, rids: list[str], steps: int) -> float:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.run_step(StepPlan(decodes=list(rids)))
        times.append(time.perf_counter() - t)
    return median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per round and path")
    ap.add_argument("--quantization", default="fp16", choices=QUANTIZATIONS)
    ap.add_argument("--plot", default="results/engine_layer_ops.png")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(1)
    cases = {"b1": [256], "b8": [rng.randint(64, 1024) for _ in range(8)]}
    per_round = 2 * 2 * args.steps + 2
    blocks = sum(-(-(n + args.rounds * per_round + 16) // 16) for n in cases["b8"]) + 64
    eng = engine(blocks, args.quantization)
    model, mc = eng.model, eng.model_config
    shape = (mc.num_heads, mc.num_kv_heads, mc.head_dim)
    paths = {"torch": TorchLayerOps(*shape), "fused": FusedLayerOps(*shape, mc.hidden_size, mc.intermediate_size)}
    res: dict[tuple[str, str, str], list[float]] = {}
    for case, lens in cases.items():
        params = SamplingParams(max_tokens=100000, ignore_eos=True)
        rids = [eng.add_request(p, params) for p in random_prompts(lens, 0)]
        while any(not eng.request(r).is_decoding for r in rids):
            eng.step()
        saved: dict = {}
        for _ in range(args.rounds):
            for stub in (False, True):
                if stub:
                    swap_linears(model, True, saved, len(rids))
                for name, ops in paths.items():
                    set_ops(model, ops)
                    eng.run_step(StepPlan(decodes=list(rids)))  # warm
                    key = (case, name, "no linears" if stub else "step")
                    res.setdefault(key, []).append(step_ms(eng, rids, args.steps))
                if stub:
                    swap_linears(model, False, saved, len(rids))
        for r in rids:
            eng.abort(r)
    med = {k: median(v) for k, v in res.items()}
    print(f"{'batch':6} {'what':11} {'torch ms':>9} {'fused ms':>9} {'fused/torch':>12}")
    for case in cases:
        for what in ("step", "no linears"):
            t, f = med[case, "torch", what], med[case, "fused", what]
            print(f"{case:6} {what:11} {t:9.2f} {f:9.2f} {f / t:12.2f}")
    _plot(args.plot, cases, med)
    b1 = {p: med["b1", p, "step"] for p in paths}
    g1 = {p: med["b1", p, "no linears"] for p in paths}
    b8 = {p: med["b8", p, "step"] for p in paths}
    print(
        f"engine_layer_ops (quantization {args.quantization}, medians of {args.rounds} alternating rounds): "
        f"batch-1 decode step {b1['fused']:.1f} ms fused vs {b1['torch']:.1f} ms torch "
        f"({b1['fused'] / b1['torch']:.2f}x), "
        f"without the linears {g1['fused']:.1f} vs {g1['torch']:.1f} ms ({g1['fused'] / g1['torch']:.2f}x); "
        f"batch 8 {b8['fused']:.1f} vs {b8['torch']:.1f} ms ({b8['fused'] / b8['torch']:.2f}x)"
    )


def _plot(path: str, cases: dict, med: dict) -> None:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, what in zip(axes, ("step", "no linears"), strict=True):
        x = range(len(cases))
        for j, p in enumerate(("torch", "fused")):
            ax.bar([i + 0.4 * j for i in x], [med[c, p, what] for c in cases], 0.4, label=p)
        ax.set_xticks([i + 0.2 for i in x], list(cases))
        ax.set_ylabel("ms (median)")
        ax.set_title(f"decode {what}")
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
