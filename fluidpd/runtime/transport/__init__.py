"""KV transports by name, and this process's instance of each (see `base` for the handle's life)."""

from __future__ import annotations

import threading
from typing import Any

from fluidpd.core.registry import Registry
from fluidpd.runtime.transport.base import KVHandle, KVTransport
from fluidpd.runtime.transport.local import LocalTransport
from fluidpd.runtime.transport.ray import RayObjectTransport
from fluidpd.runtime.transport.shm import SharedMemoryTransport

TRANSPORTS: Registry[type[KVTransport]] = Registry("KV transport")
TRANSPORTS.add("shm", SharedMemoryTransport)
TRANSPORTS.add("local", LocalTransport)
TRANSPORTS.add("ray", RayObjectTransport)

_instances: dict[str, KVTransport] = {}
_lock = threading.Lock()


def get_transport(name: str) -> KVTransport:
    """This process's transport of that kind (one instance per process and kind)."""
    with _lock:
        t = _instances.get(name)
        if t is None:
            t = _instances[name] = TRANSPORTS.build(name)
        return t


def configure_transport(name: str, **kwargs: Any) -> KVTransport:
    """Replace this process's transport of that kind by one built with `kwargs` (the old one is
    closed), e.g. configure_transport("shm", pool_bytes=512 << 20)."""
    t = TRANSPORTS.build(name, **kwargs)
    with _lock:
        old, _instances[name] = _instances.get(name), t
    if old is not None:
        old.close()
    return t


def release(handle: KVHandle) -> None:
    """Free a handle that will not be imported (the coordinator's abort path); idempotent."""
    get_transport(handle.transport).release(handle)
