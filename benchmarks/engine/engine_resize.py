"""`resize_kv` across the whole arena (FluidRole's memory remap) and the engine's peak memory.

An engine (SmolLM2 fp32) with an arena of --blocks KV blocks holds live decoding sequences.
Each repeat:
  * shrink: KV -> scratch, down to the live blocks + 1 (the whole rest of the arena becomes
    scratch), with the live blocks sitting at the top of the pool so every one must move;
  * grow: scratch -> KV, back to every block the arena holds;
  * the same shrink with the live blocks already at the bottom (nothing to move: re-slice only).
Medians of --repeats; then the process's peak RSS against weights + arena.

    python benchmarks/engine/engine_resize.py [--blocks 1024] [--live 4] [--ctx 256] [--repeats 7]
"""

from __future__ import annotations

import argparse

from engine_common import SamplingParams, engine, median, peak_rss_mib, progress, random_prompts, rss_mib, shared_model

from fluidpd.engine.sequence import Sequence


def live_engine(blocks: int, live: int, ctx: int):
    """An engine whose `live` decoding sequences occupy the highest block ids."""
    eng = engine(blocks, max_num_batched_tokens=max(2048, live * ctx))
    filler = Sequence("filler", [0], 1, SamplingParams())  # holds the low block ids meanwhile
    eng.blocks.allocate(filler, (blocks - live * (-(-(ctx + 8) // 16)) - 1) * 16)
    rids = [eng.add_request(p, SamplingParams(max_tokens=4096, ignore_eos=True)) for p in random_prompts([ctx] * live)]
    while any(not eng.request(r).is_decoding for r in rids):
        _prefill(eng, rids)
    eng.blocks.free(filler)
    return eng, rids


def _prefill(eng, rids):
    from engine_common import StepPlan

    from fluidpd.engine import PrefillChunk

    plan = StepPlan(
        prefills=[PrefillChunk(r, eng.request(r).num_uncomputed) for r in rids if not eng.request(r).is_decoding]
    )
    eng.run_step(plan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--live", type=int, default=4, help="live decoding sequences")
    ap.add_argument("--ctx", type=int, default=256, help="context tokens of each live sequence")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    rss_torch = rss_mib()
    shared_model()
    rss_model = rss_mib()
    shrink, grow, reslice, moved, live_rss = [], [], [], 0, 0.0
    for _ in progress(range(args.repeats), "repeats"):
        eng, _rids = live_engine(args.blocks, args.live, args.ctx)
        live_rss = max(live_rss, rss_mib())
        used = eng.stats().num_used_blocks
        r = eng.resize_kv(used + 1)
        shrink.append(r.seconds)
        moved = r.moved_blocks
        grow.append(eng.resize_kv(eng.arena.max_blocks).seconds)
        reslice.append(eng.resize_kv(used + 1).seconds)  # live blocks are low now
        eng.resize_kv(eng.arena.max_blocks)
        for _ in range(2):  # still decodes after the remaps
            eng.step()
        st = eng.stats()
        del eng
    mb = moved * st.block_bytes / 1e6
    print(
        f"arena {st.arena_bytes / 2**20:.0f} MiB: {args.blocks} KV blocks of {st.block_bytes / 1024:.0f} KiB "
        f"+ scratch; {args.live} live sequences x {args.ctx} tokens = {used} blocks"
    )
    print(f"shrink to {used + 1} blocks, moving {moved} blocks ({mb:.1f} MB): {median(shrink) * 1e3:.2f} ms")
    print(f"grow back to {st.max_kv_blocks} blocks: {median(grow) * 1e3:.3f} ms")
    print(f"shrink with nothing to move (re-slice only): {median(reslice) * 1e3:.3f} ms")
    weights = st.weight_bytes / 2**20
    print(
        f"RSS: torch imported {rss_torch:.0f} MiB; + model {rss_model:.0f} MiB (weights {weights:.0f} MiB, "
        f"GGUF mapping, tokenizer); + arena = live engine {live_rss:.0f} MiB (arena "
        f"{st.arena_bytes / 2**20:.0f} MiB); process peak {peak_rss_mib():.0f} MiB; medians of {args.repeats}"
    )
    print(
        f"engine_resize: whole-arena resize_kv shrink {median(shrink) * 1e3:.2f} ms (moving {mb:.0f} MB), "
        f"grow {median(grow) * 1e3:.3f} ms, re-slice {median(reslice) * 1e3:.3f} ms (target <= 10 ms); "
        f"peak RSS {peak_rss_mib():.0f} MiB"
    )


if __name__ == "__main__":
    main()
