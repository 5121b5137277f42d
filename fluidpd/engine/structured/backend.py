"""The grammar-engine interface (as vLLM's structured_output backend_types): a backend registered by name
compiles a GrammarSpec once per tokenizer, and each sequence walks the compiled grammar with its own matcher.
Torch-free: the server validates grammars with a backend without loading the engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable
from threading import Lock
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fluidpd.engine.structured.spec import GrammarSpec
    from fluidpd.engine.tokenizer import Tokenizer

DEFAULT_BACKEND = "llguidance"
COMPILE_CACHE_SIZE = 256  # compiled grammars kept per backend (LRU by GrammarSpec)


class GrammarError(ValueError):
    """A grammar that does not compile, or tokens that do not follow it; the message says what is wrong."""


class GrammarMatcher(ABC):
    """One sequence's position in a compiled grammar."""

    @abstractmethod
    def mask(self, row: torch.Tensor) -> torch.Tensor:
        """`row` (the float32 [vocab] logits of the next token) with every token the grammar refuses at -inf;
        once the grammar is complete, only EOS is left."""

    @abstractmethod
    def accept(self, token: int) -> None:
        """Advance by `token`; a token the grammar refuses terminates the matcher (`error` says why)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has ended (EOS accepted after a complete output, or a refused token)."""

    error: str | None = None

    def replay(self, tokens: Iterable[int]) -> None:
        """Advance by already generated `tokens` (a sequence arriving by hand-off or migration); GrammarError
        if they do not follow the grammar."""
        for t in tokens:
            self.accept(t)
            if self.error is not None:
                raise GrammarError(f"the output so far does not follow the grammar: {self.error}")


class CompiledGrammar(ABC):
    """A GrammarSpec compiled for one backend and tokenizer; makes the matchers of the sequences that follow it."""

    @abstractmethod
    def matcher(self, eos_token_ids: Iterable[int] = ()) -> GrammarMatcher:
        """A matcher at the start of the grammar; `eos_token_ids` end it once the grammar is complete."""


class StructuredBackend(ABC):
    """A grammar engine bound to one tokenizer, with an LRU cache of compiled grammars keyed by GrammarSpec."""

    name = ""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._lock = Lock()

    @staticmethod
    @abstractmethod
    def validate(spec: GrammarSpec) -> None:
        """GrammarError naming what is wrong if `spec` does not compile (no tokenizer needed)."""

    @abstractmethod
    def _compile(self, spec: GrammarSpec) -> CompiledGrammar: ...

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """`spec` compiled (cached); GrammarError if it does not compile."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > COMPILE_CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def cached(self, spec: GrammarSpec) -> bool:
        with self._lock:
            return spec in self._cache

    def matcher(self, spec: GrammarSpec, tokens: Iterable[int] = (), eos_token_ids: Iterable[int] = ()):
        """A matcher for `spec` that has accepted `tokens` (GrammarError if they do not follow it)."""
        m = self.compile(spec).matcher(eos_token_ids)
        m.replay(tokens)
        return m
