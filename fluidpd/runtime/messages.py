"""What a coordinator and its workers say to each other (the process backend pickles these).

Control messages travel over a multiprocessing Pipe as plain pickles (`encode` / `decode`,
never the torch-aware ForkingPickler: a tensor in a message is copied by value, it never turns
into a shared-memory file descriptor). KV bytes do not travel here: they go through a
`fluidpd.runtime.transport.base.KVTransport`, and only the small `KVHandle` rides in a message.

Errors: an exception raised inside the engine is sent back as itself (same type, same message,
the worker's traceback attached as a note) when it pickles; otherwise as a `RemoteError` naming
the original type. A worker that dies fails its calls with `WorkerDiedError`; a closed worker
fails them with `WorkerClosedError` (both RuntimeErrors).
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any

# the methods a worker executes on its engine (see fluidpd.runtime.worker_main.EngineService)
METHODS = frozenset(
    {
        "add_request",
        "run_step",
        "abort",
        "export_kv",
        "import_kv",
        "resize_kv",
        "stats",
        "ping",
        "heartbeat",
        "profile",
        "decode_probe",
    }
)
# answered at once, beside the call in progress (they touch no engine state): a busy worker
# still answers them, a frozen one does not
OUT_OF_BAND = frozenset({"heartbeat"})


class WorkerError(RuntimeError):
    """Base of the runtime's own worker failures."""


class WorkerDiedError(WorkerError):
    """The worker process exited (crashed, was killed) with calls pending or after it."""


class WorkerClosedError(WorkerError):
    """The worker was closed (or never started) before the call could run."""


class WorkerStartError(WorkerError):
    """The worker could not build its engine; the message carries the worker's error."""


class RemoteError(RuntimeError):
    """An engine exception that could not be pickled back: its type name, message and traceback."""

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.remote_traceback = type_name, message, remote_traceback

    def __reduce__(self):
        return (RemoteError, (self.type_name, self.message, self.remote_traceback))


@dataclass(slots=True)
class Call:
    """Run `method(*args, **kwargs)` on the worker's engine service; answered by one Reply."""

    call_id: int
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(slots=True)
class Reply:
    call_id: int
    ok: bool
    value: Any = None  # the method's return value when ok
    error: BaseException | None = None  # the exception (or a RemoteError) when not ok


@dataclass(slots=True)
class Shutdown:
    """Ask the worker to stop after the calls already sent (they are answered first)."""


@dataclass
class StartInfo:
    """How a worker came up, and its engine's shape. Times in seconds.

    process_start_s: spawn until the worker's entry point ran (interpreter + imports; 0 in process);
    weight_load_s: weights (and tokenizer) into memory; engine_build_s: arena, scheduler, runner;
    warmup_s: one prefill + one decode step of a throwaway request; total_s: `start()` wall time
    as the caller saw it (spawn through the worker's ready message)."""

    worker_id: int
    pid: int
    process_start_s: float
    weight_load_s: float
    engine_build_s: float
    warmup_s: float
    total_s: float
    stats: Any  # fluidpd.engine.outputs.EngineStats
    max_model_len: int
    kv_layout: Any  # fluidpd.engine.kv_transfer.KVLayout
    vocab_size: int = 0
    model: str = ""
    load_format: str = ""
    device: str = "cpu"
    transport: str = ""
    threads: int = 0  # torch threads its engine runs
    quantization: str = ""  # the model's weight format (fluidpd.engine.model.LlamaModel.quantization)
    attention: str = ""  # its decode attention (paged, gather)
    omp_wait_policy: str = ""  # OMP_WAIT_POLICY in the worker's environment ("": unset; fluidpd.runtime.worker_env)


@dataclass(slots=True)
class Started:
    info: StartInfo


@dataclass(slots=True)
class StartFailed:
    error: BaseException


def encode(msg: Any) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)


def portable_error(exc: BaseException, where: str = "worker") -> BaseException:
    """`exc` itself if it survives a pickle round trip (same type and message), else a RemoteError.

    The worker-side traceback is attached as a note (shown by the traceback printer)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        exc.add_note(f"[raised in {where}]\n{tb.rstrip()}")
        back = pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # noqa: BLE001 - anything that does not pickle cleanly
        pass
    return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb)
