"""The serving runtime: engine workers, the shared policy on the wall clock, request streams.

Every configuration, one worker included, runs here: the same `World` lifecycle and the same
`fluidpd/policy` classes as the simulator, with steps executed on real engines. What the admin
endpoints and `/metrics` read is `fluidpd.runtime.admin`'s.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from fluidpd.core.blockhash import block_hashes
from fluidpd.core.request import Request
from fluidpd.engine.kvstore.shm import SharedKVStore, slots_for
from fluidpd.policy.costs import CostModel
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.view import Role, blocks_for
from fluidpd.runtime.admin import Admin
from fluidpd.runtime.admission import TtftEstimate, admit, estimate_ttft
from fluidpd.runtime.api import Draining, GenerationRequest, Overloaded, Unavailable
from fluidpd.runtime.clock import RealtimeLoop
from fluidpd.runtime.cluster import RuntimeCluster
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.live import Live
from fluidpd.runtime.otel import SpanExport
from fluidpd.runtime.profile import EngineProfile
from fluidpd.runtime.steplog import StepLog
from fluidpd.runtime.streams import Stream
from fluidpd.runtime.traces import TraceStore
from fluidpd.runtime.window import RecentWindow, WindowedMetrics
from fluidpd.world.events import EventKind
from fluidpd.world.host_tier import HostTier
from fluidpd.world.trace import RequestTracer

PRESSURE_SAMPLE_S = 1.0  # the live view's PPI/DPI history: one sample a second


class Coordinator(Admin):
    """A ServingRuntime over started worker backends (all the same model and arena size)."""

    def __init__(
        self,
        backends: list,
        tokenizer,
        model_name: str,
        max_model_len: int,
        vocab_size: int,
        kv_blocks: int,
        block_size: int,
        kv_bytes_per_token: float,
        profile: EngineProfile,
        config: RuntimeConfig,
        spawn=None,
        release=None,
        prefix_caching: bool = False,
        kv_store: str = "",
        kv_store_bytes: int = 0,
        compute_slots: int = 0,
    ):
        self.prefix_caching = prefix_caching  # the engines cache prefixes: requests carry block hashes
        self.compute_slots = compute_slots  # steps at full speed at once on shared cores (0: a device each)
        self.kv_store, self.kv_store_bytes = kv_store, kv_store_bytes  # the node-shared KV store ("": none)
        self.backends, self.tokenizer, self.model_name = backends, tokenizer, model_name
        self.max_model_len, self.vocab_size, self.config, self.profile = max_model_len, vocab_size, config, profile
        self.kv_blocks, self.block_size, self.kv_bytes_per_token = kv_blocks, block_size, kv_bytes_per_token
        self.cluster: RuntimeCluster | None = None
        self.spawn = spawn  # wid -> an unstarted backend (replacements for lost workers)
        self.release = release  # called once the workers are closed (e.g. Ray's placement group)
        self._ids = itertools.count()
        self.policy_name = config.policy
        self.draining = False  # set by drain(): no new requests, the admitted ones finish
        self.recent = RecentWindow(config.slo)  # the last minute, for `fluidpd top` (renewed at start)
        self.traces: TraceStore | None = None  # the last requests' timelines (config.request_traces)

    @property
    def healthy(self) -> bool:
        """Serving: started, not failed, and at least one worker up."""
        cl = self.cluster
        return cl is not None and cl.failed is None and len(cl.down) < len(cl.workers)

    def status(self) -> dict:
        """/health's body: ok, degraded (some workers lost and being replaced), draining (shutting
        down: `outstanding` admitted requests left) or down."""
        cl = self.cluster
        if self.draining:
            return {"status": "draining", "outstanding": cl.outstanding if cl is not None else 0}
        if not self.healthy or cl is None:
            return {"status": "down"}
        if cl.down:
            return {"status": "degraded", "workers_down": sorted(cl.down), "replacing": sorted(cl.replacing)}
        return {"status": "ok"}

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        c, p = self.config, self.profile
        pcfg = replace(
            c.scheduling,
            prefill_batch_tokens=c.scheduling.prefill_batch_tokens or p.prefill_batch_tokens,
            max_num_batched_tokens=min(c.scheduling.max_num_batched_tokens, self.max_model_len, c.prefill_chunk_tokens),
            max_prefill_chunk=c.prefill_chunk_tokens,
        )
        # the real engine has no context-parallel attention: long prompts are not spread
        fluid = replace(c.fluid, token=replace(c.fluid.token, max_split=1))
        policy = make_policy(c.policy, pcfg, fluid, self.costs() if POLICIES.get(c.policy).needs_costs else None)
        loop = RealtimeLoop(asyncio.get_running_loop())
        self.recent = RecentWindow(c.slo)
        metrics = WindowedMetrics(c.slo, recent=self.recent, clock=loop)
        self.cluster = cl = RuntimeCluster(
            self.backends,
            policy,
            self.kv_bytes_per_token,
            self.kv_blocks,
            metrics,
            self.block_size,
            loop,
            c.prefill_kv_fraction,
            spawn=self.spawn if c.replace_workers else None,
            heartbeat_timeout_s=c.heartbeat_timeout_s,
            step_timeout_s=c.step_timeout_s,
            step_log=StepLog(c.step_log) if c.step_log else None,
        )
        cl.prefill_kv_floor = blocks_for(self.max_model_len, self.block_size)
        cl.recent = self.recent
        if c.request_traces or c.otlp_traces_endpoint:
            export = SpanExport.otlp(c.otlp_traces_endpoint) if c.otlp_traces_endpoint else None
            self.traces = TraceStore(c.request_traces, export)
            self.traces.start(loop.now)
            cl.tracer = RequestTracer(self.traces.add)
        if self.kv_store:  # the World's view of the node's store: one tier every worker shares
            pool = HostTier(slots_for(self.kv_store_bytes, int(self.kv_bytes_per_token * self.block_size)), pooled=True)
            for w in cl.workers:
                w.host = pool
        for w in cl.workers:
            if w.role is Role.PREFILL:
                blocks = cl.remap_blocks(w, Role.PREFILL)
                if blocks != w.kv_blocks_total:
                    await asyncio.wrap_future(self.backends[w.id].submit("resize_kv", blocks))
                    w.kv_blocks_total = blocks
        loop.at(0.0, EventKind.SAMPLE, cl._sample, 1.0)
        loop.at(0.0, EventKind.SAMPLE, self._sample_pressure)
        loop.at(0.0, EventKind.CONTROL, cl.watch)
        if policy.uses_tick:
            loop.at(0.0, EventKind.CONTROL, cl._control)

    def _sample_pressure(self, _=None) -> None:
        cl = self.cluster
        if cl is None or not cl.running:
            return
        p = self.pressure()
        self.recent.sample(cl.now, p.ppi, p.dpi)
        cl.loop.at(cl.now + PRESSURE_SAMPLE_S, EventKind.SAMPLE, self._sample_pressure)

    def costs(self) -> CostModel:
        p = self.profile
        slo, slots = self.config.slo, self.compute_slots
        return CostModel(slo, p.prefill_time, p.chunk_time, p.decode_step_s, compute_slots=slots)

    def drain(self) -> None:
        """Admit nothing new (submit raises Draining); the admitted requests run on to their end."""
        self.draining = True

    def cut(self) -> int:
        """Stop stepping and end every admitted request with an "abort" event; how many there were."""
        cl = self.cluster
        if cl is None:
            return 0
        cl.running = False
        live = list(cl.live.values())
        for one in live:
            cl._close(one, "abort")
        return len(live)

    async def stop(self) -> None:
        self.cut()
        if self.cluster is not None and self.cluster.step_log is not None:
            self.cluster.step_log.close()
        if self.traces is not None:
            self.traces.close()
        for b in self.backends:
            b.close()
        if self.release is not None:
            self.release()
            self.release = None
        if self.kv_store:
            SharedKVStore.unlink(self.kv_store)

    # --- requests -------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Stream:
        """Accept a request that can be served (ValueError otherwise: nothing is queued)."""
        cl = self._cluster()
        if self.draining:
            raise Draining("the server is shutting down")
        if cl.failed:
            raise Unavailable(f"the runtime has failed: {cl.failed}")
        ids, params = request.prompt_token_ids, request.params
        n = len(ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        bad = next((t for t in ids if not (isinstance(t, int) and 0 <= t < self.vocab_size)), None)
        if bad is not None:
            raise ValueError(f"token id {bad!r} is out of range: the vocabulary has {self.vocab_size} tokens")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len {self.max_model_len}"
            )
        req = self._request(cl, ids, max(1, params.max_tokens))  # (max_tokens 0: the prefill's "token" ends it)
        req.constrained = params.structured is not None
        if params.prompt_logprobs is not None:
            req.block_hashes = []  # every prompt token's logits are computed: no cached prefix is planned
        req.n = req.live = params.n  # n > 1: one request group, n decode sequences
        self._admit(cl, req)
        stream = Stream(request.request_id, _abort=lambda s, rid=req.id: cl.abort(rid), ends=params.n)
        cl.add(Live(req, list(ids), params, stream))
        return stream

    def ttft_estimate(self, prompt_ids: list[int]) -> TtftEstimate:
        """A new prompt's predicted TTFT now, split into its own prefill and the queue in front of it
        (`fluidpd.runtime.admission`), at the measured prefill speed and the policy's online scale."""
        cl = self._cluster()
        return self._estimate(cl, self._request(cl, prompt_ids, 1, rid=-1))

    def _estimate(self, cl: RuntimeCluster, req: Request) -> TtftEstimate:
        return estimate_ttft(cl, req, self.profile.prefill_time, getattr(cl.policy, "prefill_scale", 1.0))

    def _request(self, cl: RuntimeCluster, ids: list[int], max_tokens: int, rid: int | None = None) -> Request:
        req = Request(next(self._ids) if rid is None else rid, cl.now, len(ids), max_tokens)
        if self.prefix_caching:
            req.block_hashes = block_hashes(ids, self.block_size)
        return req

    def _admit(self, cl: RuntimeCluster, req: Request) -> None:
        """Overloaded (HTTP 429) when too many requests wait, or the queue in front of `req` would
        make it miss; LimitExceeded (400) over the operator's hard limit."""
        c = self.config
        # (a decoding request's `generated` is synced lazily, but is >= 1 from its first token on)
        waiting = sum(1 for live in cl.live.values() if live.request.generated == 0)
        if waiting >= c.max_waiting:
            self.recent.on_refused(cl.now)
            raise Overloaded(
                f"{waiting} requests are waiting for their first token (--max-waiting {c.max_waiting})", 1.0
            )
        if c.admit_ttft_factor > 0 or c.admit_max_prefill_s > 0:
            try:
                admit(self._estimate(cl, req), c.ttft_slo_s, c.admit_ttft_factor, c.admit_max_prefill_s)
            except Overloaded:
                self.recent.on_refused(cl.now)
                raise

    def _cluster(self) -> RuntimeCluster:
        if self.cluster is None:
            raise RuntimeError("the runtime is not started")
        return self.cluster
