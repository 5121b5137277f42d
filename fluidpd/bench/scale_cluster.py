"""A cluster at scale for timing the control plane alone (issue 54): N workers holding Q requests.

The workers are the world's own `WorkerState`s (the bookkeeping both the simulator and the runtime
keep, which the policy reads through `WorkerView`), filled with synthetic state: decode batches,
KV use, prefix caches holding shared system prompts, prefill queues, KV held for pulls, and measured
step times fed to the policy as a world feeds them (`observe_step`). No event loop, no engine.
`fluidpd.bench.control_scale` moves such a cluster on and times the policy's calls.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fluidpd.core.blockhash import block_hashes
from fluidpd.core.metrics import Slo
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import Policy, PolicyConfig
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.telemetry import prompt_pool
from fluidpd.policy.view import Role, StepPlan
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, prefill_saturation_tokens
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.world.worker import WorkerState


def _unset(*_):
    raise RuntimeError("set by build")


BLOCK = 16
SYSTEM_PROMPTS, SYSTEM_TOKENS = 32, 512  # shared system prompts (what KV affinity finds)
VOCAB = 32000
# share of the requests in flight queued for prefill, and how long (in TTFT SLOs) the queued ones have waited at most
SCENARIOS = {"steady": (0.05, 0.5), "burst": (0.3, 3.0)}


def setup() -> Setup:
    """Llama-3.1-8B on H100s, TTFT 1 s / TBT 50 ms (the fingerprint's 8B setting)."""
    return Setup(get_model("llama-3.1-8b", "bf16"), get_hardware("h100"), Slo(1.0, 0.05), SimConfig())


def _system_prompts() -> list[tuple[list[int], list[int]]]:
    """(token ids, block hashes) of each shared system prompt."""
    out = []
    for k in range(SYSTEM_PROMPTS):
        ids = [(k * 7919 + 13 * i) % VOCAB for i in range(SYSTEM_TOKENS)]
        out.append((ids, block_hashes(ids, BLOCK)))
    return out


@dataclass
class ScaleCluster:
    """What the policy and admission read of a world (`ClusterView`, `parked`, `policy`), and the
    synthetic workload's state."""

    policy: Policy
    workers: list[WorkerState]
    slo: Slo
    now: float = 0.0
    parked: deque = field(default_factory=deque)
    rng: random.Random = field(default_factory=random.Random)
    next_id: int = 0
    queued_target: int = 0
    waited_slos: float = 0.5  # a new request has waited up to this many TTFT SLOs already
    step_time: Callable = _unset  # StepShape -> seconds (the latency model)
    prefill_time: Callable = _unset  # f_P (admission's: the fit the runtime's profile makes)
    systems: list = field(default_factory=_system_prompts)

    def prompt(self) -> tuple[list[int], int, int]:
        """A new prompt's token ids (one of the shared system prompts, then its own tokens), its
        output length and which system prompt it starts with (lognormal lengths)."""
        rng = self.rng
        own = min(4096, max(16, int(rng.lognormvariate(math.log(512), 0.8))))
        out = min(1024, max(2, int(rng.lognormvariate(math.log(128), 0.8))))
        system = rng.randrange(SYSTEM_PROMPTS)
        seed = rng.randrange(VOCAB)
        return self.systems[system][0] + [(seed + 31 * i) % VOCAB for i in range(own)], out, system

    def request(self) -> Request:
        """A new request like `prompt()`'s: its system prompt's block hashes as the runtime computes
        them (chained BLAKE2b of the token ids), then hashes of its own blocks that no other request
        shares (cheaper to make than the chain, and as unlikely to match)."""
        rng = self.rng
        own = min(4096, max(16, int(rng.lognormvariate(math.log(512), 0.8))))
        out = min(1024, max(2, int(rng.lognormvariate(math.log(128), 0.8))))
        hashes = self.systems[rng.randrange(SYSTEM_PROMPTS)][1]
        waited = rng.random() * self.waited_slos * self.slo.ttft_s
        req = Request(self.next_id, self.now - waited, SYSTEM_TOKENS + own, out)
        self.next_id += 1
        req.block_hashes = hashes + [hash((req.id, i)) for i in range(own // BLOCK)]
        return req


def build(
    policy_name: str, n_workers: int, in_flight: int, scenario: str = "steady", seed: int = 0, pool_size: int = 0
) -> ScaleCluster:
    """`n_workers` workers in `policy_name`'s initial roles holding `in_flight` requests (`populate`);
    `pool_size`: fluidpd-pools' (0: its default)."""
    s = setup()
    if pool_size:
        s.fluid = replace(s.fluid, pool_size=pool_size)
    roofline = s.roofline()
    cfg = PolicyConfig(prefill_batch_tokens=prefill_saturation_tokens(roofline))
    costs = s.costs(roofline)
    policy = make_policy(policy_name, cfg, s.fluid, costs if POLICIES.get(policy_name).needs_costs else None)
    kv_blocks = s.kv_blocks(roofline)
    workers = [WorkerState(i, r, i // 8, kv_blocks, BLOCK) for i, r in enumerate(policy.roles(n_workers))]
    cl = ScaleCluster(policy, workers, s.slo, rng=random.Random(seed))
    cl.step_time, cl.prefill_time = roofline.step_time, costs.prefill_time
    populate(cl, in_flight, scenario)
    return cl


def populate(cl: ScaleCluster, in_flight: int, scenario: str = "steady") -> None:
    """`cl`'s workers take `in_flight` requests: the `scenario`'s share of them queued for prefill
    (`SCENARIOS`), 2% held for pulls (disaggregated), the rest decoding; every decoding worker has
    stepped a few times (the policy has observed them). Later arrivals have waited as long (a
    burst's backlog stays a backlog: `churn` prefills the oldest first)."""
    queued_share, cl.waited_slos = SCENARIOS[scenario]
    pool = prompt_pool(cl)
    decode = [w for w in cl.workers if w.role in (Role.DECODE, Role.COLOCATED)]
    queued = int(in_flight * queued_share)
    held = int(in_flight * 0.02) if pool[0].role is Role.PREFILL else 0
    cl.queued_target = queued
    for i in range(in_flight - queued - held):
        req = cl.request()
        decode_on(cl, req, decode[i % len(decode)], cl.rng.randrange(1, req.output_len))
    for i in range(held):
        _hold(cl, cl.request(), pool[i % len(pool)], decode[(7 * i) % len(decode)])
    for i in range(queued):
        pool[i % len(pool)].enqueue(cl.request())
    for w in decode:  # every decode worker's T_iter, jitter and step EWMA as a world measures them
        for _ in range(4):
            observe_decode(cl, w)


def decode_on(cl: ScaleCluster, req: Request, w: WorkerState, generated: int) -> bool:
    """`req` decodes on `w`, `generated` tokens out (its KV allocated, its hashed blocks cached)."""
    req.prefilled = req.prefill_target
    req.generated = max(1, min(generated, req.output_len - 1))
    blocks = w.blocks_of(req)
    if blocks > w.free_blocks:
        return False
    w.allocate(blocks)
    w.register(req, w.stored(req))
    w.join(req)
    return True


def _hold(cl: ScaleCluster, req: Request, src: WorkerState, dst: WorkerState) -> None:
    """`req` is prefilled on `src`, its KV waiting for `dst` to pull it."""
    req.prefilled, req.generated = req.prefill_target, 1
    blocks = src.blocks_of(req)
    src.allocate(blocks)
    src.register(req, src.stored(req))
    src.held[req.id] = req
    dst.pull_blocks_pending += blocks


def _decode_step_s(cl: ScaleCluster, w: WorkerState) -> float:
    shape = StepShape()
    shape.add_decodes(w.decode_rows, w.decode_ctx_sum + w.decode_rows)
    return cl.step_time(shape) * (1.0 + 0.05 * cl.rng.gauss(0.0, 1.0))


def observe_decode(cl: ScaleCluster, w: WorkerState) -> float:
    """`w` takes a decode step as the latency model (with 5% jitter) times it, observed by the policy
    and its step EWMA; its duration (0: `w` has nothing decoding)."""
    if not w.decoding:
        return 0.0
    duration = max(1e-4, _decode_step_s(cl, w))
    cl.policy.observe_step(w, duration, StepPlan([], True))
    w.step_time_ewma_s += 0.2 * (duration - w.step_time_ewma_s) if w.step_time_ewma_s else duration
    return duration
