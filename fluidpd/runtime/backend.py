"""WorkerBackend: one worker (one LLMEngine) as the coordinator sees it, whatever runs it.

    worker.start() -> StartInfo                      blocking: build the engine (spawn first, for processes)
    worker.submit(method, *args, **kwargs) -> Future non-blocking; resolves from a background thread
    worker.close()                                   idempotent

Methods (executed on the worker's engine, strictly in submission order per worker):
    add_request(request_id, prompt_token_ids, params, produced=None) -> request_id
                                                     (n > 1: produced[j], choice j's tokens so far; None: it finished)
    run_step(plan: StepPlan) -> StepResult
    abort(request_id) -> bool
    export_kv(request_id, release=True, transport=None, skip_blocks=0) -> KVHandle
                                                     (with release the request leaves the engine; the
                                                     first skip_blocks full blocks stay behind: the
                                                     importer holds them cached, else its import raises
                                                     MissingCachedBlocks, a ValueError)
    import_kv(handle, params=None, request_id=None) -> request_id   (the handle is released either way)
    resize_kv(num_blocks) -> ResizeResult
    stats() -> EngineStats
    ping(delay_s=0.0) -> {"worker_id", "pid", "time"}
    profile() -> EngineProfile                       the engine's step times, at the worker's threads
                                                     (on a throwaway engine sharing its model)

Errors: an exception raised by the engine comes back on the Future as the same type with the same
message. Cancelling a Future only drops its outcome: the call still runs, in order (so both
backends leave the engine in the same state). A dead worker process fails every pending Future, and every later one,
with `WorkerDiedError` (a RuntimeError); a closed worker with `WorkerClosedError` (a RuntimeError).

Backends: `InProcessWorker` (the engine in this process, on its own thread; models can be
shared) and `ProcessWorker` (a spawned process per worker, control over a Pipe, KV over shared
memory). The futures are `concurrent.futures.Future`s: in asyncio, `await asyncio.wrap_future(f)`
(callbacks run on the backend's thread: use `loop.call_soon_threadsafe` to touch loop state).
`start()` blocks for seconds (weights): from a running loop, `await loop.run_in_executor(None,
worker.start)`, or `start_workers([...])` in an executor to start several at once.

A KV migration is two calls on two workers: `h = await A.submit("export_kv", rid)` then
`await B.submit("import_kv", h)`; if the import will not happen (abort), call
`fluidpd.runtime.transport.release(h)`. A failed import has already released the handle.
With ProcessWorker, the main module must be import-safe (`if __name__ == "__main__":`), as
always with the spawn start method.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from fluidpd.core.registry import Registry
from fluidpd.runtime.inprocess import InProcessWorker
from fluidpd.runtime.messages import StartInfo
from fluidpd.runtime.process import ProcessWorker
from fluidpd.runtime.ray_worker import RayWorker


@runtime_checkable
class WorkerBackend(Protocol):
    """One worker as the coordinator sees it: start it, submit calls to it, close it."""

    worker_id: int

    @property
    def pid(self) -> int | None: ...  # the process its engine runs in (None before start)

    def start(self) -> StartInfo: ...

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future: ...

    def close(self) -> None: ...


WORKERS: Registry[type[WorkerBackend]] = Registry("worker backend")
WORKERS.add("inprocess", InProcessWorker)
WORKERS.add("process", ProcessWorker)
WORKERS.add("ray", RayWorker)


def make_worker(kind: str, worker_id: int, config, **kwargs: Any) -> WorkerBackend:
    """A worker of a registered backend ("inprocess", "process" or "ray"); kwargs go to its constructor."""
    return WORKERS.build(kind, worker_id, config, **kwargs)


def start_workers(workers: list[WorkerBackend]) -> list[StartInfo]:
    """Start several workers at once (one thread each); on any failure close them all and raise."""
    if not workers:
        return []
    with ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="fluidpd-start") as pool:
        futures = [pool.submit(w.start) for w in workers]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        for w in workers:
            w.close()
        raise first
    return [f.result() for f in futures]
