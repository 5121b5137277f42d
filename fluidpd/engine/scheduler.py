"""Continuous batching: every step mixes decodes and prefill chunks under a token budget.

Order of a step (vLLM v1 / Sarathi style):
  1. running sequences first, FCFS: one token for a decoding one, the next chunk for one
     still prefilling; when a block is missing, the newest running sequence is preempted by
     recompute (blocks freed, back to the front of the queue) until it fits;
  2. then waiting sequences, FCFS, while the budget, `max_num_seqs` and free blocks allow:
     admission starts a sequence after its longest cached prefix (prefix caching) and reserves
     blocks for the rest of the prompt; the first chunk fits the budget.
No admission in a step that preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fluidpd.engine.block_manager import BlockManager
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    """Plans each step over the waiting and running sequences within the token, sequence and block budgets."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.load_stored: Callable[[Sequence, int], int] | None = None  # KV store reads after the arena's hits
        self.dropped: list[Sequence] = []  # can never fit this pool; reported by the engine

    # ------------------------------------------------------------------ queue changes
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def start(self, seq: Sequence) -> None:
        """Move a waiting sequence to running (an external plan started it, or KV was imported)."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.status is not SequenceStatus.RUNNING:
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence that arrives with KV already in its blocks (imported)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and free its blocks (finished, aborted, exported)."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        self.blocks.free(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def pop_dropped(self) -> list[Sequence]:
        """The sequences dropped since the last call (the engine finishes them as "capacity")."""
        dropped, self.dropped = self.dropped, []
        return dropped

    # ------------------------------------------------------------------ planning
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        budget, preempted = self._schedule_running(plan, budget)
        if not preempted:
            self._schedule_waiting(plan, budget)
        return plan

    def _schedule_running(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget)
            while self.blocks.needed(seq, seq.num_computed + n) > self.blocks.num_free:
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self.blocks.allocate(seq, seq.num_computed + n)
                _add(plan, seq, n)
                budget -= n
                i += 1
        return budget, preempted

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.blocks.blocks_for(seq.num_tokens) > self.blocks.num_blocks:
                self.waiting.popleft()  # longer than the whole pool: would wait forever
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "capacity"
                self.dropped.append(seq)
                continue
            want = (seq, seq.num_tokens, self.blocks.lookup(seq))
            if self.blocks.shortfall([want]) > self.blocks.num_free:
                break
            self.waiting.popleft()
            self.blocks.reserve([want])
            if self.load_stored is not None:
                self.load_stored(seq, (seq.num_tokens - 1) // self.blocks.block_size)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed, budget)
            _add(plan, seq, n)
            budget -= n


def _add(plan: StepPlan, seq: Sequence, n: int) -> None:
    if n == 1 and seq.is_decoding:
        plan.decodes.append(seq.key)
    else:
        plan.prefills.append(PrefillChunk(seq.key, n))
