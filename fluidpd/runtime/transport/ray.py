"""The "ray" KV transport: the blocks go into the Ray object store of the exporting worker's node,
the handle carries the object's reference, the importing worker (on any node) fetches them.

Used between workers on different nodes of a Ray cluster (`--backend ray`); the object belongs to
the exporter, so a handle whose exporter died cannot be imported (the hand-off fails visibly and
the request starts over). `release` drops the reference and frees the object.
"""

from __future__ import annotations

import time
import warnings

from fluidpd.engine.kv_transfer import KVPayload
from fluidpd.runtime.transport.base import KVHandle, KVTransport, to_handle, to_payload


def require_ray():
    """The `ray` module, or a clear error when it is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the ray backend needs Ray: pip install 'fluidpd[ray]'") from exc
    return ray


class RayObjectTransport(KVTransport):
    """KV blocks through the Ray object store."""

    name = "ray"

    def send(self, payload: KVPayload) -> KVHandle:
        ray = require_ray()
        t0 = time.perf_counter()
        handle = to_handle(payload, self.name)
        handle.meta["ray_ref"] = ray.put(payload.blocks.contiguous().numpy())
        handle.timings["send_s"] = time.perf_counter() - t0
        return handle

    def receive(self, handle: KVHandle) -> KVPayload:
        arr = require_ray().get(handle.meta["ray_ref"], timeout=60)
        with warnings.catch_warnings():  # a read-only view of the object store: the import only reads it
            warnings.simplefilter("ignore", UserWarning)
            import torch

            payload = to_payload(handle, torch.from_numpy(arr))
        del payload.meta["ray_ref"]
        return payload

    def release(self, handle: KVHandle) -> None:
        ref = handle.meta.pop("ray_ref", None)
        if ref is not None:
            try:
                from ray._private.internal_api import free

                free([ref])
            except Exception:  # noqa: BLE001 - freed with its last reference anyway
                pass
