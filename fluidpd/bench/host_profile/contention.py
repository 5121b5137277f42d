"""Contention: a decode and a prefill step timed while other worker processes run steps at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from statistics import median

from fluidpd.bench.host_profile.step_bench import StepBench, with_blocks
from fluidpd.core.cpu import worker_threads


def _contention_child(config, conn, threads: int, tokens: int = 256) -> None:  # in a spawned process
    import torch

    from fluidpd.engine.engine import LLMEngine
    from fluidpd.engine.plan import PrefillChunk, StepPlan

    torch.set_num_threads(threads)
    bench = StepBench(LLMEngine(config), os.getpid())
    decodes = [bench.request(tokens - 1, tokens - 1) for _ in range(4)]
    conn.send("ready")
    while (msg := conn.recv()) != "stop":
        kind, seconds = msg
        ts, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(ts) < 3:
            if kind == "decode":
                if bench.engine.blocks.num_free < len(decodes):  # contexts grew: start them again
                    bench.abort(decodes)
                    decodes = [bench.request(tokens - 1, tokens - 1) for _ in range(4)]
                ts.append(bench.timed(StepPlan(decodes=list(decodes))))
            else:
                r = bench.request(tokens, 0)
                ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(r, tokens)])))
                bench.abort([r])
        conn.send(median(ts))


def measure_contention(
    engine_config, workers: int, seconds: float, advance, rounds: int = 2, tokens: int = 256
) -> dict:
    """Step time while k = 1..workers processes (each with the torch threads a worker of a
    `workers`-worker cluster on this host runs: `worker_threads(workers)`) run steps at once, as
    slowdowns against k = 1: a decode step (4 x `tokens` tokens) and a `tokens`-token prefill, among k - 1
    steps of the same kind ("decode", "prefill") and among k - 1 of the other ("decode_cross":
    a decode step while the others prefill; "prefill_cross"). Each level is timed right after
    the step alone (the host's speed drifts), over `rounds` rounds; the medians of the ratios."""
    pipes: list = []
    procs: list = []
    try:
        # 4 x `tokens` decoding, their growth, a prefill (at least 256 blocks)
        _start(with_blocks(engine_config, max(256, tokens)), workers, pipes, procs, worker_threads(workers), tokens)

        def timed(kind: str, others: str, k: int) -> float:  # worker 0's median step, k - 1 others busy
            pipes[0].send((kind, seconds))
            for pipe in pipes[1:k]:
                pipe.send((others, seconds))
            return _answers(pipes[:k], kind)[0]

        return _slowdowns(timed, workers, rounds, advance)
    finally:
        _stop(pipes, procs)


def _start(engine_config, workers: int, pipes: list, procs: list, threads: int, tokens: int = 256) -> None:
    """Spawn `workers` contention workers (appended to `pipes` and `procs`) and wait until each is ready."""
    ctx = mp.get_context("spawn")
    for _ in range(workers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_contention_child, args=(engine_config, child, threads, tokens), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for pipe, proc in zip(pipes, procs):
        try:
            ready = pipe.poll(600) and pipe.recv() == "ready"
        except EOFError:
            ready = False
        if not ready:
            raise RuntimeError(f"contention worker (pid {proc.pid}) did not start: exit code {proc.exitcode}")


def _slowdowns(timed, workers: int, rounds: int, advance) -> dict:
    """Each level's time over worker 0 alone just before it (the host drifts), median of rounds."""
    ratios: dict[tuple, list[float]] = {}
    alone: dict[str, list[float]] = {"decode": [], "prefill": []}
    for _ in range(rounds):
        for kind, other in (("decode", "prefill"), ("prefill", "decode")):
            for k in range(2, workers + 1):
                for label, others in (("same", kind), ("cross", other)):
                    base = timed(kind, kind, 1)
                    alone[kind].append(base)
                    ratios.setdefault((kind, label, k), []).append(timed(kind, others, k) / base)
                    advance()
    out: dict[str, list[float]] = {}
    for kind in ("decode", "prefill"):
        alone[kind] = alone[kind] or [timed(kind, kind, 1)]  # one worker: no levels
        out[kind] = [1.0] + [median(ratios[kind, "same", k]) for k in range(2, workers + 1)]
        out[f"{kind}_cross"] = [1.0] + [median(ratios[kind, "cross", k]) for k in range(2, workers + 1)]
        out[f"{kind}_s"] = [median(alone[kind]) * f for f in out[kind]]
    return out


def _stop(pipes: list, procs: list) -> None:
    for pipe in pipes:
        try:
            pipe.send("stop")
        except OSError:
            pass
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def _answers(pipes, kind: str) -> list[float]:
    try:
        return [pipe.recv() for pipe in pipes]
    except EOFError:
        raise RuntimeError(f"a contention worker died while timing {kind} steps") from None
