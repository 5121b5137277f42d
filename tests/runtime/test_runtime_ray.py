"""`--backend ray` on a local two-node Ray cluster (`ray.cluster_utils.Cluster`): the coordinator and
its policies unchanged, workers as actors spread over the nodes, KV across nodes through the object
store, a FluidRole switch across them, a killed actor recovered by the reliability path, and the
greedy tokens of the single-process engine throughout."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest
from rtbackend_help import FORCED_ONLY, served_setup

from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
MAX_TOKENS = 16
N = 6


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine (2 logical CPUs each), the dashboard off, small object stores,
    temporary files in a short private directory (Ray's socket paths must stay short)."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="fpr-")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"))
    node = {"num_cpus": 2, "object_store_memory": 100 << 20}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def setup(cluster):
    return served_setup(N, MAX_TOKENS)


def coordinator(setup, policy: str, workers: int = 3, **kw):
    config, profile, _, _ = setup
    runtime = RuntimeConfig(
        workers=workers,
        policy=policy,
        backend="ray",
        tbt_slo_s=0.5,
        admit_ttft_factor=0,  # admission control is not the subject: a slow host must not 429
        heartbeat_timeout_s=5.0,  # actors share 2 cores with two raylets
        scheduling=PolicyConfig(prefill_workers=1, max_num_seqs=16),
        **kw,
    )
    return build_coordinator(config, runtime, log=lambda m: None, profile=profile)


async def stream_all(coord, ids, hook=None, wait_replaced: bool = False):
    """Every prompt streamed; `hook(coord)` once some stream has 3 tokens; with `wait_replaced`,
    then until every lost worker is replaced. (results, the cluster state before stopping)."""
    await coord.start()
    try:
        streams = [
            coord.submit(GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)))
            for i, p in enumerate(ids)
        ]
        fired = asyncio.Event()

        async def collect(s):
            toks, reason = [], None
            async for ev in s:
                toks += ev.token_ids
                reason = ev.finish_reason or reason
                if hook and not fired.is_set() and len(toks) >= 3:
                    fired.set()
                    await hook(coord)
            return toks, reason

        results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), 900)
        switching = getattr(coord.cluster.policy, "switching", lambda: False)
        for _ in range(6000):  # a role switch may outlast the streams on a slow host: let it finish
            if not switching():
                break
            await asyncio.sleep(0.1)
        for _ in range(6000 if wait_replaced else 0):  # a replacement actor starts: seconds (minutes, loaded)
            if coord.status()["status"] == "ok":
                break
            await asyncio.sleep(0.1)
        return results, coord.cluster_state()
    finally:
        await coord.stop()


def nodes(coord) -> list[str]:
    return [b.node_id for b in coord.backends]


def test_workers_spread_over_nodes_and_kv_crosses_them(setup):
    _, _, ids, expected = setup
    coord = coordinator(setup, "static-pd", workers=2)
    assert len(set(nodes(coord))) == 2  # one actor per node (SPREAD)
    assert coord.cluster is None
    results, state = asyncio.run(stream_all(coord, ids))
    assert [t for t, _ in results] == expected
    assert all(r == "length" for _, r in results)
    assert coord.cluster.transport_between(0, 1) == "ray"
    assert all(w["kv_blocks_used"] == 0 and not w["queue"] for w in state["workers"])


def test_a_fluidrole_switch_across_nodes_loses_no_token(setup):
    _, _, ids, expected = setup
    coord = coordinator(setup, "fluidpd", fluid=FORCED_ONLY)

    async def switch(c):
        (d,) = [w.id for w in c.cluster.workers if w.role.value == "decode"][-1:]
        c.force_role(d, "prefill")

    results, state = asyncio.run(stream_all(coord, ids * 2, hook=switch))
    assert [t for t, _ in results] == expected * 2
    (t,) = state["transitions"]
    assert t["done"] and t["to"] == "prefill"
    assert len(set(nodes(coord))) == 2


def test_a_killed_actor_is_a_lost_worker_and_is_replaced(setup):
    _, _, ids, expected = setup
    coord = coordinator(setup, "static-pd")

    async def kill(c):
        wid = max((w for w in c.cluster.workers if w.role.value == "decode"), key=lambda w: w.num_decoding).id
        ray.kill(c.backends[wid]._actor, no_restart=True)

    results, state = asyncio.run(stream_all(coord, ids, hook=kill, wait_replaced=True))
    assert [t for t, _ in results] == expected  # no token lost or repeated
    assert all(r == "length" for _, r in results)
    (loss,) = state["losses"]
    assert loss["restarted"] >= 1 and state["workers_down"] == [] and state["outstanding"] == 0
    assert all(w["kv_blocks_used"] == 0 for w in state["workers"])


def test_an_actor_of_gguf_weights_starts_with_openmp_asleep_as_a_process_worker(cluster):
    """The actor's process starts with OMP_WAIT_POLICY=PASSIVE in its environment (runtime_env), so its
    OpenMP threads sleep beside the gguf kernel's own pool, as a process worker's do."""
    from fluidpd.engine.config import EngineConfig
    from fluidpd.runtime.ray_worker import RayWorker

    config = EngineConfig(model="smollm2", num_kv_blocks=32, max_model_len=512)
    assert config.gguf_blocks
    worker = RayWorker(0, config, warmup=False)
    try:
        info = worker.start()
    finally:
        worker.close()
    assert info.omp_wait_policy == os.environ.get("OMP_WAIT_POLICY", "PASSIVE") and info.quantization == "gguf"


def test_the_links_between_nodes_are_measured_both_ways(cluster):
    from fluidpd.runtime.ray_links import measure_links
    from fluidpd.runtime.ray_worker import RayPlacement

    placement = RayPlacement.create(2, strategy="STRICT_SPREAD")
    try:
        links = measure_links(placement.group, nbytes=8 << 20, repeats=2, collective=True)
    finally:
        placement.remove()
    assert links.nodes == [0, 1]
    assert set(links.bandwidth) == {"object_store", "gloo"}
    assert min(links.bandwidth.values()) > 1e7  # bytes/s: both paths moved the 8 MiB
    assert links.inter_node_bw == links.bandwidth["object_store"]
    assert "2 nodes; KV across nodes measured (8 MiB)" in links.describe()


def test_place_reads_the_cluster_link(cluster, capsys):
    from fluidpd.cli import main

    argv = ["place", "--model", "smollm2-135m", "--dtype", "fp32", "--gpu", "cpu-host", "--nodes", "2"]
    argv += ["--gpus-per-node", "2", "--trace", "azure_conv", "--duration", "120", "--ttft-slo", "20"]
    argv += ["--tpot-slo", "0.5", "--rate", "0.2", "--algorithm", "auto", "--ray-address", cluster.address]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "inter-node KV link: 2 nodes; KV across nodes measured" in out
    assert "the cpu-host spec says" in out
