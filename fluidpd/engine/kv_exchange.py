"""LLMEngine's KV exchange with other engines: a request's KV exported (FluidRole's migration, a
prefill -> decode hand-off) and imported, and the prefix-cache lookups that let a move skip the blocks
the destination already holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fluidpd.engine.block_manager import NULL_BLOCK
from fluidpd.engine.block_pool import MissingCachedBlocks
from fluidpd.engine.group_kv import GroupKVMoves
from fluidpd.engine.handoff import payload_of, sequence_of
from fluidpd.engine.kv_transfer import KVPayload
from fluidpd.engine.sampling import SamplingParams
from fluidpd.engine.sequence import SequenceStatus
from fluidpd.engine.structured.engine_hooks import attach_grammar

if TYPE_CHECKING:
    from fluidpd.engine.block_manager import Reservation
    from fluidpd.engine.sequence import Sequence


class KVExchange(GroupKVMoves):
    """Mixin of LLMEngine: export_kv / import_kv, and what a move may skip."""

    if TYPE_CHECKING:  # what LLMEngine provides
        config: Any
        blocks: Any
        arena: Any
        scheduler: Any
        seqs: dict
        kv_layout: Any
        max_model_len: int
        tokenizer: Any

        def _live(self, request_id: str) -> Sequence: ...
        def _new_id(self, request_id: str | None) -> str: ...
        def _reserve_room(self, wants: list[Reservation]) -> None: ...

    def export_kv(
        self,
        request_id: str,
        *,
        release: bool = True,
        device: torch.device | str | None = "cpu",
        skip_blocks: int = 0,
    ) -> KVPayload:
        """A request's KV blocks and state; with `release`, the request leaves this engine.

        `skip_blocks`: leave out the first full blocks (the destination holds them, see
        `cached_prefix_blocks`). An n > 1 request moves whole (`GroupKVMoves`)."""
        if request_id in self.groups:
            return self._export_group(self.groups[request_id], release, device, skip_blocks)
        seq = self._live(request_id)
        nb = self.blocks.blocks_for(seq.num_computed)
        if not 0 <= skip_blocks <= seq.num_computed // self.config.block_size:
            raise ValueError(
                f"request {request_id!r}: skip_blocks {skip_blocks} out of range, it has "
                f"{seq.num_computed // self.config.block_size} full computed blocks"
            )
        dead = seq.num_dead_blocks  # outside the window: nothing to send, nothing to skip
        skip_blocks = 0 if dead else skip_blocks
        kv = self.arena.read_blocks(seq.block_table[max(skip_blocks, dead) : nb], device)
        payload = payload_of(seq, kv, self.kv_layout, skip_blocks)
        if release:
            self.scheduler.remove(seq)
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, "exported"
            del self.seqs[request_id]
        return payload

    def import_kv(self, payload: KVPayload, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Continue a request exported by another engine (same model); its id here.

        A payload that skips blocks starts on this engine's cached copies of them (ValueError if
        it lacks them: MissingCachedBlocks); the imported full blocks become cached here."""
        payload.check_layout(self.kv_layout)
        if payload.group is not None:
            return self._import_group(payload, params, request_id)
        params = params or payload.params
        if len(payload.token_ids) > self.max_model_len:
            raise ValueError(
                f"request has {len(payload.token_ids)} tokens, more than max_model_len {self.max_model_len}"
            )
        rid = self._new_id(request_id if request_id is not None else payload.request_id)
        seq = sequence_of(payload, rid, params)
        seq.init_state(self.eos_token_ids)
        attach_grammar(self.tokenizer, seq, replay=True)
        if payload.num_computed == 0:
            self.seqs[rid] = seq
            self.scheduler.add(seq)
            return rid
        skip = payload.skip_blocks
        hits = self.blocks.lookup_tokens(seq.token_ids, skip) if skip else []
        if len(hits) < skip:
            raise MissingCachedBlocks(
                f"import of {rid!r} skips {skip} KV blocks, but this engine holds only the first {len(hits)} of them"
            )
        dead = payload.dead_blocks
        seq.block_table, seq.num_dead_blocks = [NULL_BLOCK] * dead, dead
        self._reserve_room([(seq, payload.num_computed, hits)])
        self.arena.write_blocks(seq.block_table[skip + dead :], payload.blocks)
        seq.num_computed = payload.num_computed
        seq.admitted = True
        self.blocks.register(seq)
        self.seqs[rid] = seq
        self.scheduler.add_running(seq)
        return rid

    # ------------------------------------------------------------------ prefix cache
    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` a new request would take from the cache (full blocks, all but
        the last token when every block is cached); no side effects."""
        if not token_ids:
            return 0
        return self.blocks.hit_tokens(len(token_ids), len(self.blocks.lookup_tokens(list(token_ids))))

    def cached_prefix_blocks(self, token_ids: list[int]) -> int:
        """Leading full blocks of `token_ids` this engine holds cached (what a hand-off may skip); no side effects."""
        return len(self.blocks.lookup_tokens(list(token_ids)))
