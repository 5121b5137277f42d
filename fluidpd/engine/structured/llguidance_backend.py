"""The llguidance backend: JSON Schema, regex, choice and Lark/GBNF grammars compiled for our tokenizer.

Chosen by measurement (benchmarks/engine/structured_outputs_choice.py): it enforces more JSON Schema features than
xgrammar, refuses what it does not implement instead of ignoring it, and imports no torch, so the server
validates grammars with it. Importing this module loads no torch either; only `mask` uses it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance as llg
import numpy as np

from fluidpd.engine.structured.backend import (
    COMPILE_CACHE_SIZE,
    CompiledGrammar,
    GrammarError,
    GrammarMatcher,
    StructuredBackend,
)
from fluidpd.engine.structured.spec import GrammarSpec

if TYPE_CHECKING:
    import torch

    from fluidpd.engine.tokenizer import Tokenizer

# byte -> its 8 bits as additive logits (0 allowed, -inf refused): the bitmask is applied with one add
_BIT_LUT = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool),
    np.float32(0.0),
    np.float32(-np.inf),
)
# no free whitespace: a small model left to choose it may write newlines until max_tokens
JSON_OPTIONS: llg.JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(spec: GrammarSpec) -> str:
    """`spec` as an llguidance grammar (not yet checked); GrammarError if its value is not what the kind takes."""
    kind, value = spec.kind, spec.value
    try:
        if kind == "json":
            schema = json.loads(value)
            if not isinstance(schema, (dict, bool)):
                raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
        if kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(value)
        if kind == "choice":
            choices = json.loads(value)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise GrammarError("choice must be a non-empty list of strings")
            alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
            return llg.LLMatcher.grammar_from_lark(f"start: {alts}")
        if kind == "grammar":
            from llguidance.gbnf_to_lark import any_to_lark

            return llg.LLMatcher.grammar_from_lark(any_to_lark(value))
    except GrammarError:
        raise
    except Exception as exc:  # noqa: BLE001 - the grammar libraries' parse errors (GbnfToLarkError is no ValueError)
        raise GrammarError(f"invalid {kind}: {exc}") from None
    raise GrammarError(f"unknown grammar kind {kind!r}")


@lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _checked(spec: GrammarSpec) -> str:
    grammar = grammar_text(spec)
    err = llg.LLMatcher.validate_grammar(grammar)
    if err:
        raise GrammarError(f"invalid {spec.kind}: {err.strip()}")
    return grammar


class LLGuidanceMatcher(GrammarMatcher):
    """A sequence's llguidance matcher: the mask is filled into a bitmask, then applied to the logits row."""

    def __init__(self, m: llg.LLMatcher, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self.m = m
        self.vocab_size = vocab_size
        self.eos = sorted(set(eos_token_ids))
        self.bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self.error: str | None = None
        self._done = False

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        import torch

        n = row.numel()
        if self._done or self.error is not None or self.m.is_stopped():
            add = np.full(n, -np.inf, dtype=np.float32)
        else:
            self.m.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
            add = np.take(_BIT_LUT, self.bits.view(np.uint8), axis=0).reshape(-1)
            if add.size != n:  # a model vocabulary padded past the tokenizer's
                add = np.concatenate([add[:n], np.full(max(0, n - add.size), -np.inf, dtype=np.float32)])
        if self._done or self.error is not None or self.m.is_accepting():
            add[self.eos] = 0.0
        return row.add_(torch.from_numpy(add).to(row.device, non_blocking=True))

    def accept(self, token: int) -> None:
        if self._done or self.error is not None:
            return
        if token in self.eos:
            if self.m.is_accepting():
                self._done = True
            else:
                self.error = f"EOS (token {token}) before the output is complete"
            return
        if not self.m.consume_token(token):
            why = (self.m.get_error() or "refused by the grammar").strip().splitlines()[0]
            self.error = f"token {token} not allowed: {why}"

    def is_terminated(self) -> bool:
        return self._done or self.error is not None


class LLGuidanceGrammar(CompiledGrammar):
    """A grammar compiled for one tokenizer: a matcher at its start that each sequence copies."""

    def __init__(self, proto: llg.LLMatcher, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.proto, self.vocab_size, self.eos_token_ids = proto, vocab_size, eos_token_ids

    def matcher(self, eos_token_ids: Iterable[int] = ()) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.proto.deep_copy(), self.vocab_size, (*self.eos_token_ids, *eos_token_ids))


class LLGuidanceBackend(StructuredBackend):
    """llguidance over our tokenizer (its `tokenizers` JSON: no model hub)."""

    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.vocab_size = tokenizer.vocab_size
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self.lltok = llg.LLTokenizer(
            tokenizer.tk.to_str(), n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids) or None
        )

    @staticmethod
    def validate(spec: GrammarSpec) -> None:
        _checked(spec)

    def _compile(self, spec: GrammarSpec) -> LLGuidanceGrammar:
        m = llg.LLMatcher(self.lltok, _checked(spec), log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid {spec.kind}: {m.get_error().strip()}")
        return LLGuidanceGrammar(m, self.vocab_size, self.eos_token_ids)
