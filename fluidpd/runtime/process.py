"""ProcessWorker: one spawned process per worker; control over a Pipe, KV over shared memory.

The child (`fluidpd.runtime.worker_main.run_worker`, reached through `worker_entry` so that this
module, and the server importing it, never load torch) builds its engine from the EngineConfig
(weights are loaded in the child), running `num_threads` torch threads (the serving runtime passes
`RuntimeConfig.worker_threads`: the machine's usable cores split between its workers).
In the parent (`fluidpd.runtime.pipe_calls`), `submit` pickles the call and queues it; one sender
thread writes the pipe (so `submit` never blocks on a busy child) and one reader thread resolves
the futures. Calls run in submission order. If the child dies, every pending future and every
later one fails with `WorkerDiedError`.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from fluidpd.engine.config import EngineConfig
from fluidpd.runtime.messages import (
    Shutdown,
    Started,
    StartFailed,
    StartInfo,
    WorkerClosedError,
    WorkerStartError,
    decode,
    encode,
)
from fluidpd.runtime.pipe_calls import STOP, PipeCalls
from fluidpd.runtime.transport.shm_segment import unlink_segments_of
from fluidpd.runtime.worker_env import worker_environ

_ENV_LOCK = threading.Lock()


def worker_entry(conn, worker_id: int, config: EngineConfig, options: dict) -> None:
    """The spawned child's target: imports the engine (torch) there, then runs `run_worker`."""
    from fluidpd.runtime.worker_main import run_worker

    run_worker(conn, worker_id, config, options)


@contextmanager
def child_environ(config: EngineConfig):
    """The environment a spawned worker starts with (`worker_environ`)."""
    extra = worker_environ(config)
    with _ENV_LOCK:
        os.environ.update(extra)
        try:
            yield
        finally:
            for k in extra:
                os.environ.pop(k, None)


class ProcessWorker(PipeCalls):
    def __init__(
        self,
        worker_id: int,
        config: EngineConfig | None = None,
        *,
        transport: str = "shm",
        kv_pool_bytes: int = 0,
        warmup: bool = True,
        num_threads: int = 1,
        start_timeout_s: float = 600.0,
        close_timeout_s: float = 30.0,
    ) -> None:
        """`kv_pool_bytes` > 0: this worker exports KV through a pool of reused shared-memory
        segments of at most that many bytes (see SharedMemoryTransport); 0: a fresh segment each."""
        self.worker_id = worker_id
        self.config = config or EngineConfig()
        self.options = {
            "transport": transport,
            "kv_pool_bytes": kv_pool_bytes,
            "warmup": warmup,
            "num_threads": num_threads,
        }
        self.start_timeout_s, self.close_timeout_s = start_timeout_s, close_timeout_s
        self.info: StartInfo | None = None
        self.process: mp.process.BaseProcess | None = None
        self._conn = None
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._outbox: queue.Queue = queue.Queue()
        self._queued = 0  # calls queued or being written, by either thread (under _lock)
        self._send_lock = threading.Lock()  # held while a call is written to the pipe
        self._sender: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._dead: BaseException | None = None  # set once: why calls now fail
        self._closed = False
        # one thread at a time waits on the child: of two concurrent waitpid calls the loser gets
        # ECHILD and multiprocessing reports a reaped child alive (close() would then skip its unlink)
        self._reap = threading.Lock()

    # ------------------------------------------------------------------ state
    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self._is_alive()

    def _is_alive(self) -> bool:
        with self._reap:
            return self.process is not None and self.process.is_alive()

    def _join(self, timeout: float) -> None:
        """Wait up to `timeout` for the child to exit, holding the reap lock for 50 ms at a time."""
        deadline = time.monotonic() + timeout
        while self._is_alive() and (left := deadline - time.monotonic()) > 0:
            with self._reap:
                self.process.join(min(left, 0.05))

    # ------------------------------------------------------------------ start
    def start(self) -> StartInfo:
        with self._lock:
            if self._closed:
                raise WorkerClosedError(f"worker {self.worker_id} is closed")
            if self.process is not None:
                raise RuntimeError(f"worker {self.worker_id} already started")
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe(duplex=True)
            t0 = time.perf_counter()
            opts = dict(self.options, spawn_time=time.time())
            self.process = ctx.Process(
                target=worker_entry,
                args=(child, self.worker_id, self.config, opts),
                name=f"fluidpd-worker-{self.worker_id}",
                daemon=True,
            )
            with child_environ(self.config):
                self.process.start()
            child.close()
            self._conn = parent
        try:
            msg = self._await_start(t0)
        except BaseException:
            self.close()
            raise
        if isinstance(msg, StartFailed):
            self.close()
            err = msg.error
            raise WorkerStartError(f"worker {self.worker_id} failed to start: {type(err).__name__}: {err}") from err
        if not isinstance(msg, Started):
            self.close()
            raise WorkerStartError(f"worker {self.worker_id} sent {type(msg).__name__} instead of its start report")
        self.info = msg.info
        self.info.total_s = time.perf_counter() - t0
        self._sender = threading.Thread(target=self._send_loop, name=f"fluidpd-w{self.worker_id}-send", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"fluidpd-w{self.worker_id}-read", daemon=True)
        self._sender.start()
        self._reader.start()
        return self.info

    def _await_start(self, t0: float):
        while True:
            if self._conn.poll(0.05):
                try:
                    return decode(self._conn.recv_bytes())
                except (EOFError, OSError):
                    pass
                self._join(1.0)
                raise WorkerStartError(
                    f"worker {self.worker_id} exited while starting (exitcode {self.process.exitcode})"
                )
            if not self._is_alive():
                if self._conn.poll(0):
                    continue
                raise WorkerStartError(
                    f"worker {self.worker_id} exited while starting (exitcode {self.process.exitcode})"
                )
            if time.perf_counter() - t0 > self.start_timeout_s:
                raise WorkerStartError(f"worker {self.worker_id} did not start within {self.start_timeout_s:g} s")

    def kill(self) -> None:
        """SIGKILL the child (a hung worker): its pending and later calls fail with WorkerDiedError."""
        if self._is_alive():
            self.process.kill()

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Shutdown message, join; terminate (then kill) on timeout. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = self.process is not None and self._dead is None
        if running and self._sender is not None:
            with self._lock:
                self._queued += 1
            self._outbox.put(encode(Shutdown()))
        self._outbox.put(STOP)
        proc = self.process
        if proc is not None:
            if running and self._sender is None and self._conn is not None:
                try:  # closing during start: no sender thread yet
                    self._conn.send_bytes(encode(Shutdown()))
                except (OSError, EOFError, ValueError):
                    pass
            self._join(self.close_timeout_s if running else 1.0)
            if self._is_alive():
                proc.terminate()
                self._join(5.0)
            if self._is_alive():
                proc.kill()
                self._join(5.0)
            if not self._is_alive() and proc.pid is not None:  # a killed worker cannot unlink its own
                unlink_segments_of(proc.pid)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5.0)
        if self._sender is not None and self._sender is not threading.current_thread():
            self._sender.join(5.0)
        if self._conn is not None:
            self._conn.close()
        self._fail_pending(WorkerClosedError(f"worker {self.worker_id} closed before the call returned"))

    def __enter__(self) -> ProcessWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ProcessWorker(worker_id={self.worker_id}, pid={self.pid}, alive={self.alive})"
