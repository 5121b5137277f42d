"""LLMEngine's step results on its sequences: the sampled tokens appended, each computed chunk's
StepOutput, and the sequences that stopped ended (`_finish`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fluidpd.engine.outputs import RequestOutput, StepOutput
from fluidpd.engine.sequence import Sequence, SequenceStatus
from fluidpd.engine.stopping import stop_reason

if TYPE_CHECKING:
    from fluidpd.engine.scheduler import Scheduler
    from fluidpd.engine.tokenizer import Tokenizer


class StepRecording:
    """Mixin of LLMEngine: what a step's tokens do to its sequences, and how a sequence ends."""

    if TYPE_CHECKING:  # what LLMEngine provides
        scheduler: Scheduler
        seqs: dict[str, Sequence]
        tokenizer: Tokenizer | None
        eos_token_ids: set[int]
        max_model_len: int

        def _finish_member(self, seq: Sequence, reason: str) -> StepOutput: ...

    def _record(self, chunks, sampled, tokens, lps, hits, prompt_lps) -> list[StepOutput]:
        """The step's outputs, one per computed chunk (`hits`: the cached tokens of the sequences it
        admitted, `prompt_lps`: the prompt logprobs it scored), its stopped sequences ended."""
        new = self._accept(sampled, tokens, lps)
        outputs = []
        for seq, _ in chunks:
            tok, lp = new.get(id(seq), (None, None))
            out = StepOutput(
                seq.request_id,
                [] if tok is None else [tok],
                seq.num_computed,
                logprobs=None if lp is None else [lp],
                num_cached_tokens=hits.get(id(seq), 0),
                num_loaded_tokens=seq.num_loaded_tokens if id(seq) in hits else 0,
                prompt_logprobs=prompt_lps.get(id(seq)),
                index=max(seq.index, 0),
            )
            if out.prompt_logprobs is not None and seq.prompt_logprobs is not None:
                seq.prompt_logprobs += out.prompt_logprobs
            self._stop_if_done(seq, tok, out)
            outputs.append(out)
        return outputs

    @staticmethod
    def _accept(sampled: list[Sequence], tokens: list[int], lps: list) -> dict[int, tuple[int, Any]]:
        """Each sampled token (and its logprobs) appended to its sequence; (token, logprobs) by id(sequence)."""
        new = {}
        for seq, tok, lp in zip(sampled, tokens, lps):
            seq.token_ids.append(tok)
            if seq.state is not None:
                seq.state.accept(tok)
            if lp is not None:
                seq.logprobs.append(lp)
            new[id(seq)] = (tok, lp)
        return new

    def _stop_if_done(self, seq: Sequence, tok: int | None, out: StepOutput) -> None:
        """End `seq` if `tok` stops it (or it was only scored), marking `out` finished."""
        reason = None
        if tok is not None:
            reason = stop_reason(seq, tok, self.eos_token_ids, self.tokenizer, self.max_model_len)
        elif seq.params.max_tokens == 0 and seq.num_computed >= seq.prompt_len:
            reason = "length"  # scored, not sampled
        if reason:
            fin = self._finish(seq, reason)
            out.finished, out.finish_reason, out.output = True, reason, fin.output
            out.group_finished = fin.group_finished

    def _finish(self, seq: Sequence, reason: str) -> StepOutput:
        if seq.group is not None:
            return self._finish_member(seq, reason)
        self.scheduler.remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.seqs.pop(seq.request_id, None)
        text = seq.stop_text
        if text is None and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids)
        out = RequestOutput.of(seq, text)
        return StepOutput(seq.request_id, [], seq.num_computed, True, reason, None, out, group_finished=True)
