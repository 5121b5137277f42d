"""An n > 1 request's KV moved between engines as one unit: before the fork, the prompt's KV with the
choices' first tokens and RNG states; after it, the distinct blocks once plus each choice's block
table as indices into them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fluidpd.engine.block_pool import MissingCachedBlocks, NoFreeBlocksError
from fluidpd.engine.group import SeqGroup, child_params
from fluidpd.engine.handoff import payload_of
from fluidpd.engine.kv_transfer import ChildKV, GroupKV, KVPayload
from fluidpd.engine.sampling_params import SamplingParams
from fluidpd.engine.sequence import Sequence, SequenceStatus
from fluidpd.engine.structured.engine_hooks import attach_grammar

if TYPE_CHECKING:
    import torch


class GroupKVMoves:
    """Mixin of LLMEngine: export and import of a whole group (see `KVExchange`)."""

    if TYPE_CHECKING:  # what LLMEngine provides
        config: Any
        blocks: Any
        arena: Any
        scheduler: Any
        seqs: dict[str, Sequence]
        groups: dict[str, SeqGroup]
        kv_layout: Any
        eos_token_ids: set[int]

        def _new_id(self, request_id: str | None) -> str: ...
        def _reserve_room(self, wants: list) -> None: ...
        def _drop_group(self, g: SeqGroup) -> None: ...

    def _export_group(
        self, g: SeqGroup, release: bool, device: torch.device | str | None, skip_blocks: int
    ) -> KVPayload:
        self.blocks.apply_copies(self.arena.copy_blocks)  # a fork's copies, if not run yet
        live = g.live()
        primary = g.parent if g.parent is not None else next((c for c in live if c.num_computed), live[0])
        others = [c for c in live if c is not primary]
        nb = self.blocks.blocks_for(primary.num_computed)
        if not 0 <= skip_blocks <= primary.num_computed // self.config.block_size:
            raise ValueError(f"request {g.request_id!r}: skip_blocks {skip_blocks} out of range")
        ids = list(primary.block_table[:nb])
        where = {b: i for i, b in enumerate(ids)}
        children = []
        for c in others:
            table = []
            for b in c.block_table[: self.blocks.blocks_for(c.num_computed)]:
                if b not in where:
                    where[b] = len(ids)
                    ids.append(b)
                table.append(where[b])
            state = c.generator.get_state() if c.generator is not None else None
            lps = list(c.logprobs) if c.logprobs is not None else None
            out = list(c.output_token_ids)
            children.append(
                ChildKV(c.index, out, c.num_computed, table, state, lps, c.num_preemptions, c.index in g.resuming)
            )
        kv = self.arena.read_blocks(ids[skip_blocks:], device)
        resuming = primary.index in g.resuming
        group = GroupKV(g.n, primary.index, children, sorted(g.done), len(ids) - nb, resuming)
        payload = payload_of(primary, kv, self.kv_layout, skip_blocks, group)
        if release:
            for c in live:
                if self.seqs.pop(c.key, None) is not None:
                    self.scheduler.remove(c)
                c.status, c.finish_reason = SequenceStatus.FINISHED, "exported"
            g.children.clear()
            self._drop_group(g)
        return payload

    def _import_group(self, payload: KVPayload, params: SamplingParams | None, request_id: str | None) -> str:
        gk = payload.group
        assert gk is not None
        params = params or payload.params
        rid = self._new_id(request_id if request_id is not None else payload.request_id)
        prompt = list(payload.token_ids[: payload.prompt_len])
        g = SeqGroup(rid, gk.n, prompt, done=dict.fromkeys(gk.done))
        if gk.primary < 0:
            primary = g.parent = Sequence(rid, list(prompt), len(prompt), params, index=-1, group=g)
            primary.num_preemptions = payload.num_preemptions
        else:
            out, lps, state = payload.output_token_ids, payload.logprobs, payload.generator_state
            resuming = gk.primary_resuming
            primary = self._group_child(g, params, gk.primary, out, state, lps, payload.num_preemptions, resuming)
        primary.num_cached_tokens = payload.num_cached_tokens
        others = [
            self._group_child(
                g, params, k.index, k.output_ids, k.generator_state, k.logprobs, k.num_preemptions, k.resuming
            )
            for k in gk.children
        ]
        self._share_children(gk, others, self._place_blocks(primary, payload, gk))
        self.groups[rid] = g
        self._enter_group(g, primary, others)
        return rid

    def _group_child(
        self,
        g: SeqGroup,
        params: SamplingParams,
        index: int,
        out: list[int],
        state,
        lps,
        preemptions: int,
        resuming: bool,
    ) -> Sequence:
        """Choice `index` of the imported group `g`, `out` its tokens so far, its RNG `state` and logprobs restored
        (`resuming`: re-added with tokens, not sampled here yet)."""
        p = child_params(params, index)
        c = Sequence(
            g.request_id,
            g.prompt_ids + list(out),
            len(g.prompt_ids),
            p,
            generator=p.make_generator(),
            index=index,
            group=g,
        )
        c.logprobs = list(lps) if lps is not None else c.logprobs
        c.num_preemptions = preemptions
        if c.generator is not None and state is not None:
            c.generator.set_state(state)
        c.init_state(self.eos_token_ids)
        attach_grammar(self.tokenizer, c, replay=True)
        g.children[index] = c
        if resuming:
            g.resuming.add(index)
        return c

    def _share_children(self, gk: GroupKV, others: list[Sequence], ids: list[int]) -> None:
        """Each computed choice's block table, as indices into the placed blocks `ids`; the extra blocks' refs
        dropped."""
        for k, c in zip(gk.children, others):
            if k.num_computed:
                c.block_table = [ids[i] for i in k.table]
                self.blocks.pool.share(c.block_table)
                c.num_computed, c.admitted = k.num_computed, True
                self.blocks.register(c)
        if gk.extra_blocks:
            self.blocks.pool.release(ids[-gk.extra_blocks :])  # each is held by the tables that name it

    def _enter_group(self, g: SeqGroup, primary: Sequence, others: list[Sequence]) -> None:
        """The imported group's sequences join this engine: its parent (before the fork), else every choice."""
        if g.parent is not None:
            self.seqs[g.request_id] = g.parent
            if primary.num_computed >= primary.prompt_len:
                primary.status, g.detached = SequenceStatus.RUNNING, True  # its choices fork where it decodes
            else:
                self._enter(primary)
            return
        for c in [primary, *others]:
            self.seqs[c.key] = c
            self._enter(c)

    def _enter(self, seq: Sequence) -> None:
        if seq.num_computed:
            self.scheduler.add_running(seq)
        else:
            self.scheduler.add(seq)

    def _place_blocks(self, primary: Sequence, payload: KVPayload, gk: GroupKV) -> list[int]:
        """Write the payload's blocks into this pool: the primary's table, then the extra blocks; all their ids."""
        if not payload.num_computed:
            return []
        skip = payload.skip_blocks
        hits = self.blocks.lookup_tokens(primary.token_ids, skip) if skip else []
        if len(hits) < skip:
            raise MissingCachedBlocks(
                f"import of {primary.request_id!r} skips {skip} KV blocks, this engine holds {len(hits)} of them"
            )
        want = (primary, payload.num_computed, hits)
        if self.blocks.shortfall([want]) + gk.extra_blocks > self.blocks.num_free:
            raise NoFreeBlocksError(f"request {primary.request_id!r}: not enough free KV blocks for its group")
        self._reserve_room([want])
        extra = self.blocks.pool.get(gk.extra_blocks) if gk.extra_blocks else []
        self.arena.write_blocks(primary.block_table[skip:] + extra, payload.blocks)
        primary.num_computed = payload.num_computed
        primary.admitted = True
        self.blocks.register(primary)
        return primary.block_table[: self.blocks.blocks_for(payload.num_computed)] + extra
