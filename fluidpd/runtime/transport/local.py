"""The "local" KV transport: sender and receiver share one process, the handle carries the payload."""

from __future__ import annotations

from fluidpd.engine.kv_transfer import KVPayload
from fluidpd.runtime.transport.base import KVHandle, KVTransport, to_handle


class LocalTransport(KVTransport):
    """Same process: the handle carries the payload (no copy)."""

    name = "local"

    def send(self, payload: KVPayload) -> KVHandle:
        return to_handle(payload, self.name, payload=payload)

    def receive(self, handle: KVHandle) -> KVPayload:
        if handle.payload is None:
            raise ValueError(
                f"local KV handle of {handle.request_id!r} carries no payload "
                "(already released, or it crossed a process boundary)"
            )
        return handle.payload

    def release(self, handle: KVHandle) -> None:
        handle.payload = None
