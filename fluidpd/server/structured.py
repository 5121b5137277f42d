"""A request's output constraint: OpenAI's `response_format`, vLLM's `structured_outputs` and its older
`guided_*` fields mapped onto one GrammarSpec, compiled here (torch-free, cached) so a bad one is a 400."""

from __future__ import annotations

import json
from typing import Any

from fluidpd.engine.structured.backend import GrammarError
from fluidpd.engine.structured.backends import validate
from fluidpd.engine.structured.spec import GrammarSpec
from fluidpd.server.errors import bad_request

STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's structured_outputs constraints
GUIDED = {  # vLLM's older top-level names
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_json_object": "json_object",
}


def structured_spec(req: Any) -> GrammarSpec | None:
    """The GrammarSpec `req` (a request body model) asks for, or None; a 400 naming the fields if it asks for
    more than one constraint, or for one that is malformed or does not compile."""
    found: list[tuple[str, str, Any]] = []  # (field as the client named it, kind, value)
    rf = getattr(req, "response_format", None)
    if rf is not None:
        found += _response_format(rf)
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request("structured_outputs must be an object", "structured_outputs")
        found += [(f"structured_outputs.{k}", k, so[k]) for k in STRUCTURED_KEYS if _set(k, so.get(k))]
    found += [(name, kind, getattr(req, name, None)) for name, kind in GUIDED.items()]
    found = [(name, kind, v) for name, kind, v in found if _set(kind, v)]
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(name for name, _, _ in found)
        raise bad_request(f"at most one output constraint per request, got {len(found)}: {names}", found[0][0])
    name, kind, value = found[0]
    return checked(_spec(name, kind, value), name)


def _set(kind: str, value: Any) -> bool:
    return value is not None and (value is not False if kind == "json_object" else True)


def _response_format(rf: Any) -> list[tuple[str, str, Any]]:
    if hasattr(rf, "model_dump"):
        rf = rf.model_dump(by_alias=True, exclude_none=True)
    if not isinstance(rf, dict):
        raise bad_request("response_format must be an object", "response_format")
    kind = rf.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_object", True)]
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request("response_format.json_schema must be an object", "response_format.json_schema")
        schema = js.get("schema", js.get("schema_"))
        if schema is None:
            raise bad_request("response_format.json_schema.schema is required", "response_format.json_schema")
        return [("response_format.json_schema", "json", schema)]
    raise bad_request(
        f"response_format.type must be one of text, json_object, json_schema, got {kind!r}", "response_format"
    )


def _spec(name: str, kind: str, value: Any) -> GrammarSpec:
    if kind == "json_object":
        if value is not True:
            raise bad_request(f"{name} must be true or false, got {value!r}", name)
        return GrammarSpec("json_object")
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise bad_request(f"{name} is not valid JSON: {exc}", name) from None
        if not isinstance(value, (dict, bool)):
            raise bad_request(f"{name} must be a JSON schema (an object), got {type(value).__name__}", name)
        return GrammarSpec("json", json.dumps(value, ensure_ascii=False))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise bad_request(f"{name} must be a non-empty list of strings", name)
        return GrammarSpec("choice", json.dumps(value, ensure_ascii=False))
    if not isinstance(value, str) or not value:
        raise bad_request(f"{name} must be a non-empty string", name)
    return GrammarSpec(kind, value)


def checked(spec: GrammarSpec, name: str) -> GrammarSpec:
    """`spec` once it compiles, or a 400 naming `name` (the field it came from)."""
    try:
        validate(spec)
    except GrammarError as exc:
        raise bad_request(f"{name}: {exc}", name) from None
    return spec
