"""The runtime's admin and observability reads: the cluster's state, metrics, pressure and request traces."""

from __future__ import annotations

from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.fluidrole import SwitchConflict
from fluidpd.policy.telemetry import Pressure, decode_pressure_index, prefill_pressure_index
from fluidpd.policy.view import Role
from fluidpd.runtime.api import Conflict
from fluidpd.runtime.cluster_json import transition_json, worker_json


class Admin:
    """Mixin of Coordinator: what `/v1/admin/*` and `/metrics` read, and the admin's forced role switch."""

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
