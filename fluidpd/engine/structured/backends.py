"""The grammar backends by name (`BACKENDS`, each imported when first asked for) and what the engine and the
server call: `validate` (does a spec compile) and `bound_backend` (one backend per tokenizer)."""

from __future__ import annotations

from collections.abc import Callable
from threading import Lock
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from fluidpd.core.registry import Registry
from fluidpd.engine.structured.backend import DEFAULT_BACKEND, StructuredBackend

if TYPE_CHECKING:
    from fluidpd.engine.structured.spec import GrammarSpec
    from fluidpd.engine.tokenizer import Tokenizer

BACKENDS: Registry[Callable[[], type[StructuredBackend]]] = Registry("structured-output backend")


@BACKENDS.register("llguidance")
def _llguidance() -> type[StructuredBackend]:
    from fluidpd.engine.structured.llguidance_backend import LLGuidanceBackend

    return LLGuidanceBackend


def backend_class(name: str = DEFAULT_BACKEND) -> type[StructuredBackend]:
    return BACKENDS.get(name)()


def validate(spec: GrammarSpec, backend: str = DEFAULT_BACKEND) -> None:
    """GrammarError naming what is wrong if `spec` does not compile (torch-free, cached)."""
    backend_class(backend).validate(spec)


def bound_backend(tokenizer: Tokenizer, name: str = DEFAULT_BACKEND, *, build: bool = True):
    """The backend `name` bound to `tokenizer`, built once per tokenizer (its vocabulary is read once);
    None if it is not built yet and `build` is false."""
    with _bound_lock:
        per = _bound.setdefault(tokenizer, {})
        if name not in per:
            if not build:
                return None
            per[name] = backend_class(name)(tokenizer)
        return per[name]


_bound: WeakKeyDictionary[Any, dict[str, StructuredBackend]] = WeakKeyDictionary()  # tokenizer -> name -> backend
_bound_lock = Lock()
