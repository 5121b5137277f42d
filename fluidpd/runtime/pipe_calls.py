"""Calls to a worker process over its pipe: pickled, written in submission order, answered through futures."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from fluidpd.runtime.futures import failed_future, resolve_future
from fluidpd.runtime.messages import METHODS, Call, Reply, WorkerClosedError, WorkerDiedError, decode, encode

STOP = object()  # ends the sender thread
DIRECT_BYTES = 4096  # a call this small is written to the pipe by `submit` itself when none is queued


class PipeCalls:
    """Mixin of ProcessWorker: `submit`, the sender and reader threads' loops, and failing the calls
    pending once the child is gone (on ProcessWorker's pipe, locks, queue and pending futures)."""

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
            if data is STOP or not self._send(data):
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
        self._outbox.put(STOP)

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
