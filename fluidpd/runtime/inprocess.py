"""InProcessWorker: the engine in this process; its calls run on one dedicated thread.

For fast tests and single-process serving. Several in-process workers can share one model
(`fluidpd.engine.model_loading.load_model` once, pass `model=` and `tokenizer=`). Arguments and results
are passed by reference (nothing is pickled): do not mutate a plan after submitting it.
KV moves between in-process workers with the "local" transport (the payload itself) by default.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from fluidpd.engine.config import EngineConfig
from fluidpd.runtime.futures import failed_future, resolve_future
from fluidpd.runtime.messages import METHODS, OUT_OF_BAND, StartInfo, WorkerClosedError
from fluidpd.runtime.transport.base import KVTransport

if TYPE_CHECKING:
    from fluidpd.runtime.worker_main import EngineService

_STOP = object()


class InProcessWorker:
    def __init__(
        self,
        worker_id: int,
        config: EngineConfig | None = None,
        *,
        model=None,
        tokenizer=None,
        transport: str | KVTransport = "local",
        warmup: bool = True,
        num_threads: int | None = None,
        close_timeout_s: float = 30.0,
    ) -> None:
        self.worker_id = worker_id
        self.config = config or EngineConfig()
        self._model, self._tokenizer = model, tokenizer
        self.transport, self.warmup, self.num_threads = transport, warmup, num_threads
        self.close_timeout_s = close_timeout_s
        self.service: EngineService | None = None
        self.info: StartInfo | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def engine(self):
        """The engine (in-process only: for tests and introspection; do not call it concurrently)."""
        return None if self.service is None else self.service.engine

    @property
    def pid(self) -> int | None:
        """The process the engine runs in (this one), once started."""
        return None if self.info is None else self.info.pid

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def start(self) -> StartInfo:
        with self._lock:
            if self._closed:
                raise WorkerClosedError(f"worker {self.worker_id} is closed")
            if self._thread is not None:
                raise RuntimeError(f"worker {self.worker_id} already started")
            self._thread = threading.Thread(target=self._loop, name=f"fluidpd-worker-{self.worker_id}", daemon=True)
            self._thread.start()
        t0 = time.perf_counter()
        f: Future = Future()
        self._queue.put((f, self._build, (), {}))
        try:
            self.info = f.result()
        except BaseException:
            self.close()
            raise
        self.info.total_s = time.perf_counter() - t0
        return self.info

    def _build(self) -> StartInfo:
        """On the worker's thread (torch's thread count is per thread: the workers of one process split its cores).
        The engine (and torch) is imported here, so that registering this backend loads neither."""
        import torch

        from fluidpd.runtime.worker_main import EngineService, build_engine, start_info

        t0 = time.perf_counter()
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        engine, times = build_engine(self.config, model=self._model, tokenizer=self._tokenizer, do_warmup=self.warmup)
        self.service = EngineService(self.worker_id, engine, self.transport)
        self._model = self._tokenizer = None
        return start_info(self.worker_id, engine, times, 0.0, time.perf_counter() - t0, self.service.transport.name)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        if method not in METHODS:
            return failed_future(AttributeError(f"worker has no method {method!r} (methods: {sorted(METHODS)})"))
        with self._lock:
            if self._closed or self._thread is None:
                state = "closed" if self._closed else "not started"
                return failed_future(WorkerClosedError(f"worker {self.worker_id} is {state}"))
            f: Future = Future()
            if method in OUT_OF_BAND:  # answered at once while the worker's thread lives
                if self._thread.is_alive() and self.service is not None:
                    resolve_future(f, value=self.service.call(method, args, kwargs))
                else:
                    resolve_future(f, error=WorkerClosedError(f"worker {self.worker_id} is not running"))
                return f
            self._queue.put((f, self._call, (method, args, kwargs), {}))
        return f

    def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return self.service.call(method, args, kwargs)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            f, fn, args, kwargs = item
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every error goes back on its future
                resolve_future(f, error=exc)
            else:
                resolve_future(f, value=value)
        self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                resolve_future(item[0], error=WorkerClosedError(f"worker {self.worker_id} closed before the call ran"))

    def close(self) -> None:
        """Stop after the calls already submitted; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.close_timeout_s)
        if thread is None or not thread.is_alive():
            self._fail_queued()
            self.service = None

    def __enter__(self) -> InProcessWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"InProcessWorker(worker_id={self.worker_id}, alive={self.alive})"
