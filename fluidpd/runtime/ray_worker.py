"""RayWorker: one worker as a Ray actor (`fluidpd serve --backend ray`), for more than one machine.

The actor holds an EngineService (weights load in the actor's process, on its node). Control calls
are calls of the actor's `call` method, which runs in the actor's default concurrency group (one
thread: calls from the coordinator run strictly in submission order, as with the other backends);
heartbeats run in their own group, so a worker busy in a long step still answers. Each worker is
pinned to one bundle of a placement group (`RayPlacement`: one bundle per worker, spread over the
nodes). KV between workers on different nodes moves through the "ray" transport (the object
store); workers on one node keep the shared-memory one. An actor that dies (its process or its
node) fails its pending and later futures with WorkerDiedError, as a dead worker process does.
Ray is an optional dependency (`pip install 'fluidpd[ray]'`); nothing imports it until used.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fluidpd.engine.config import EngineConfig
from fluidpd.runtime.futures import failed_future, resolve_future
from fluidpd.runtime.messages import (
    METHODS,
    OUT_OF_BAND,
    StartInfo,
    WorkerClosedError,
    WorkerDiedError,
    WorkerStartError,
    portable_error,
)
from fluidpd.runtime.transport.ray import require_ray
from fluidpd.runtime.worker_env import worker_environ


@functools.cache
def _actor_class():
    ray = require_ray()

    @ray.remote(concurrency_groups={"control": 1})
    class EngineActor:
        """An EngineService in a Ray actor."""

        def __init__(self, worker_id: int, config: EngineConfig, options: dict) -> None:
            import torch

            from fluidpd.core.cpu import worker_threads
            from fluidpd.runtime.worker_main import EngineService, build_engine, start_info

            here, threads = int(options.get("workers_here", 1)), int(options.get("num_threads", 1))
            torch.set_num_threads(worker_threads(here, threads))
            t0 = time.perf_counter()
            self.error: BaseException | None = None
            try:
                engine, times = build_engine(config, do_warmup=options.get("warmup", True))
                self.service = EngineService(worker_id, engine, options.get("transport", "shm"))
                total = time.perf_counter() - t0
                self.info = start_info(worker_id, engine, times, 0.0, total, self.service.transport.name)
            except Exception as exc:  # noqa: BLE001 - reported by started()
                self.error = portable_error(exc, f"worker {worker_id} start")

        def started(self) -> tuple[bool, Any, str]:
            node = ray.get_runtime_context().get_node_id()
            return (False, self.error, node) if self.error is not None else (True, self.info, node)

        def call(self, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
            try:
                return True, self.service.call(method, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - every error goes back on its future
                return False, portable_error(exc, f"worker {self.service.worker_id}")

        @ray.method(concurrency_group="control")
        def heartbeat(self) -> dict:
            return self.service.heartbeat()

        def close(self) -> None:
            self.service.transport.close()

    return EngineActor


def bundle_nodes(group: Any) -> list[int]:
    """The node of each bundle of a placement group, as indices in order of first appearance."""
    ray = require_ray()
    table = ray.util.placement_group_table(group)["bundles_to_node_id"]
    ids: dict[str, int] = {}
    return [ids.setdefault(table[i], len(ids)) for i in sorted(table)]


@dataclass
class RayPlacement:
    """Where workers go: a placement group with one bundle per worker, spread over the nodes."""

    group: Any  # ray.util.placement_group.PlacementGroup
    bundle: dict  # resources of one bundle, e.g. {"CPU": 1}

    @classmethod
    def create(
        cls, workers: int, gpus: bool = False, timeout_s: float = 120.0, strategy: str = "SPREAD"
    ) -> RayPlacement:
        """`strategy`: Ray's; STRICT_SPREAD puts every bundle on a node of its own."""
        ray = require_ray()
        from ray.util.placement_group import placement_group

        bundle = {"CPU": 1, "GPU": 1} if gpus else {"CPU": 1}
        group = placement_group([dict(bundle) for _ in range(workers)], strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            raise WorkerStartError(
                f"the Ray cluster has no room for {workers} workers of {bundle} within {timeout_s:g} s "
                f"(cluster resources: {ray.cluster_resources()})"
            )
        return cls(group, bundle)

    def remove(self) -> None:
        """Give the bundles back to the cluster (after the workers are closed)."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


class RayWorker:
    """A worker whose engine runs in a Ray actor in bundle `worker_id` of `placement`."""

    def __init__(
        self,
        worker_id: int,
        config: EngineConfig | None = None,
        *,
        placement: RayPlacement | None = None,
        transport: str = "shm",
        warmup: bool = True,
        num_threads: int = 1,
        start_timeout_s: float = 600.0,
    ) -> None:
        """`num_threads` 0: the actor's node's usable cores split between the placement's workers there."""
        self.worker_id = worker_id
        self.config = config or EngineConfig()
        self.placement = placement
        self.options = {"transport": transport, "warmup": warmup, "num_threads": num_threads}
        self.start_timeout_s = start_timeout_s
        self.info: StartInfo | None = None
        self.node_id: str | None = None
        self._actor: Any = None
        self._dead: str | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return None if self.info is None else self.info.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self._actor is not None and not self._closed

    def start(self) -> StartInfo:
        ray = require_ray()
        with self._lock:
            if self._closed:
                raise WorkerClosedError(f"worker {self.worker_id} is closed")
            if self._actor is not None:
                raise RuntimeError(f"worker {self.worker_id} already started")
            opts: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0}
            env = worker_environ(self.config)
            if env:  # the actor's process starts with it, as a process worker's does
                opts["runtime_env"] = {"env_vars": env}
            if self.placement is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                bundles = self.placement.group.bundle_count
                nodes = bundle_nodes(self.placement.group)
                self.options["workers_here"] = nodes.count(nodes[self.worker_id % bundles])
                opts["num_gpus"] = self.placement.bundle.get("GPU", 0)
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=self.placement.group, placement_group_bundle_index=self.worker_id % bundles
                )
            t0 = time.perf_counter()
            self._actor = _actor_class().options(**opts).remote(self.worker_id, self.config, self.options)
        try:
            ok, value, node = ray.get(self._actor.started.remote(), timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the actor died, or the timeout
            self.close()
            raise WorkerStartError(f"worker {self.worker_id} failed to start: {type(exc).__name__}: {exc}") from exc
        if not ok:
            self.close()
            raise WorkerStartError(
                f"worker {self.worker_id} failed to start: {type(value).__name__}: {value}"
            ) from value
        self.info, self.node_id = value, node
        self.info.total_s = time.perf_counter() - t0
        return self.info

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        if method not in METHODS:
            return failed_future(AttributeError(f"worker has no method {method!r} (methods: {sorted(METHODS)})"))
        with self._lock:
            if self._dead is not None:
                return failed_future(WorkerDiedError(self._dead))
            if self._closed or self._actor is None:
                state = "closed" if self._closed else "not started"
                return failed_future(WorkerClosedError(f"worker {self.worker_id} is {state}"))
            if method in OUT_OF_BAND:
                ref = self._actor.heartbeat.remote()
            else:
                ref = self._actor.call.remote(method, args, kwargs)
        out: Future = Future()
        oob = method in OUT_OF_BAND
        ref.future().add_done_callback(lambda f: self._resolve(out, f, oob))
        return out

    def _resolve(self, out: Future, f: Future, oob: bool) -> None:
        exc = f.exception()
        if exc is not None:
            ray = require_ray()
            if isinstance(exc, ray.exceptions.RayActorError):
                self._dead = self._dead or f"worker {self.worker_id}'s actor died: {exc}"
                resolve_future(out, error=WorkerDiedError(self._dead))
            else:
                resolve_future(out, error=exc)
            return
        if oob:
            resolve_future(out, f.result())
            return
        ok, value = f.result()
        resolve_future(out, value if ok else None, None if ok else value)

    def kill(self) -> None:
        """Kill the actor at once (a hung worker)."""
        actor = self._actor
        if actor is not None:
            require_ray().kill(actor, no_restart=True)
            self._dead = self._dead or f"worker {self.worker_id} was killed"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actor, self._actor = self._actor, None
        if actor is None:
            return
        ray = require_ray()
        if self._dead is None:
            try:  # after the calls already sent: free its pooled KV segments
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - it is going away either way
                pass
        ray.kill(actor, no_restart=True)

    def __repr__(self) -> str:
        return f"RayWorker(id={self.worker_id}, node={self.node_id}, alive={self.alive})"


def connect_ray(address: str = "", num_cpus: int | None = None):
    """Join the Ray cluster at `address` ("auto", HOST:PORT), or start a single-node one here
    (dashboard off, object store capped; Ray itself keeps its temporary files under $RAY_TMPDIR
    when set)."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    quiet = {"log_to_driver": False, "configure_logging": False}
    if address:
        ray.init(address=address, **quiet)
    else:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=256 << 20,
            **quiet,
        )
    return ray
