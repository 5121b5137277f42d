"""What a request's output must follow (`GrammarSpec`): torch-free, so the server builds it without the engine."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar the output follows: `kind` is "json" (a JSON Schema, as JSON text), "json_object"
    (any JSON object; `value` unused), "regex", "choice" (a JSON list of the allowed strings) or
    "grammar" (Lark or GBNF/EBNF text). Frozen: it keys the compiled-grammar cache."""

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
