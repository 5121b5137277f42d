"""Decode time per token of mixtures of experts against dense models, on the roofline latency model.

One H100 (datasheet roofline, default knobs), every sequence at 2,048 tokens of context: the step
time of a decode batch of 1 and of 64, per token, and the weights the step streams (a dense model
all of them; a mixture its dense part and the experts the batch touches, E * (1 - (1 - k/E)^batch)
per layer). A model whose weights exceed one H100 is timed as if they fit (marked). Then the 235B
mixture on 4 H100s, tensor parallel against expert parallel (the same weights per GPU; the MLP's
all-reduce against a dispatch and a combine all-to-all).

    .venv/bin/python benchmarks/simulation/sim_moe_decode.py [--dtype fp8] [--ctx 2048]
"""

from __future__ import annotations

import argparse

from fluidpd.latency.roofline import RooflineModel
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "qwen3-8b", "llama-3.1-8b", "qwen3-32b", "llama-3.3-70b")
BATCHES = (1, 64)


def fits(r: RooflineModel) -> bool:
    try:
        r.capacity_kv_tokens()
    except ValueError:
        return False
    return True


def row(r: RooflineModel, batch: int, ctx: int) -> dict:
    step = r.decode_time(batch, ctx)
    return {
        "step_ms": step * 1e3,
        "ms_per_token": step * 1e3 / batch,
        "weights_gb": r.weight_bytes_read(batch) / 1e9,
        "experts": r.model.experts_touched(batch),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="fp8", help="weights and KV (default: fp8, Table 1's)")
    p.add_argument("--ctx", type=int, default=2048, help="context tokens of every sequence")
    args = p.parse_args()
    h100 = get_hardware("h100")
    rows = {}
    print(f"decode on 1 x h100, {args.dtype}, {args.ctx} tokens of context each")
    for name in MODELS:
        m = get_model(name, args.dtype)
        r = RooflineModel(m, h100)
        rows[name] = {b: row(r, b, args.ctx) for b in BATCHES}
        cells = "  ".join(
            f"batch {b}: {x['step_ms']:6.2f} ms/step {x['ms_per_token']:6.3f} ms/token {x['weights_gb']:6.2f} GB"
            + (f" ({x['experts']:.1f} experts)" if m.n_experts else "")
            for b, x in rows[name].items()
        )
        mark = "" if fits(r) else "  (does not fit one h100)"
        print(f"  {name:16s} {m.active_params / 1e9:5.1f}B of {m.params / 1e9:5.1f}B  {cells}{mark}")
    big = get_model("qwen3-235b-a22b", args.dtype)
    for batch in BATCHES:
        tp, ep = (RooflineModel(big, h100, tp=4, ep=e).decode_time(batch, args.ctx) * 1e3 for e in (1, 4))
        print(f"  qwen3-235b-a22b on 4 x h100, batch {batch}: TP4 {tp:.2f} ms/step, TP4 EP4 {ep:.2f} ms/step")
    moe, dense = rows["qwen3-30b-a3b"], rows["llama-3.1-8b"]
    print(
        "headline: qwen3-30b-a3b decode per token "
        + ", ".join(f"batch {b} {moe[b]['ms_per_token'] / dense[b]['ms_per_token']:.2f}x" for b in BATCHES)
        + " llama-3.1-8b's (weights streamed "
        + ", ".join(f"{moe[b]['weights_gb']:.1f} vs {dense[b]['weights_gb']:.1f} GB" for b in BATCHES)
        + ")"
    )


if __name__ == "__main__":
    main()
