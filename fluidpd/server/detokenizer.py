"""Incremental detokenization: the output text of one request as its tokens arrive."""

from __future__ import annotations

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output (for the right leading space)


class IncrementalDetokenizer:
    """Output text of one request as tokens arrive: decode a small window, emit the new suffix.

    The window (vLLM's prefix/read offsets) starts inside the prompt so the first token keeps its
    leading space. Text is held back while it ends in an incomplete UTF-8 sequence (U+FFFD) and
    while it ends in a prefix of a stop string; at a stop the text is cut at the stop string."""

    def __init__(
        self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (), include_stop: bool = False
    ) -> None:
        self.tok = tokenizer
        ctx = list(prompt_ids[-CONTEXT_TOKENS:])
        self.ids = ctx
        self.prefix, self.read = 0, len(ctx)
        self.text = ""
        self.sent = 0
        self.stop, self.include_stop = tuple(stop), include_stop

    def _advance(self, force: bool = False) -> None:
        if self.read == len(self.ids):
            return
        full = self.tok.decode(self.ids[self.prefix :])
        if full.endswith("\ufffd") and not force:
            return
        head = self.tok.decode(self.ids[self.prefix : self.read])
        if len(full) > len(head):
            self.text += full[len(head) :]
        self.prefix, self.read = self.read, len(self.ids)

    def _safe_len(self) -> int:
        t, cut = self.text, len(self.text)
        for s in self.stop:
            i = t.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                cut = min(cut, i)
            for k in range(min(len(s) - 1, len(t)), 0, -1):
                if t.endswith(s[:k]):
                    cut = min(cut, len(t) - k)
                    break
        return max(cut, self.sent)

    def add(self, token_ids: list[int]) -> str:
        """New text that is safe to show after `token_ids`."""
        if token_ids:
            self.ids.extend(token_ids)
            self._advance()
        safe = self._safe_len()
        delta, self.sent = self.text[self.sent : safe], safe
        return delta

    def finish(self, reason: str | None) -> str:
        """The rest of the text at the end of the request (cut at the stop string on a stop)."""
        self._advance(force=True)
        final = self.text
        if reason == "stop" and self.stop:
            hits = [(final.find(s), s) for s in self.stop if s in final]
            if hits:
                i, s = min(hits)
                final = final[: i + (len(s) if self.include_stop else 0)]
        self.text = final
        delta = final[self.sent :]
        self.sent = max(self.sent, len(final))
        return delta

    @property
    def output_text(self) -> str:
        return self.text[: self.sent]
