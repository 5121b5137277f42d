"""ProcessWorker: one spawned process per worker; control over a Pipe, KV over shared memory.

The child (`fluidpd.runtime.worker_main.run_worker`) builds its engine from the EngineConfig
(weights are loaded in the child), running `num_threads` torch threads (the serving runtime passes
`RuntimeConfig.worker_threads`: the machine's usable cores split between its workers).
In the parent, `submit` pickles the call and queues it; one sender thread writes the pipe (so
`submit` never blocks on a busy child) and one reader thread resolves the futures. Calls run in
submission order. If the child dies, every pending future and every later one fails with
`WorkerDiedError`.

`stage_weights` writes a model's dequantised weights to a safetensors directory (e.g. under
/dev/shm) once, so that later worker processes start from it instead of parsing the GGUF again
(the "warm restart" of the seed's Table 2).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from fluidpd.engine.config import EngineConfig
from fluidpd.runtime.futures import failed_future, resolve_future
from fluidpd.runtime.messages import (
    METHODS,
    Call,
    Reply,
    Shutdown,
    Started,
    StartFailed,
    StartInfo,
    WorkerClosedError,
    WorkerDiedError,
    WorkerStartError,
    decode,
    encode,
)
from fluidpd.runtime.transport.shm import unlink_segments_of
from fluidpd.runtime.worker_main import run_worker

_STOP = object()
DIRECT_BYTES = 4096  # a call this small is written to the pipe by `submit` itself when none is queued


_ENV_LOCK = threading.Lock()


@contextmanager
def child_environ(config: EngineConfig):
    """The environment a spawned worker starts with: a gguf worker's OpenMP threads sleep between regions.

    The gguf kernel runs its own thread pool; OpenMP's default spin-wait keeps torch's threads on the
    cores it needs (2 threads on 2 cores, batch-1 step 13.0 ms spinning vs 8.9 ms passive, where the
    fp16 format, all OpenMP, runs 8.9 vs 15.6 ms: `engine_bandwidth.py`). A value the user set wins.
    """
    extra = {"OMP_WAIT_POLICY": "PASSIVE"} if config.gguf_blocks else {}
    extra = {k: v for k, v in extra.items() if k not in os.environ}
    with _ENV_LOCK:
        os.environ.update(extra)
        try:
            yield
        finally:
            for k in extra:
                os.environ.pop(k, None)


class ProcessWorker:
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
                target=run_worker,
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

    # ------------------------------------------------------------------ calls
    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        if method not in METHODS:
            return failed_future(AttributeError(f"worker has no method {method!r} (methods: {sorted(METHODS)})"))
        with self._lock:
            if self._dead is not None:
                return failed_future(WorkerDiedError(str(self._dead)))
            if self._closed or self._sender is None:
                state = "closed" if self._closed else "not started"
                return failed_future(WorkerClosedError(f"worker {self.worker_id} is {state}"))
            call_id = next(self._ids)
            try:
                data = encode(Call(call_id, method, args, kwargs))
            except Exception as exc:  # noqa: BLE001 - an argument that does not pickle
                return failed_future(exc)
            f: Future = Future()
            self._pending[call_id] = f
            self._queued += 1
            # a small call with nothing ahead of it is written by this thread (every step's plan:
            # no hop to the sender thread); the pipe is taken before _lock is let go, so a call
            # submitted meanwhile waits behind it. Big calls (prompts, KV) and later ones are queued.
            direct = self._queued == 1 and len(data) <= DIRECT_BYTES
            if direct:
                self._send_lock.acquire()
            else:
                self._outbox.put(data)
        if direct:
            self._send(data, direct=True)
        return f

    def _send(self, data: bytes, direct: bool = False) -> bool:
        """Write one call to the pipe (in order: under _send_lock, which `direct` callers hold
        already); False once the pipe is gone (the reader thread, seeing it too, fails the calls)."""
        if not direct:
            self._send_lock.acquire()
        try:
            self._conn.send_bytes(data)
            ok = True
        except (OSError, EOFError, ValueError):
            ok = False
        finally:
            self._send_lock.release()
        with self._lock:
            self._queued -= 1
        if not ok and not direct:  # (a submitting thread, maybe the event loop's, never waits on the child)
            self._mark_dead()
        return ok

    def _send_loop(self) -> None:
        while True:
            data = self._outbox.get()
            if data is _STOP or not self._send(data):
                return

    def _read_loop(self) -> None:
        while True:
            try:
                msg = decode(self._conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                break
            except Exception as exc:  # noqa: BLE001 - a reply that does not unpickle here
                msg = None
                err = exc
            if isinstance(msg, Reply):
                with self._lock:
                    f = self._pending.pop(msg.call_id, None)
                if f is not None:
                    if msg.ok:
                        resolve_future(f, value=msg.value)
                    else:
                        resolve_future(f, error=msg.error)
            elif msg is None:
                self._fail_pending(RuntimeError(f"worker {self.worker_id}: undecodable reply: {err}"), one=True)
        self._mark_dead()

    def _mark_dead(self) -> None:
        """The pipe is gone: fail what is pending (and, unless closed on purpose, all later calls)."""
        self._join(1.0)  # so the exit code is known
        with self._lock:
            if self._closed:
                err: BaseException = WorkerClosedError(f"worker {self.worker_id} closed before the call returned")
            else:
                if self._dead is None:
                    self._dead = self._died_error()
                err = self._dead
        self._fail_pending(err)
        self._outbox.put(_STOP)

    def _died_error(self) -> WorkerDiedError:
        code = None if self.process is None else self.process.exitcode
        how = (
            "exit code unknown" if code is None else (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        )
        return WorkerDiedError(f"worker {self.worker_id} (pid {self.pid}) died ({how}); its calls cannot complete")

    def _fail_pending(self, exc: BaseException, one: bool = False) -> None:
        with self._lock:
            if one:
                items = [self._pending.pop(min(self._pending))] if self._pending else []
            else:
                items, self._pending = list(self._pending.values()), {}
        for f in items:
            resolve_future(f, error=exc)

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
        self._outbox.put(_STOP)
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


# ---------------------------------------------------------------------- warm-start weights


def stage_weights(config: EngineConfig, path: str, checkpoint=None) -> EngineConfig:
    """Write `config`'s model as a Hugging Face style directory at `path` (config.json,
    model.safetensors with the dequantised tensors in the engine's dtype, and the tokenizer as
    tokenizer.json + tokenizer_config.json); the EngineConfig that loads from there.

    Pass an already loaded `checkpoint` (fluidpd.engine.loaders.Checkpoint) to skip loading.
    Building the GGUF tokenizer alone takes seconds, so it is staged too (same encodings)."""
    from safetensors.torch import save_file

    from fluidpd.engine.loaders import load_checkpoint

    ckpt = checkpoint or load_checkpoint(
        config.model, config.load_format, config.torch_dtype, config.seed, config.model_overrides
    )
    if ckpt.rope_freqs is not None:
        raise ValueError("stage_weights: checkpoints with a rope_freqs tensor (llama3 GGUF) are not supported")
    os.makedirs(path, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in ckpt.tensors.items()}
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(ckpt.config.to_hf(), f)
    tokenizer = config.tokenizer
    if tokenizer is None:
        if ckpt.tokenizer is not None:
            _save_tokenizer(ckpt.tokenizer, path)  # found by the safetensors loader
        elif ckpt.tokenizer_source:
            tokenizer = ckpt.tokenizer_source
    return replace(config, model=path, load_format="safetensors", tokenizer=tokenizer)


def _save_tokenizer(tok, path: str) -> None:
    """tokenizer.json (+ config) that `Tokenizer.from_pretrained_dir` reads back identically."""
    tk = tok.tk
    bos = tok.token_str(tok.bos_token_id) if tok.bos_token_id is not None else None
    if tok.add_bos and bos is not None:  # the pretrained-dir reader relies on the post-processor
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import processors

        tk = HFTokenizer.from_str(tk.to_str())
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_token_id)]
        )
    tk.save(os.path.join(path, "tokenizer.json"))
    cfg = {
        "bos_token": bos,
        "chat_template": tok.chat_template,
        "eos_token": tok.token_str(tok.eos_token_ids[0]) if tok.eos_token_ids else None,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
