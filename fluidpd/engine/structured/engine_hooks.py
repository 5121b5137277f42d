"""The engine's side of structured outputs: a request's grammar checked at admission, compiled off the decode
step on a small thread pool (cached by GrammarSpec), and its matcher handed to the sequence's DecodingState,
which waits for the compile only when it first masks. A sequence arriving with output (hand-off, migration)
gets its matcher rebuilt by replaying its output tokens."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from fluidpd.engine.structured.backend import DEFAULT_BACKEND, CompiledGrammar, GrammarError, GrammarMatcher
from fluidpd.engine.structured.backends import backend_class, bound_backend
from fluidpd.engine.structured.spec import GrammarSpec

if TYPE_CHECKING:
    import torch

    from fluidpd.engine.decoding_state import DecodingState
    from fluidpd.engine.sequence import Sequence
    from fluidpd.engine.tokenizer import Tokenizer

COMPILE_THREADS = 2
_pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="fluidpd-grammar")


def attach_grammar(tokenizer: Tokenizer | None, seq: Sequence, *, replay: bool = False) -> None:
    """Give `seq`'s decoding state the matcher of its grammar, if it has one. ValueError (GrammarError) naming
    what is wrong if the grammar does not compile or, with `replay`, the output so far does not follow it."""
    spec = seq.params.structured
    if spec is None or seq.state is None:
        return
    if not isinstance(spec, GrammarSpec):
        raise ValueError(f"structured must be a GrammarSpec, got {type(spec).__name__}")
    if tokenizer is None:
        raise ValueError("structured outputs need the engine's tokenizer")
    backend_class(DEFAULT_BACKEND).validate(spec)  # no tokenizer needed, cached: the error is this call's
    state, eos = seq.state, seq.state.eos_token_ids
    if replay:
        state.matcher = bound_backend(tokenizer).matcher(spec, seq.output_token_ids, eos)
        return
    backend = bound_backend(tokenizer, build=False)
    if backend is not None and backend.cached(spec):
        state.matcher = backend.compile(spec).matcher(eos)
    else:
        state.matcher = PendingMatcher(state, _pool.submit(lambda: bound_backend(tokenizer).compile(spec)))


class PendingMatcher(GrammarMatcher):
    """A matcher whose grammar is still compiling: the first use waits for it, replays the output so far
    and puts the real matcher in the decoding state."""

    def __init__(self, state: DecodingState, compiled: Future[CompiledGrammar]) -> None:
        self.state, self.compiled = state, compiled

    def _resolve(self, skip_last: bool = False) -> GrammarMatcher:
        out = self.state.token_ids[self.state.prompt_len :]
        try:
            m = self.compiled.result().matcher(self.state.eos_token_ids)
            m.replay(out[:-1] if skip_last else out)
        except GrammarError as exc:  # checked at admission: only a tokenizer-level failure lands here
            m = EndedMatcher(self.state.eos_token_ids, str(exc))
        self.state.matcher = m
        return m

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        return self._resolve().mask(row)

    def accept(self, token: int) -> None:
        self._resolve(skip_last=True).accept(token)  # the token is already among the sequence's tokens

    def is_terminated(self) -> bool:
        return self._resolve().is_terminated()


class EndedMatcher(GrammarMatcher):
    """The matcher of a grammar that failed after admission: EOS only, so the sequence stops."""

    def __init__(self, eos_token_ids, error: str) -> None:
        self.eos, self.error = list(eos_token_ids), error

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        keep = row[self.eos].clone()
        row.fill_(float("-inf"))
        row[self.eos] = keep
        return row

    def accept(self, token: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return True
