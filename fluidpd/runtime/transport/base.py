"""Moving a request's KV between workers: the `KVHandle` and the abstract `KVTransport`.

The exporting worker turns the engine's `KVPayload` into a small picklable `KVHandle`
(`send`), the coordinator forwards the handle, and the importing worker turns it back into a
`KVPayload` (`receive`) and imports it; `release` frees whatever the handle holds. Exactly one
`release` per handle ends its life: the importer calls it after the import (success or not), the
coordinator calls it on the abort path (the handle will never be imported). It is idempotent.

A transport backend (one module each: `shm`, `local`; a multi-node one such as RDMA or TCP would
be another) subclasses `KVTransport` and fills the handle fields it needs.

Torch is imported only where a tensor is made (a worker's `receive`): the coordinator, which only
forwards and releases handles, runs without it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fluidpd.engine.kv_transfer import KVLayout, KVPayload

if TYPE_CHECKING:
    import torch


@dataclass
class KVHandle:
    """A KV payload in flight: where its blocks are, plus every other field of the KVPayload."""

    transport: str  # "shm" | "local" | another transport's name
    request_id: str
    token_ids: list[int]
    prompt_len: int
    num_computed: int
    layout: KVLayout
    params: Any  # fluidpd.engine.SamplingParams
    shape: tuple[int, ...]  # of the stacked blocks tensor
    dtype: str  # torch dtype name, e.g. "float32"
    nbytes: int
    name: str | None = None  # shm segment name (None when there are no blocks)
    offset: int = 0  # of the blocks in the segment
    generation: int = 0  # pooled segment: its generation for this handle (0: one-shot)
    generator_state: torch.Tensor | None = None
    logprobs: list | None = None
    num_preemptions: int = 0
    skip_blocks: int = 0  # leading blocks not sent: the destination's prefix cache holds them
    num_cached_tokens: int = 0
    group: Any = None  # fluidpd.engine.kv_transfer.GroupKV of an n > 1 request
    meta: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # seconds: "export_s" (engine), "send_s" (transport)
    payload: KVPayload | None = field(default=None, repr=False)  # LocalTransport only

    @property
    def num_blocks(self) -> int:
        return self.shape[0] if self.shape else 0

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


class KVTransport(abc.ABC):
    """One way of moving KV payloads between workers; one instance per process and kind."""

    name: str

    @abc.abstractmethod
    def send(self, payload: KVPayload) -> KVHandle:
        """Make `payload` available to another worker; the handle is small and picklable."""

    @abc.abstractmethod
    def receive(self, handle: KVHandle) -> KVPayload:
        """The payload behind `handle` (its blocks may view transport memory until `release`)."""

    @abc.abstractmethod
    def release(self, handle: KVHandle) -> None:
        """Free what `handle` holds; idempotent; safe to call whether or not it was received."""

    def close(self) -> None:  # noqa: B027 - an optional hook: a transport that keeps nothing inherits the no-op
        """Free what this process's transport keeps between transfers; idempotent."""


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r} in KV handle")
    return dt


def to_handle(p: KVPayload, transport: str, **kw: Any) -> KVHandle:
    """A handle with every field of `p` but its blocks (their shape and dtype only); `kw` adds
    the transport's own fields."""
    b = p.blocks
    return KVHandle(
        transport=transport,
        request_id=p.request_id,
        token_ids=list(p.token_ids),
        prompt_len=p.prompt_len,
        num_computed=p.num_computed,
        layout=p.layout,
        params=p.params,
        shape=tuple(b.shape),
        dtype=str(b.dtype).removeprefix("torch."),
        nbytes=p.nbytes,
        generator_state=p.generator_state,
        logprobs=p.logprobs,
        num_preemptions=p.num_preemptions,
        skip_blocks=p.skip_blocks,
        num_cached_tokens=p.num_cached_tokens,
        group=p.group,
        meta=dict(p.meta),
        **kw,
    )


def to_payload(handle: KVHandle, blocks: torch.Tensor) -> KVPayload:
    """The payload `handle` was made from, with `blocks` (as the transport received them)."""
    return KVPayload(
        request_id=handle.request_id,
        token_ids=list(handle.token_ids),
        prompt_len=handle.prompt_len,
        num_computed=handle.num_computed,
        blocks=blocks,
        layout=handle.layout,
        params=handle.params,
        generator_state=handle.generator_state,
        logprobs=handle.logprobs,
        num_preemptions=handle.num_preemptions,
        skip_blocks=handle.skip_blocks,
        num_cached_tokens=handle.num_cached_tokens,
        group=handle.group,
        meta=dict(handle.meta),
    )
