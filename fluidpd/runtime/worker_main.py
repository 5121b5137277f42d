"""The worker side: one engine behind a method table, and the worker process's entry point.

`EngineService` is what both backends execute calls on (the in-process backend on its own
thread, the process backend in the child). `run_worker` is the child's main loop: build the
engine (weights loaded here, in the child), report `StartInfo`, then answer `Call`s strictly in
arrival order until `Shutdown` or until the parent goes away.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import torch

from fluidpd.core.memory import trim_heap
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.messages import (
    METHODS,
    OUT_OF_BAND,
    Call,
    Reply,
    Shutdown,
    Started,
    StartFailed,
    StartInfo,
    decode,
    encode,
    portable_error,
)
from fluidpd.runtime.profile import EngineProfile, decode_step_time, profile_engine
from fluidpd.runtime.transport import configure_transport, get_transport
from fluidpd.runtime.transport.base import KVHandle, KVTransport

WARMUP_ID = "__fluidpd_warmup__"


class EngineService:
    """The worker methods, executed on one engine, one call at a time."""

    def __init__(self, worker_id: int, engine: LLMEngine, transport: str | KVTransport = "shm") -> None:
        self.worker_id, self.engine = worker_id, engine
        self.transport = get_transport(transport) if isinstance(transport, str) else transport

    def call(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        if method not in METHODS:
            raise AttributeError(f"worker has no method {method!r} (methods: {sorted(METHODS)})")
        return getattr(self, method)(*args, **(kwargs or {}))

    # ------------------------------------------------------------------ methods
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        produced: list[list[int] | None] | None = None,
    ) -> str:
        return self.engine.add_request(list(prompt_token_ids), params, request_id, produced=produced)

    def run_step(self, plan: StepPlan):
        return self.engine.run_step(plan)

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def export_kv(
        self, request_id: str, release: bool = True, transport: str | None = None, skip_blocks: int = 0
    ) -> KVHandle:
        """The request's KV as a handle of `transport` (default: this worker's), less its first
        `skip_blocks` full blocks (the destination holds them cached); with `release` the request
        leaves this engine. If the transport fails, a released request is put back."""
        t0 = time.perf_counter()
        payload = self.engine.export_kv(request_id, release=release, skip_blocks=skip_blocks)
        t1 = time.perf_counter()
        try:
            handle = (get_transport(transport) if transport else self.transport).send(payload)
        except BaseException:
            if release:
                self.engine.import_kv(payload, request_id=request_id)
            raise
        handle.timings["export_s"] = t1 - t0
        return handle

    def import_kv(self, handle: KVHandle, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Continue the request behind `handle` here; its id. The handle is released either way."""
        transport = get_transport(handle.transport)
        try:
            payload = transport.receive(handle)
            try:
                return self.engine.import_kv(payload, params, request_id)
            finally:
                payload.blocks = None  # drop the view of the segment before releasing it
                del payload
        finally:
            transport.release(handle)

    def resize_kv(self, num_blocks: int):
        return self.engine.resize_kv(num_blocks)

    def stats(self):
        return self.engine.stats()

    def ping(self, delay_s: float = 0.0) -> dict:
        if delay_s > 0:
            time.sleep(delay_s)
        return self.heartbeat()

    def heartbeat(self) -> dict:
        """Out of band (OUT_OF_BAND): answered while another call runs."""
        return {"worker_id": self.worker_id, "pid": os.getpid(), "time": time.time()}

    def profile(self) -> EngineProfile:
        """This worker's step times for the policy (`profile_engine`), at its torch threads, measured on a
        throwaway engine of its config sharing its model (no KV store): the serving engine's KV, prefix
        cache, counters and the node's store are left as they were."""
        return self._on_throwaway(profile_engine)

    def decode_probe(self, repeats: int = 8) -> float:
        """A one-request decode step's median time now, as `profile` measures it (the check of a kept profile)."""
        return self._on_throwaway(lambda e: decode_step_time(e, repeats))

    def _on_throwaway(self, fn):
        probe = LLMEngine(
            replace(self.engine.config, kv_store="", kv_store_bytes=0),
            model=self.engine.model,
            tokenizer=self.engine.tokenizer,
        )
        cuda = probe.arena.device.type == "cuda"
        try:
            return fn(probe)
        finally:
            del probe
            release_heap(cuda)


def release_heap(cuda: bool = False) -> None:
    """Hand what a throwaway engine freed (its arena, the profile's activations) back to the OS (and,
    with `cuda`, the device memory torch's allocator kept)."""
    import gc

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    trim_heap()


def warmup(engine: LLMEngine) -> float:
    """One prefill step and one decode step of a throwaway request; seconds. Leaves no state."""
    t0 = time.perf_counter()
    vocab = engine.model_config.vocab_size
    n = max(1, min(8, engine.max_model_len - 2))
    rid = engine.add_request(
        [1 + i % (vocab - 1) for i in range(n)], SamplingParams(max_tokens=2, ignore_eos=True), WARMUP_ID
    )
    try:
        engine.run_step(StepPlan(prefills=[PrefillChunk(rid, n)]))
        if rid in engine.seqs:
            engine.run_step(StepPlan(decodes=[rid]))
    finally:
        engine.abort(rid)
    return time.perf_counter() - t0


def build_engine(
    config: EngineConfig, *, model=None, tokenizer=None, do_warmup: bool = True
) -> tuple[LLMEngine, dict[str, float]]:
    """The engine and its start timings (weight_load_s, engine_build_s, warmup_s)."""
    t0 = time.perf_counter()
    if model is None:
        model, tok = load_model(config)
        tokenizer = tokenizer or tok
    t1 = time.perf_counter()
    engine = LLMEngine(config, model=model, tokenizer=tokenizer)
    t2 = time.perf_counter()
    w = warmup(engine) if do_warmup else 0.0
    return engine, {"weight_load_s": t1 - t0, "engine_build_s": t2 - t1, "warmup_s": w}


def start_info(
    worker_id: int, engine: LLMEngine, times: dict[str, float], process_start_s: float, total_s: float, transport: str
) -> StartInfo:
    c = engine.config
    return StartInfo(
        worker_id=worker_id,
        pid=os.getpid(),
        process_start_s=process_start_s,
        total_s=total_s,
        stats=engine.stats(),
        max_model_len=engine.max_model_len,
        kv_layout=engine.kv_layout,
        vocab_size=engine.model_config.vocab_size,
        model=c.model,
        load_format=c.load_format,
        device=str(c.device),
        transport=transport,
        threads=torch.get_num_threads(),  # call on the engine's thread: the count is per thread
        quantization=engine.model.quantization,
        attention=engine.model.attention,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""),
        **times,
    )


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_worker(conn, worker_id: int, config: EngineConfig, options: dict) -> None:
    """Entry point of a worker process (spawned): build the engine, then serve calls in order.

    SIGINT is ignored (the coordinator handles Ctrl-C and closes its workers); SIGTERM exits
    cleanly (pooled KV segments are unlinked on the way out)."""
    entered = time.time()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    torch.set_num_threads(int(options.get("num_threads", 1)))
    t0 = time.perf_counter()
    transport = options.get("transport", "shm")
    try:
        if options.get("kv_pool_bytes"):
            configure_transport(transport, pool_bytes=int(options["kv_pool_bytes"]))
        engine, times = build_engine(config, do_warmup=options.get("warmup", True))
        service = EngineService(worker_id, engine, transport)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        conn.send_bytes(encode(StartFailed(portable_error(exc, f"worker {worker_id} start"))))
        conn.close()
        return
    try:
        process_start_s = max(0.0, entered - options.get("spawn_time", entered))
        total = process_start_s + (time.perf_counter() - t0)
        conn.send_bytes(
            encode(Started(start_info(worker_id, engine, times, process_start_s, total, service.transport.name)))
        )
        _serve(conn, service, f"worker {worker_id} (pid {os.getpid()})")
    finally:
        service.transport.close()  # unlink this worker's pooled KV segments
        conn.close()


def _serve(conn, service: EngineService, where: str) -> None:
    """Calls run in order on this thread; a reader thread takes messages off the pipe and answers
    the out-of-band ones (heartbeats) at once, so a worker busy in a long step still answers."""
    calls: queue.Queue = queue.Queue()
    send_lock = threading.Lock()

    def reply(msg: Call) -> bool:
        try:
            data = encode(Reply(msg.call_id, True, service.call(msg.method, msg.args, msg.kwargs)))
        except Exception as exc:  # noqa: BLE001 - every error goes back on its future
            data = encode(Reply(msg.call_id, False, error=portable_error(exc, where)))
        try:
            with send_lock:
                conn.send_bytes(data)
        except (EOFError, OSError):
            return False
        return True

    def read() -> None:
        while True:
            try:
                msg = decode(conn.recv_bytes())
            except (EOFError, OSError):  # the parent went away
                break
            if isinstance(msg, Shutdown):
                break
            if isinstance(msg, Call) and msg.method in OUT_OF_BAND:
                reply(msg)
            elif isinstance(msg, Call):
                calls.put(msg)
        calls.put(None)  # after the calls already read: they still run

    threading.Thread(target=read, name="fluidpd-worker-reader", daemon=True).start()
    while (msg := calls.get()) is not None:
        if not reply(msg):
            return
