"""The links of a Ray placement as KV sees them, measured at start: which node each worker's bundle
is on, and how fast KV crosses between two nodes.

`measure_links` puts a probe actor (no CPU of its own) in a bundle on each of two nodes and moves
`nbytes` between them the way the "ray" transport moves KV (`ray.put` on one node, `ray.get` on
the other), median of `repeats`; with `collective=True` also through a `ray.util.collective` gloo
group (send/recv of the same bytes), the other path the issue weighed. Serving uses the object
store: a gloo group is one fixed world per process (torch.distributed), so a replaced worker could
not rejoin it; `benchmarks/runtime/ray_kv_transfer.py` prints both. `ray_placement` is what `fluidpd serve
--backend ray` starts with (its `--placement auto` reads the links); `cluster_links` is what
`fluidpd place --ray-address` measures.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from fluidpd.runtime.ray_worker import RayPlacement, bundle_nodes, connect_ray
from fluidpd.runtime.transport.ray import require_ray


@dataclass
class RayLinks:
    """Where a placement's bundles are (node index per bundle) and the measured cross-node KV
    bandwidth (bytes/s; None on one node), by path ("object_store", "gloo")."""

    nodes: list[int]
    bandwidth: dict[str, float] = field(default_factory=dict)
    nbytes: int = 0

    @property
    def inter_node_bw(self) -> float | None:
        """The bandwidth of the path serving uses between nodes (the object store)."""
        return self.bandwidth.get("object_store")

    def describe(self) -> str:
        if self.inter_node_bw is None:
            return "one node: KV over shared memory"
        paths = ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in self.bandwidth.items())
        return f"{len(set(self.nodes))} nodes; KV across nodes measured ({self.nbytes >> 20} MiB): {paths}"


@functools.cache
def _probe_class():
    ray = require_ray()

    @ray.remote(num_cpus=0)
    class LinkProbe:
        """Moves bytes to and from its node for `measure_links`."""

        def put(self, nbytes: int) -> tuple[list, float]:
            import numpy as np

            a = np.ones(nbytes, dtype=np.uint8)
            t0 = time.perf_counter()
            ref = ray.put(a)
            return [ref], time.perf_counter() - t0  # in a list: the caller gets the reference, not the bytes

        def get(self, refs: list) -> float:
            t0 = time.perf_counter()
            ray.get(refs[0])
            return time.perf_counter() - t0

        def join(self, world: int, rank: int, group: str) -> None:
            from ray.util import collective

            collective.init_collective_group(world, rank, backend="gloo", group_name=group)

        def send(self, nbytes: int, dst: int, group: str) -> float:
            import torch
            from ray.util import collective

            t = torch.ones(nbytes, dtype=torch.uint8)
            t0 = time.perf_counter()
            collective.send(t, dst, group_name=group)
            return time.perf_counter() - t0

        def recv(self, nbytes: int, src: int, group: str) -> float:
            import torch
            from ray.util import collective

            t = torch.empty(nbytes, dtype=torch.uint8)
            t0 = time.perf_counter()
            collective.recv(t, src, group_name=group)
            return time.perf_counter() - t0

    return LinkProbe


def measure_links(group: Any, nbytes: int = 32 << 20, repeats: int = 3, collective: bool = False) -> RayLinks:
    """The links of placement group `group` (see the module docstring)."""
    ray = require_ray()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = bundle_nodes(group)
    links = RayLinks(nodes, nbytes=nbytes)
    if len(set(nodes)) < 2:
        return links
    a, b = nodes.index(0), nodes.index(1)

    def probe(bundle: int):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle)
        return _probe_class().options(scheduling_strategy=strategy).remote()

    src, dst = probe(a), probe(b)
    try:
        ts = []
        for _ in range(repeats + 1):  # the first is a warm-up (actor start, store pages)
            refs, put_s = ray.get(src.put.remote(nbytes))
            ts.append(put_s + ray.get(dst.get.remote(refs)))
            del refs
        links.bandwidth["object_store"] = nbytes / statistics.median(ts[1:])
        if collective:
            group_name = f"fluidpd-links-{time.monotonic_ns()}"
            ray.get([src.join.remote(2, 0, group_name), dst.join.remote(2, 1, group_name)])
            ts = []
            for _ in range(repeats + 1):
                sent, got = ray.get([src.send.remote(nbytes, 1, group_name), dst.recv.remote(nbytes, 0, group_name)])
                ts.append(max(sent, got))
            links.bandwidth["gloo"] = nbytes / statistics.median(ts[1:])
    finally:
        for p in (src, dst):
            ray.kill(p, no_restart=True)
    return links


def cluster_links(address: str, collective: bool = False) -> RayLinks:
    """The link between two nodes of the Ray cluster at `address` (a bundle reserved on each for the
    measurement, then given back); ValueError on a one-node cluster."""
    ray = connect_ray(address)
    if len([n for n in ray.nodes() if n["Alive"]]) < 2:
        raise ValueError(f"the Ray cluster at {address or 'a new local instance'} has one node: no link to measure")
    placement = RayPlacement.create(2, strategy="STRICT_SPREAD")
    try:
        links = measure_links(placement.group, collective=collective)
    finally:
        placement.remove()
    return links


def ray_placement(runtime, gpus: bool = False, log=None) -> tuple[RayPlacement, RayLinks]:
    """Join (or start) the Ray cluster of `runtime.address`, reserve a bundle per worker (SPREAD)
    and measure the link between the bundles' nodes: the placement and its RayLinks."""
    ray = connect_ray(runtime.address, num_cpus=runtime.workers)
    placement = RayPlacement.create(runtime.workers, gpus=gpus)
    try:
        links = measure_links(placement.group)
    except BaseException:
        placement.remove()
        raise
    if log:
        log(f"Ray cluster of {ray.cluster_resources().get('CPU', 0):g} CPUs, workers on {links.describe()}")
    return placement, links
