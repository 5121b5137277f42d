"""Worker-level costs of FluidRole vs restarting a worker, measured on SmolLM2 (Table 2 of the seed).

Restarts (each a fresh ProcessWorker; `StartInfo` timings):
  * cold restart: spawn + weight load from the GGUF (dequantise) + tokenizer + engine + warm-up step,
    plus shutting the old process down (`close`);
  * warm restart: the same, but the new process loads weights already in shared memory: the
    dequantised state dict (+ tokenizer.json) staged once to /dev/shm as safetensors.
In place (on the two live workers, nothing restarted, no weights touched):
  * migrate: N live decoding requests' KV to the peer (export_kv / shm / import_kv, pipelined);
  * resize: `resize_kv` of the whole arena (the emptied worker shrinks its KV pool to 1/4 and
    grows it back; the peer, holding the N requests, shrinks to exactly its live blocks, moving them).
in_place_s = migrate + one arena re-slice (the shrink of the emptied worker). The drain, the
dispatch swap and the routing update are the coordinator's and are measured there.

    .venv/bin/python benchmarks/runtime/runtime_restart.py [--requests 8] [--prompt-len 128] [--kv-pool-mb 0]

`measure_restarts(config)` returns every figure as a dict (for the coordinator-level benchmark).
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import tempfile
import time

import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.process import ProcessWorker
from fluidpd.runtime.staging import stage_weights
from fluidpd.runtime.transport.shm import leftover_segments


def _start(worker_id: int, config: EngineConfig, kv_pool_bytes: int = 0) -> tuple[ProcessWorker, dict]:
    w = ProcessWorker(worker_id, config, kv_pool_bytes=kv_pool_bytes)
    info = w.start()
    return w, {
        "process_start_s": info.process_start_s,
        "weight_load_s": info.weight_load_s,
        "engine_build_s": info.engine_build_s,
        "warmup_s": info.warmup_s,
        "start_s": info.total_s,
        "weight_bytes": info.stats.weight_bytes,
    }


def _close_s(worker: ProcessWorker) -> float:
    t0 = time.perf_counter()
    worker.close()
    return time.perf_counter() - t0


def _load_requests(w: ProcessWorker, n: int, prompt_len: int, vocab: int, decode_steps: int) -> list[str]:
    """N greedy requests with random prompts, prefilled in one step and decoded a few steps."""
    g = torch.Generator().manual_seed(0)
    rids = [f"live{i}" for i in range(n)]
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    for rid in rids:
        w.submit("add_request", rid, torch.randint(0, vocab, (prompt_len,), generator=g).tolist(), params)
    w.submit("run_step", StepPlan(prefills=[PrefillChunk(r, prompt_len) for r in rids])).result()
    for _ in range(decode_steps):
        w.submit("run_step", StepPlan(decodes=rids)).result()
    return rids


def migrate(src: ProcessWorker, dst: ProcessWorker, rids: list[str]) -> dict:
    """Move `rids` src -> dst, pipelined: each import is submitted as soon as its export returns."""
    imports: queue.Queue = queue.Queue()

    def forward(fut):
        try:
            h = fut.result()
            imports.put((h.nbytes, dst.submit("import_kv", h)))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            imports.put((0, exc))

    t0 = time.perf_counter()
    for r in rids:
        src.submit("export_kv", r).add_done_callback(forward)
    nbytes, done = 0, []
    for _ in rids:
        n, f = imports.get()
        if isinstance(f, BaseException):
            raise f
        nbytes += n
        done.append(f.result())
    s = time.perf_counter() - t0
    assert sorted(done) == sorted(rids)
    return {"migrate_s": s, "migrate_bytes": nbytes, "migrate_requests": len(rids)}


def measure_restarts(
    config: EngineConfig,
    *,
    num_requests: int = 8,
    prompt_len: int = 128,
    decode_steps: int = 2,
    staged_dir: str | None = None,
    kv_pool_bytes: int = 0,
) -> dict:
    """Cold and warm restart of a worker process vs the in-place pieces (migrate N requests, resize).

    `config`: the worker's EngineConfig (its arena must hold 2 x N x (prompt_len + 8) tokens).
    `staged_dir`: where to stage the weights (default: a fresh dir under /dev/shm, removed after).
    `kv_pool_bytes`: the workers' KV segment pool (0: a fresh segment per transfer).
    Returns seconds (and bytes) by name, plus the ratios restart / in place."""
    out: dict = {
        "model": config.model,
        "num_requests": num_requests,
        "prompt_len": prompt_len,
        "kv_pool_bytes": kv_pool_bytes,
    }
    cold, cold_t = _start(0, config, kv_pool_bytes)  # 1. cold start (GGUF)
    workers = [cold]
    tmp = None
    try:
        out.update({f"cold_{k}": v for k, v in cold_t.items()})
        if staged_dir is None:
            tmp = staged_dir = tempfile.mkdtemp(prefix="fluidpd-weights-", dir="/dev/shm")
        t0 = time.perf_counter()
        staged = stage_weights(config, staged_dir)  # 2. one-time staging to shm
        out["stage_s"] = time.perf_counter() - t0
        out["staged_bytes"] = sum(os.path.getsize(os.path.join(staged_dir, f)) for f in os.listdir(staged_dir))
        warm, warm_t = _start(1, staged, kv_pool_bytes)  # 3. warm start (safetensors in shm)
        workers.append(warm)
        out.update({f"warm_{k}": v for k, v in warm_t.items()})

        # 4. in place: N live decoding requests on `cold`, migrated to `warm`; then re-slice the arena
        vocab = cold.info.vocab_size
        rids = _load_requests(cold, num_requests, prompt_len, vocab, decode_steps)
        out.update(migrate(cold, warm, rids))
        assert cold.submit("stats").result().num_used_blocks == 0
        st = cold.submit("stats").result()
        shrink = cold.submit("resize_kv", max(1, st.num_kv_blocks // 4))
        t0 = time.perf_counter()
        r = shrink.result()
        out["resize_rt_s"] = time.perf_counter() - t0
        out["resize_s"] = r.seconds
        out["resize_grow_s"] = cold.submit("resize_kv", st.num_kv_blocks).result().seconds
        used = warm.submit("stats").result().num_used_blocks
        total = warm.submit("stats").result().num_kv_blocks
        rm = warm.submit("resize_kv", used).result()
        out["resize_live_s"], out["resize_live_moved_blocks"] = rm.seconds, rm.moved_blocks
        warm.submit("resize_kv", total).result()
        step = warm.submit("run_step", StepPlan(decodes=rids)).result()  # the migrated requests go on
        assert len(step.outputs) == num_requests and all(len(o.new_token_ids) == 1 for o in step.outputs)
        for rid in rids:
            warm.submit("abort", rid)
        out["in_place_s"] = out["migrate_s"] + out["resize_s"]

        # 5. teardown of a worker (the other half of a restart)
        out["cold_close_s"] = _close_s(cold)
        out["warm_close_s"] = _close_s(warm)
    finally:
        for w in workers:
            w.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    out["cold_restart_s"] = out["cold_close_s"] + out["cold_start_s"]
    out["warm_restart_s"] = out["warm_close_s"] + out["warm_start_s"]
    out["cold_over_in_place"] = out["cold_restart_s"] / out["in_place_s"]
    out["warm_over_in_place"] = out["warm_restart_s"] / out["in_place_s"]
    out["leftover_segments"] = len(leftover_segments())
    return out


def report(r: dict) -> list[str]:
    ms = lambda s: f"{s * 1e3:.1f} ms"
    lines = [
        f"SmolLM2 worker ({r['cold_weight_bytes'] / 1e6:.0f} MB of weights), one process, one torch thread",
        f"cold restart  {r['cold_restart_s']:7.2f} s = close {r['cold_close_s']:.2f} + spawn/imports "
        f"{r['cold_process_start_s']:.2f} + weights (GGUF) {r['cold_weight_load_s']:.2f} + engine "
        f"{r['cold_engine_build_s']:.2f} + warm-up {r['cold_warmup_s']:.2f} "
        f"(+ pipe/wait; start {r['cold_start_s']:.2f})",
        f"warm restart  {r['warm_restart_s']:7.2f} s = close {r['warm_close_s']:.2f} + spawn/imports "
        f"{r['warm_process_start_s']:.2f} + weights (shm safetensors) {r['warm_weight_load_s']:.2f} + engine "
        f"{r['warm_engine_build_s']:.2f} + warm-up {r['warm_warmup_s']:.2f} (start {r['warm_start_s']:.2f}; "
        f"one-time staging {r['stage_s']:.2f} s, {r['staged_bytes'] / 1e6:.0f} MB)",
        f"in place      {ms(r['in_place_s']):>9} = migrate {r['num_requests']} live requests "
        f"({r['migrate_bytes'] / 1e6:.1f} MB KV, {'pooled' if r['kv_pool_bytes'] else 'one-shot'} shm segments) "
        f"{ms(r['migrate_s'])} + resize_kv of the arena {ms(r['resize_s'])}",
        f"              (resize: grow back {ms(r['resize_grow_s'])}, round trip {ms(r['resize_rt_s'])}; "
        f"shrink to the live blocks moving {r['resize_live_moved_blocks']} {ms(r['resize_live_s'])})",
        f"headline: worker restart vs in-place (SmolLM2, {r['num_requests']} live requests): cold restart "
        f"{r['cold_restart_s']:.2f} s, warm restart {r['warm_restart_s']:.2f} s, in place (migrate KV + resize) "
        f"{ms(r['in_place_s'])}: cold/in-place {r['cold_over_in_place']:.0f}x, "
        f"warm/in-place {r['warm_over_in_place']:.0f}x",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--kv-pool-mb", type=int, default=0, help="workers' pool of reused KV segments (0: one-shot)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    need = -(-(args.prompt_len + 8) // 16) * args.requests
    if need > args.kv_blocks:
        ap.error(f"{args.requests} requests of {args.prompt_len} tokens need {need} KV blocks > --kv-blocks")
    r = measure_restarts(
        EngineConfig(num_kv_blocks=args.kv_blocks),
        num_requests=args.requests,
        prompt_len=args.prompt_len,
        kv_pool_bytes=args.kv_pool_mb << 20,
    )
    for line in report(r):
        print(line)


if __name__ == "__main__":
    main()
