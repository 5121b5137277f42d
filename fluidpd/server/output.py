"""One choice's output as its events arrive: text (detokenized, cut at stops), usage and logprobs."""

from __future__ import annotations

import math

from fluidpd.runtime.api import TokenEvent
from fluidpd.server.detokenizer import IncrementalDetokenizer

MIN_LOGPROB = -9999.0  # JSON has no -inf


class ChoiceOutput:
    """Text, token count and logprobs of one request's choice, as events arrive."""

    def __init__(self, tokenizer, prompt_ids: list[int], params, chat: bool) -> None:
        self.tok = tokenizer
        self.params = params
        self.finish_reason: str | None = None
        self.all_logprobs: list | None = [] if params.logprobs is not None else None
        self.prompt_len = len(prompt_ids)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop, params.include_stop_str_in_output)
        self.hidden = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.hidden |= set(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.chat = chat
        self.token_ids: list[int] = []
        self.text_offset = 0
        self.cached_tokens = 0  # prompt tokens whose prefill the prefix cache skipped

    def add(self, event: TokenEvent) -> str:
        ids = event.token_ids
        if event.cached_tokens is not None:
            self.cached_tokens = event.cached_tokens
        self.token_ids += ids
        if event.logprobs is not None and self.all_logprobs is not None:
            self.all_logprobs += event.logprobs
        shown = ids[:-1] if event.finish_reason == "stop" and ids and ids[-1] in self.hidden else ids
        delta = self.detok.add(shown)
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            delta += self.detok.finish(event.finish_reason)
        return delta

    @property
    def text(self) -> str:
        return self.detok.output_text

    @property
    def wants_logprobs(self) -> bool:
        return self.params.logprobs is not None

    def prompt_token_logprobs(self, prompt_ids: list[int], plps: list | None) -> dict:
        """Completions logprobs of an echoed prompt: its first token has none (null), as OpenAI's."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for i, tid in enumerate(prompt_ids):
            lp = plps[i] if plps is not None and i < len(plps) else None
            piece = self._piece(tid)
            tokens.append(piece)
            token_lps.append(None if lp is None else finite(lp.logprob))
            top = (
                None
                if lp is None
                else {self._piece(t): finite(v) for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])}
            )
            tops.append(None if lp is None else (top or {piece: finite(lp.logprob)}))
            offsets.append(self.text_offset)
            self.text_offset += len(piece)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def vllm_prompt_logprobs(self, prompt_ids: list[int], plps: list) -> list:
        """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}}."""
        out: list = []
        for tid, lp in zip(prompt_ids, plps):
            if lp is None:
                out.append(None)
                continue
            ranked = sorted(lp.top.items(), key=lambda kv: -kv[1])
            entry = {
                str(t): {"logprob": finite(v), "rank": r, "decoded_token": self._piece(t)}
                for r, (t, v) in enumerate(ranked, 1)
            }
            entry[str(tid)] = {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": self._piece(tid)}
            out.append(entry)
        return out

    def usage(self) -> dict:
        n = len(self.token_ids)
        return {
            "prompt_tokens": self.prompt_len,
            "completion_tokens": n,
            "total_tokens": self.prompt_len + n,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _piece(self, tid: int) -> str:
        return self.tok.decode([tid], skip_special_tokens=False)

    def logprobs(self, lps: list | None) -> dict | None:
        if lps is None:
            return None
        if self.chat:
            content = []
            for lp in lps:
                piece = self._piece(lp.token_id)
                top = [
                    {"token": self._piece(t), "logprob": finite(v), "bytes": list(self._piece(t).encode())}
                    for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])
                ]
                content.append(
                    {"token": piece, "logprob": finite(lp.logprob), "bytes": list(piece.encode()), "top_logprobs": top}
                )
            return {"content": content, "refusal": None}
        tokens, token_lps, tops, offsets = [], [], [], []
        for lp in lps:
            piece = self._piece(lp.token_id)
            tokens.append(piece)
            token_lps.append(finite(lp.logprob))
            top = {self._piece(t): finite(v) for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])}
            tops.append(top or {piece: finite(lp.logprob)})
            offsets.append(self.text_offset)
            self.text_offset += len(piece)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def finite(x: float) -> float:
    return x if math.isfinite(x) else MIN_LOGPROB
