"""Logits at every position of a prompt, through the engine's paged serving path (perplexity, agreement checks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fluidpd.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from fluidpd.engine.arena import KVArena
    from fluidpd.engine.model import LlamaModel
    from fluidpd.engine.runner import ModelRunner
    from fluidpd.engine.sequence import Sequence


class PromptScoring:
    """Mixin of LLMEngine: `prompt_logits`, a prompt scored in chunks as serving would compute it."""

    if TYPE_CHECKING:  # what LLMEngine provides
        arena: KVArena
        model: LlamaModel
        runner: ModelRunner
        seqs: dict[str, Sequence]

        def add_request(self, prompt: Any, params: SamplingParams | None = None) -> str: ...
        def _reserve_room(self, wants: list) -> None: ...
        def _finish(self, seq: Sequence, reason: str) -> Any: ...

    def prompt_logits(self, token_ids: list[int], chunk_sizes: list[int] | None = None) -> torch.Tensor:
        """Logits [len(token_ids), vocab] at every position, computed through the paged path in
        chunks of `chunk_sizes` (default: one chunk; a chunk of 1 takes the decode path)."""
        chunks = list(chunk_sizes or [len(token_ids)])
        if sum(chunks) != len(token_ids) or min(chunks) < 1:
            raise ValueError(f"chunk sizes {chunks} do not add up to {len(token_ids)} tokens")
        rid = self.add_request(list(token_ids), SamplingParams(max_tokens=1))
        seq = self.seqs[rid]
        try:
            self._reserve_room([(seq, len(token_ids), [])])
            out = []
            for n in chunks:
                ids, pos, meta, _, _ = self.runner.prepare([(seq, n)])
                rows = torch.arange(n, device=ids.device)
                out.append(self.model.forward(ids, pos, meta, self.arena, rows))
                seq.num_computed += n
            return torch.cat(out)
        finally:
            self._finish(seq, "abort")
