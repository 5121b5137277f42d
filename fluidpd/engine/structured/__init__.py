"""Structured outputs: a request's output constrained by a grammar (JSON Schema, regex, choice, Lark/GBNF)."""

from fluidpd.engine.structured.spec import KINDS, GrammarSpec

__all__ = ["KINDS", "GrammarSpec"]
