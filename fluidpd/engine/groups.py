"""LLMEngine's n > 1 requests: a group's prompt is prefilled once by its parent; n first tokens are
sampled from that one logits row; the fork into n sequences sharing the prompt's blocks waits for
the engine that decodes the group (so a hand-off moves the prompt's KV once)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from fluidpd.engine.block_pool import NoFreeBlocksError
from fluidpd.engine.group import SeqGroup, child_params
from fluidpd.engine.outputs import RequestOutput, StepOutput
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling_params import SamplingParams
from fluidpd.engine.sequence import Sequence, SequenceStatus
from fluidpd.engine.structured.engine_hooks import attach_grammar

if TYPE_CHECKING:
    from fluidpd.engine.block_manager import BlockManager
    from fluidpd.engine.scheduler import Scheduler


class GroupOps:
    """Mixin of LLMEngine: add, plan, fork and finish the sequences of n > 1 requests."""

    if TYPE_CHECKING:  # what LLMEngine provides
        config: Any
        blocks: BlockManager
        scheduler: Scheduler
        seqs: dict[str, Sequence]
        groups: dict[str, SeqGroup]
        eos_token_ids: set[int]
        tokenizer: Any

    def _add_group(
        self, rid: str, ids: list[int], params: SamplingParams, produced: list[list[int] | None] | None
    ) -> str:
        """Queue an n > 1 request; `produced[j]`: the tokens choice j already produced (None: it finished)."""
        if produced is not None and len(produced) != params.n:
            raise ValueError(f"{len(produced)} produced token lists for n={params.n}")
        g = SeqGroup(rid, params.n, list(ids))
        g.parent = Sequence(rid, list(ids), len(ids), params, index=-1, group=g)
        for j in range(params.n):
            out = produced[j] if produced is not None else []
            if out is None:
                g.done[j] = None
                continue
            p = child_params(params, j)
            child = Sequence(rid, list(ids) + list(out), len(ids), p, generator=p.make_generator(), index=j, group=g)
            child.init_state(self.eos_token_ids)
            attach_grammar(self.tokenizer, child, replay=bool(out))
            g.children[j] = child
            if out:
                g.resuming.add(j)
        if not g.children:
            raise ValueError(f"request {rid!r}: every one of its {params.n} choices has finished")
        self.groups[rid] = g
        self.seqs[rid] = g.parent
        self.scheduler.add(g.parent)
        return rid

    # ------------------------------------------------------------------ planning
    def _expand(self, plan: StepPlan) -> StepPlan:
        """`plan` with each group id replaced by its sequences: a prefill chunk goes to the prompt, then
        to the choices re-added with tokens; a decode to every live choice (forking the group first, and
        computing whatever of it is still uncomputed)."""
        if not self.groups:
            return plan
        out = StepPlan()
        for c in plan.prefills:
            g = self.groups.get(c.request_id)
            if g is None:
                out.prefills.append(c)
            else:
                self._expand_prefill(g, c, out)
        for rid in plan.decodes:
            g = self.groups.get(rid)
            if g is None:
                out.decodes.append(rid)
            else:
                self._expand_decode(g, out)
        return out

    def _expand_prefill(self, g: SeqGroup, c: PrefillChunk, out: StepPlan) -> None:
        p = g.parent
        if p is not None and not g.detached:
            k = min(c.num_tokens, p.num_uncomputed - c.num_cached)
            out.prefills.append(PrefillChunk(p.key, max(k, 1), c.num_cached))
            return  # the rest of the chunk, if any, is computed when the group decodes
        if p is not None:
            self._fork(g)
        left = c.num_tokens
        for j in sorted(g.resuming):
            child = g.children.get(j)
            if child is None or child.key not in self.seqs or left <= 0:
                continue
            k = min(left, child.num_uncomputed)
            out.prefills.append(PrefillChunk(child.key, k))
            left -= k

    def _expand_decode(self, g: SeqGroup, out: StepPlan) -> None:
        p = g.parent
        if p is not None and not g.detached:
            out.prefills.append(PrefillChunk(p.key, p.num_uncomputed))
            return
        if p is not None:
            self._fork(g)
        for child in g.live():
            if child.key not in self.seqs:
                continue
            if child.num_uncomputed == 1:
                out.decodes.append(child.key)
            else:
                out.prefills.append(PrefillChunk(child.key, child.num_uncomputed))

    def _fork_ready(self) -> None:
        """Fork every group whose prompt is computed, where the pool has room for the copies (built-in scheduler)."""
        for g in list(self.groups.values()):
            if g.detached:
                try:
                    self._fork(g)
                except NoFreeBlocksError:
                    pass  # it forks once a step frees blocks

    def _fork(self, g: SeqGroup) -> None:
        """The live choices take the prompt's blocks: the full ones shared (reference counts), the
        partial last one copied for all but the first (copy-on-write, applied before the next forward)."""
        p = g.parent
        assert p is not None and g.detached
        full, part = divmod(p.prompt_len, self.config.block_size)
        table = p.block_table
        kids = g.live()
        if part and len(kids) - 1 > self.blocks.num_free:
            raise NoFreeBlocksError(f"request {g.request_id!r}: its fork needs {len(kids) - 1} KV blocks")
        pool = self.blocks.pool
        for i, child in enumerate(kids):
            if i == 0:
                child.block_table = list(table)
            else:
                pool.share(table[:full])
                child.block_table = table[:full]
                if part:
                    pool.share([table[full]])  # held until the copy is applied
                    dst = pool.get(1)[0]
                    self.blocks.copies.append((table[full], dst))
                    child.block_table.append(dst)
            child.num_computed = p.prompt_len
            child.block_hashes = list(p.block_hashes[:full])
            child.admitted = True
            child.num_cached_tokens, child.num_loaded_tokens = p.num_cached_tokens, p.num_loaded_tokens
            child.num_preemptions = p.num_preemptions
            self.seqs[child.key] = child
            self.scheduler.add_running(child)
        if not kids:
            self.blocks.free(p)
        p.block_table = []
        self.seqs.pop(p.key, None)
        g.parent, g.detached = None, False

    # ------------------------------------------------------------------ sampling
    def _fan_out(self, logits: torch.Tensor, sampled: list[Sequence]) -> tuple[torch.Tensor, list[Sequence], list]:
        """A group's prompt completed: its row is sampled once per choice without a token yet (each with
        its own generator and state); the parent leaves the scheduler, its blocks wait for the fork.
        Returns the logits, the sequences to sample, and (choice, 0) for each such choice."""
        if not self.groups or all(s.index >= 0 for s in sampled):
            return logits, sampled, []
        rows, seqs, fresh = [], [], []
        for i, s in enumerate(sampled):
            if s.index >= 0:
                rows.append(i)
                seqs.append(s)
                continue
            g = s.group
            self.scheduler.running.remove(s)
            g.detached = True
            for child in g.live():
                if child.num_output_tokens == 0:
                    rows.append(i)
                    seqs.append(child)
                    fresh.append((child, 0))
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        return logits.index_select(0, idx), seqs, fresh

    # ------------------------------------------------------------------ finishing
    def _finish_member(self, seq: Sequence, reason: str) -> StepOutput:
        """One choice ends (or, for the prompt's parent, the whole group); the group leaves with its last."""
        g: SeqGroup = seq.group
        if seq.index < 0:
            return self._end_group(g, reason)
        if self.seqs.pop(seq.key, None) is not None:
            self.scheduler.remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        text = seq.stop_text
        if text is None and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids)
        own = RequestOutput.of(seq, text)
        g.children.pop(seq.index, None)
        g.resuming.discard(seq.index)
        g.done[seq.index] = own
        out = StepOutput(g.request_id, [], seq.num_computed, True, reason, None, own, index=seq.index)
        if g.finished:
            self._drop_group(g)
            out.group_finished, out.output = True, self._group_output(g)
        return out

    def _end_group(self, g: SeqGroup, reason: str) -> StepOutput:
        """Every live choice of `g` ends with `reason` (abort, capacity); the last one's output."""
        out = None
        for child in g.live():
            out = self._finish_member(child, reason)
        if out is None:  # (nothing live: it was already over)
            self._drop_group(g)
            out = StepOutput(g.request_id, [], 0, True, reason, None, self._group_output(g), group_finished=True)
        return out

    def _drop_group(self, g: SeqGroup) -> None:
        p = g.parent
        if p is not None:
            if g.detached or p.status is SequenceStatus.FINISHED:
                self.blocks.free(p)
            else:
                self.scheduler.remove(p)
            p.status = SequenceStatus.FINISHED
            self.seqs.pop(p.key, None)
            g.parent = None
        self.groups.pop(g.request_id, None)

    def _group_output(self, g: SeqGroup) -> RequestOutput:
        samples = [
            g.done.get(j) or RequestOutput(g.request_id, list(g.prompt_ids), [], None, None, index=j)
            for j in range(g.n)
        ]
        return replace(samples[0], samples=samples)
