"""The serving runtime: engine workers, the shared policy on the wall clock, request streams."""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidpd import FluidConfig, FluidPD
from fluidpd.policy.fluidtoken import FluidTokenConfig
from fluidpd.policy.registry import ELASTIC, make_policy
from fluidpd.policy.view import Role, blocks_for
from fluidpd.runtime.api import GenerationRequest
from fluidpd.runtime.clock import RealtimeLoop
from fluidpd.runtime.cluster import Live, RuntimeCluster
from fluidpd.runtime.profile import EngineProfile
from fluidpd.runtime.streams import Stream
from fluidpd.world.events import EventKind


@dataclass(slots=True)
class RuntimeConfig:
    """How the cluster is run: policy, split, SLOs, the prefill role's KV share."""

    policy: str = "fluidpd"
    prefill_workers: int = 0
    ttft_slo_s: float = 2.0
    tbt_slo_s: float = 0.2
    prefill_kv_fraction: float = 0.5
    max_num_seqs: int = 64
    fluid: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ttft_slo_s <= 0 or self.tbt_slo_s <= 0:
            raise ValueError("SLOs must be positive")
        if not 0 < self.prefill_kv_fraction <= 1:
            raise ValueError("prefill_kv_fraction must be in (0, 1]")


class Coordinator:
    """A ServingRuntime over started worker backends (all the same model and arena size)."""

    def __init__(self, backends: list, tokenizer, model_name: str, max_model_len: int, kv_blocks: int,
                 block_size: int, kv_bytes_per_token: float, profile: EngineProfile, config: RuntimeConfig):
        self.backends, self.tokenizer, self.model_name = backends, tokenizer, model_name
        self.max_model_len, self.config, self.profile = max_model_len, config, profile
        self.kv_blocks, self.block_size, self.kv_bytes_per_token = kv_blocks, block_size, kv_bytes_per_token
        self.cluster: RuntimeCluster | None = None
        self._ids = itertools.count()
        self.policy_name = config.policy
        self.model_aliases: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.cluster is not None and self.cluster.failed is None

    @property
    def last_error(self) -> str | None:
        return self.cluster.failed if self.cluster is not None else None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        c, p = self.config, self.profile
        pcfg = PolicyConfig(max_num_seqs=c.max_num_seqs, prefill_workers=c.prefill_workers,
                            prefill_batch_tokens=p.prefill_batch_tokens, max_num_batched_tokens=self.max_model_len,
                            chunk_budget=max(16, p.prefill_batch_tokens))
        fluid = None
        if c.policy in ELASTIC:
            # the real engine has no context-parallel attention: long prompts are not spread
            fluid = FluidConfig(c.ttft_slo_s, c.tbt_slo_s, p.prefill_time, p.chunk_time, p.decode_step_s,
                                token=FluidTokenConfig(max_split=1), **c.fluid)
        policy = make_policy(c.policy, pcfg, fluid)
        metrics = MetricsCollector(Slo(c.ttft_slo_s, c.tbt_slo_s))
        loop = RealtimeLoop(asyncio.get_running_loop())
        self.cluster = cl = RuntimeCluster(self.backends, policy, self.kv_bytes_per_token, self.kv_blocks,
                                           metrics, self.block_size, loop, c.prefill_kv_fraction)
        for w in cl.workers:
            if w.role is Role.PREFILL and c.prefill_kv_fraction < 1:
                blocks = cl.remap_blocks(w, Role.PREFILL)
                await asyncio.wrap_future(self.backends[w.id].submit("resize_kv", blocks))
                w.kv_blocks_total = blocks
        loop.at(0.0, EventKind.SAMPLE, cl._sample, 1.0)
        if policy.uses_tick:
            loop.at(0.0, EventKind.CONTROL, cl._control)

    async def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.running = False
            for live in list(self.cluster.live.values()):
                self.cluster._close(live, "abort")
        for b in self.backends:
            b.close()

    # --- requests -------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Stream:
        cl = self._cluster()
        if cl.failed:
            raise RuntimeError(f"the runtime has failed: {cl.failed}")
        params = request.params
        n = len(request.prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                             f"context length {self.max_model_len}")
        if blocks_for(n + params.max_tokens, self.block_size) > self.kv_blocks:
            raise ValueError(f"prompt + max_tokens needs more KV than one worker holds ({self.kv_blocks} blocks)")
        req = Request(next(self._ids), cl.now, n, params.max_tokens)
        stream = Stream(request.request_id, _abort=lambda s, rid=req.id: cl.abort(rid))
        cl.add(Live(req, list(request.prompt_token_ids), params, stream))
        return stream

    def _cluster(self) -> RuntimeCluster:
        if self.cluster is None:
            raise RuntimeError("the runtime is not started")
        return self.cluster

    # --- admin and observability ----------------------------------------------------------
    def cluster_state(self) -> dict:
        cl = self._cluster()
        pol = cl.policy
        state = {"policy": pol.name, "now_s": cl.now, "outstanding": cl.outstanding, "failed": cl.failed,
                 "workers": [_worker_json(w) for w in cl.workers]}
        if isinstance(pol, FluidPD):
            state.update(ppi=pol.pressure.ppi, dpi=pol.pressure.dpi, state=pol.state,
                         borrowed=pol.token.borrowed,
                         transitions=[_transition_json(t) for t in pol.transitions[-20:]])
        return state

    def force_role(self, worker_id: int, role: str) -> dict:
        cl = self._cluster()
        pol = cl.policy
        if not isinstance(pol, FluidPD):
            raise ValueError(f"policy {pol.name} has no role transitions; serve with --policy fluidpd")
        try:
            target = Role(role)
        except ValueError:
            raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}") from None
        if target is Role.COLOCATED:
            raise ValueError("role must be 'prefill' or 'decode'")
        pol.force_role(worker_id, target, cl)
        return {"worker": worker_id, "role": target.value, "accepted": True}

    def metrics_snapshot(self) -> dict:
        cl = self._cluster()
        state = self.cluster_state()
        return {"num_requests_running": sum(len(w.decoding) for w in cl.workers),
                "num_requests_waiting": sum(len(w.queue) + len(w.pulls) for w in cl.workers),
                "kv_cache_usage": {w.id: w.kv_blocks_used / w.kv_blocks_total for w in cl.workers},
                "worker_role": {w.id: w.role.value for w in cl.workers},
                "prefill_pressure_index": state.get("ppi", 0.0), "decode_pressure_index": state.get("dpi", 0.0),
                "role_transitions_total": len(getattr(cl.policy, "transitions", []))}


def _worker_json(w) -> dict:
    return {"id": w.id, "role": w.role.value, "routable": w.routable, "queue": len(w.queue),
            "decoding": len(w.decoding), "held": len(w.held), "pulls": len(w.pulls),
            "kv_blocks_used": w.kv_blocks_used, "kv_blocks_total": w.kv_blocks_total,
            "step_time_ewma_s": w.step_time_ewma_s, "steps": w.steps, "preemptions": w.preemptions}


def _transition_json(t) -> dict:
    return {"worker": t.worker, "from": t.src_role.value, "to": t.dst_role.value, "reason": t.reason,
            "began_s": t.began_s, "phase": t.phase, "done": t.done, "durations_s": t.durations(),
            "total_s": t.total_s if t.done else None}
