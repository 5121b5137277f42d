"""The serving runtime: engine workers, the shared policy on the wall clock, request streams.

Every configuration, one worker included, runs here: the same `World` lifecycle and the same
`fluidpd/policy` classes as the simulator, with steps executed on real engines.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from fluidpd.core.blockhash import block_hashes
from fluidpd.core.request import Request
from fluidpd.engine.kvstore.shm import SharedKVStore, slots_for
from fluidpd.policy.costs import CostModel
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.fluidrole import SwitchConflict
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.telemetry import Pressure, decode_pressure_index, prefill_pressure_index
from fluidpd.policy.view import Role, blocks_for
from fluidpd.runtime.admission import TtftEstimate, admit, estimate_ttft
from fluidpd.runtime.api import Conflict, Draining, GenerationRequest, Overloaded, Unavailable
from fluidpd.runtime.clock import RealtimeLoop
from fluidpd.runtime.cluster import RuntimeCluster
from fluidpd.runtime.cluster_json import transition_json, worker_json
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


class Coordinator:
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
    ):
        self.prefix_caching = prefix_caching  # the engines cache prefixes: requests carry block hashes
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
        return CostModel(self.config.slo, p.prefill_time, p.chunk_time, p.decode_step_s)

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
        req = self._request(cl, ids, params.max_tokens)
        self._admit(cl, req)
        stream = Stream(request.request_id, _abort=lambda s, rid=req.id: cl.abort(rid))
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

    # --- admin and observability ----------------------------------------------------------
    def pressure(self) -> Pressure:
        """PPI and DPI: FluidPD's last control cycle, or evaluated now for any other policy."""
        cl = self._cluster()
        if isinstance(cl.policy, FluidPD):
            return cl.policy.pressure
        slo = self.config.slo
        return Pressure(
            cl.now,
            prefill_pressure_index(cl, self.profile.prefill_time, slo.ttft_s),
            decode_pressure_index(cl, slo.tbt_s, self.config.fluid.alpha),
        )

    def cluster_state(self) -> dict:
        cl = self._cluster()
        pol = cl.policy
        state = {
            "policy": pol.name,
            "model": self.model_name,
            "max_model_len": self.max_model_len,
            "now_s": cl.now,
            "outstanding": cl.outstanding,
            "failed": cl.failed,
            "workers_down": sorted(cl.down),
            "losses": cl.losses[-20:],
            "slo": {"ttft_s": self.config.ttft_slo_s, "tbt_s": self.config.tbt_slo_s},
            "profile": self.profile.summary(self.config.worker_threads),  # measured at startup
            "draining": self.draining,
            "workers": [worker_json(w, cl.backends[w.id], cl.policy.transition_of(w.id)) for w in cl.workers],
            "recent": self.recent.summary(cl.now),  # the last minute
            "history": self.recent.history(),  # PPI and DPI, one sample a second
            "kv_moves": {  # hand-offs and migrations: what they sent
                "tokens": cl.kv_tokens_moved,
                "bytes": cl.kv_bytes_moved,
                "sent_bytes": cl.kv_bytes_sent,  # measured: the exported payloads, whole blocks
                "fallbacks": cl.kv_move_fallbacks,  # resent whole: the destination had evicted what they skipped
            },
        }
        if self.kv_store:  # the node's store: the engines' measured traffic, and the World's view of it
            host = cl.workers[0].host
            state["kv_store"] = cl.kv_tiers.store_json(self.kv_store) | {
                "world_view_blocks": len(host) if host is not None else 0
            }
        p = self.pressure()
        state.update(ppi=p.ppi, dpi=p.dpi)
        if isinstance(pol, FluidPD):
            state.update(
                state=pol.state,
                borrowed=pol.token.borrowed,
                transitions=[transition_json(t) for t in pol.transitions[-20:]],
            )
        return state

    def force_role(self, worker_id: int, role: str) -> dict:
        """Admin: switch a worker's role (KeyError: no such worker; ValueError: it cannot switch)."""
        cl = self._cluster()
        if not 0 <= worker_id < len(cl.workers):
            raise KeyError(f"no worker {worker_id} (workers are 0..{len(cl.workers) - 1})")
        if role not in (Role.PREFILL.value, Role.DECODE.value):
            raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
        pol = cl.policy
        if not isinstance(pol, FluidPD):
            raise ValueError(f"policy {pol.name} has no role transitions; serve with --policy fluidpd")
        try:
            pol.force_role(worker_id, Role(role), cl)
        except SwitchConflict as exc:
            raise Conflict(str(exc)) from None
        return {"worker": worker_id, "role": role, "accepted": True}

    def request_traces(self, limit: int = 20) -> list[dict]:
        """The last `limit` finished requests' timelines, newest first (none without --request-traces)."""
        return self.traces.recent(limit) if self.traces is not None else []

    def request_trace(self, name: str) -> dict | None:
        """The timeline of the finished request `name` (its response id), if still kept."""
        return self.traces.find(name) if self.traces is not None else None

    def metrics_snapshot(self) -> dict:
        cl = self._cluster()
        p = self.pressure()
        switching = getattr(cl.policy, "transition", None)  # FluidPD's switch under way
        snap = {
            "num_requests_running": sum(w.num_running for w in cl.workers),
            "num_requests_waiting": sum(w.num_waiting for w in cl.workers),
            "workers": [
                {
                    "id": w.id,
                    "role": w.role.value,
                    "kv_cache_usage_perc": w.kv_blocks_used / w.kv_blocks_total,
                    "prefix_cache_queries": w.prefix_cache_queries,
                    "prefix_cache_hits": w.prefix_cache_hits,
                    "prefix_cache_store_hits": w.host_hits,
                    "num_requests_running": w.num_running,
                    "num_requests_waiting": w.num_waiting,
                    "step_time_s": w.step_time_ewma_s,
                    "generation_tokens": w.tokens_out,
                    "fluidtoken_borrowed_chunks": w.borrowed_chunks,
                    "kv_cached_blocks": w.cache.num_cached,
                    "in_transition": switching is not None and switching.worker == w.id,
                }
                for w in cl.workers
            ],
            "role_transitions_total": len(getattr(cl.policy, "transitions", [])),
            "worker_lost_total": len(cl.losses),
            "draining": bool(self.draining),
            "slo": {"ttft_s": self.config.ttft_slo_s, "tbt_s": self.config.tbt_slo_s},
            "kv_transfer_bytes_total": cl.kv_bytes_moved,
            "prefill_pressure_index": p.ppi,
            "decode_pressure_index": p.dpi,
            "kv_tiers": cl.kv_tiers,
        }
        if self.kv_store:
            snap["kv_store"] = cl.kv_tiers.store_json(self.kv_store)
        return snap
