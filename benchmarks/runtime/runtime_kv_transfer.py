"""KV transfer bandwidth between two worker processes through the shared-memory transport.

Two SmolLM2 worker processes (ProcessWorker, one torch thread each). For each KV size (256, 1024,
4096 tokens of SmolLM2 KV: 30 layers x K,V x 3 heads x 64 x fp32 = 46,080 B/token), one request
holding that much KV is ping-ponged between the workers: each hop is export_kv on one worker
(gather its blocks, write them to a fresh /dev/shm segment) + the handle through the coordinator
+ import_kv on the other (map the segment, copy into its arena, unlink), timed from the
coordinator from submit to the import's reply. The request's KV is seeded with random values of
SmolLM2's layout (the bytes moved do not depend on their values); after the last hop the
coordinator reads it back and checks it is bit-identical. Baseline, measured in the same run: a
plain single-threaded memcpy of the same bytes in one process (torch `copy_` between two
preallocated tensors). Median of `--repeats` hops per size.

Two modes: "oneshot" (the default transport: a fresh segment per transfer, unlinked by the
importer) and "pooled" (`ProcessWorker(kv_pool_bytes=...)`: the exporter reuses its segments, so
no transfer touches fresh pages).

    .venv/bin/python benchmarks/runtime/runtime_kv_transfer.py [--repeats 7] [--tokens 256 1024 4096]
        [--modes oneshot pooled] [--dummy-weights]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.kv_transfer import KVPayload
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.backend import start_workers
from fluidpd.runtime.process import ProcessWorker
from fluidpd.runtime.transport import get_transport
from fluidpd.runtime.transport.shm import leftover_segments

GB = 1e9


def seed_request(worker, rid: str, num_tokens: int, layout, vocab: int) -> torch.Tensor:
    """Give `worker` a decoding request holding `num_tokens` positions of random KV; the blocks."""
    g = torch.Generator().manual_seed(num_tokens)
    nb = -(-num_tokens // layout.block_size)
    dtype = getattr(torch, layout.dtype.removeprefix("torch."))
    blocks = torch.randn((nb, *layout.block_shape), generator=g).to(dtype)
    ids = torch.randint(0, vocab, (num_tokens + 1,), generator=g).tolist()
    payload = KVPayload(rid, ids, num_tokens, num_tokens, blocks, layout, SamplingParams(max_tokens=16))
    handle = get_transport("shm").send(payload)
    assert worker.submit("import_kv", handle).result() == rid
    return blocks


def memcpy_s(nbytes: int, repeats: int) -> float:
    src = torch.rand(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(sizes: list[int], repeats: int, config: EngineConfig, pool_bytes: int = 0) -> list[dict]:
    """One row per KV size; `pool_bytes` > 0: the workers export through reused (pooled) segments."""
    workers = [ProcessWorker(i, config, kv_pool_bytes=pool_bytes) for i in range(2)]
    infos = start_workers(workers)
    rows = []
    try:
        layout = infos[0].kv_layout
        vocab = infos[0].vocab_size
        for n in sizes:
            rid = f"kv{n}"
            blocks = seed_request(workers[0], rid, n, layout, vocab)
            hops, export_s, send_s = [], [], []
            src, dst = 0, 1
            for _ in range(repeats + 1):  # the first hop warms both sides up
                t0 = time.perf_counter()
                h = workers[src].submit("export_kv", rid).result()
                assert workers[dst].submit("import_kv", h).result() == rid
                hops.append(time.perf_counter() - t0)
                export_s.append(h.timings["export_s"])
                send_s.append(h.timings["send_s"])
                src, dst = dst, src
            back = workers[src].submit("export_kv", rid).result()
            t = get_transport("shm")
            payload = t.receive(back)
            intact = torch.equal(payload.blocks, blocks)
            del payload
            t.release(back)
            assert intact, "KV changed in transit"
            nbytes = h.nbytes
            hop = statistics.median(hops[1:])
            mc = memcpy_s(nbytes, repeats)
            rows.append(
                {
                    "tokens": n,
                    "bytes": nbytes,
                    "hop_s": hop,
                    "export_s": statistics.median(export_s[1:]),
                    "send_s": statistics.median(send_s[1:]),
                    "transfer_gbps": nbytes / hop / GB,
                    "memcpy_s": mc,
                    "memcpy_gbps": nbytes / mc / GB,
                    "ratio": mc / hop,
                }
            )
    finally:
        for w in workers:
            w.close()
    assert not leftover_segments(), f"leftover KV segments: {leftover_segments()}"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["oneshot", "pooled"],
        default=["oneshot", "pooled"],
        help="oneshot: a fresh segment per transfer (the default transport); pooled: reused segments",
    )
    ap.add_argument(
        "--dummy-weights", action="store_true", help="random weights of SmolLM2's shape (same KV layout; starts faster)"
    )
    args = ap.parse_args()
    if args.repeats < 1 or min(args.tokens) < 1:
        ap.error("--repeats and --tokens must be >= 1")
    torch.set_num_threads(1)
    blocks = -(-max(args.tokens) // 16) + 8
    config = EngineConfig(num_kv_blocks=blocks, load_format="dummy" if args.dummy_weights else "auto")
    nbytes_max = blocks * 16 * 46080
    results = {}
    for mode in args.modes:
        pool = 0 if mode == "oneshot" else -(-(nbytes_max + (1 << 20)) // (1 << 20)) << 20
        results[mode] = measure(sorted(args.tokens), args.repeats, config, pool)
    print(f"KV transfer between 2 worker processes (shm transport), SmolLM2 KV fp32, median of {args.repeats} hops")
    print(
        f"{'mode':>8} {'tokens':>7} {'MB':>8} {'hop ms':>8} {'export ms':>9} {'send ms':>8} {'GB/s':>7} "
        f"{'memcpy GB/s':>11} {'ratio':>6}"
    )
    for mode, rows in results.items():
        for r in rows:
            print(
                f"{mode:>8} {r['tokens']:>7} {r['bytes'] / 1e6:>8.1f} {r['hop_s'] * 1e3:>8.1f} "
                f"{r['export_s'] * 1e3:>9.1f} {r['send_s'] * 1e3:>8.1f} {r['transfer_gbps']:>7.2f} "
                f"{r['memcpy_gbps']:>11.2f} {r['ratio']:>6.2f}"
            )
    print(
        "(hop = export_kv on one worker + import_kv on the other, timed at the coordinator; export = the engine's "
        "gather into a new tensor; send = the copy into shared memory)"
    )
    parts = []
    for mode, rows in results.items():
        big = rows[-1]
        parts.append(
            f"{mode} {big['transfer_gbps']:.2f} GB/s = {big['ratio']:.2f}x memcpy ({big['memcpy_gbps']:.2f} GB/s), "
            f"{big['hop_s'] * 1e3:.0f} ms"
        )
    big = next(iter(results.values()))[-1]
    print(
        f"headline: KV transfer worker->worker via shm, {big['tokens']} tokens ({big['bytes'] / 1e6:.0f} MB): "
        + "; ".join(parts)
    )


if __name__ == "__main__":
    main()
