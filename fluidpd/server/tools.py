"""Tool calling as vLLM's OpenAI server does it: the request's tools checked and normalised for the chat
template (`fluidpd.server.tool_choice`), the JSON Schema that tool_choice "required" or a named function
constrains the output to (here), and the tool calls read back from the output, whole or streamed as OpenAI
delta dicts (`fluidpd.server.tool_output`).

    tr = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls, state.config.tool_call_parser)
    ids = chat_prompt(tokenizer, body.messages, tr.tools)      # tools rendered (tool_choice "none" too)
    structured = tr.grammar()                                  # SamplingParams.structured, or None
    content, tool_calls = tr.calls_from_output(text)           # a whole response
    stream = tr.stream(); stream.feed(delta) / stream.finish() # SSE: lists of delta dicts
    finish_reason = tr.finish_reason(reason, bool(tool_calls) or stream.called)

Torch-free: the server process imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fluidpd.engine.structured.spec import GrammarSpec
from fluidpd.server.errors import bad_request
from fluidpd.server.tool_choice import check_tools
from fluidpd.server.tool_output import ToolCallStream, tool_calls_from_output
from fluidpd.server.tool_parsers import TOOL_PARSERS

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


# ---------------------------------------------------------------------- the grammar


def tool_schema(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None, parallel_tool_calls: bool = True
) -> dict[str, Any] | None:
    """The JSON Schema the output follows (vLLM's _get_json_schema_from_tool), or None (no constraint):
    "required": an array of {"name": one function, "parameters": its parameters} and no other key, at least
    one (at most one without parallel tool calls); a named function: its parameters (an empty object schema
    where it has none)."""
    tools, tool_choice = check_tools(tools, tool_choice)
    if tool_choice in ("none", "auto"):
        return None
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if isinstance(tool_choice, dict):
        return functions[tool_choice["function"]["name"]]["parameters"] or dict(_EMPTY_PARAMETERS)
    defs: dict[str, Any] = {}
    variants = []
    for fn in functions.values():
        params = dict(fn["parameters"] or _EMPTY_PARAMETERS)
        for name, schema in params.pop("$defs", {}).items():  # hoisted: "#/$defs/..." refs resolve at the root
            if name in defs and defs[name] != schema:
                raise bad_request(f"Tool definition {name!r} has multiple schemas, which is not supported.", "tools")
            defs[name] = schema
        variants.append(
            {
                "properties": {"name": {"type": "string", "enum": [fn["name"]]}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,  # (vLLM's leaves the call open to keys no parser reads)
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def tool_grammar(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None, parallel_tool_calls: bool = True
) -> GrammarSpec | None:
    """`tool_schema` as the grammar SamplingParams.structured takes, or None."""
    schema = tool_schema(tools, tool_choice, parallel_tool_calls)
    return None if schema is None else GrammarSpec("json", json.dumps(schema))


@dataclass(frozen=True)
class ToolRequest:
    """One chat request's tools, checked: what the template renders, the tool_choice in effect, the parser."""

    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool = True
    parser: str = "hermes"

    def grammar(self) -> GrammarSpec | None:
        return tool_grammar(self.tools, self.tool_choice, self.parallel_tool_calls)

    def calls_from_output(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        return tool_calls_from_output(text, self.tools, self.tool_choice, self.parser, self.parallel_tool_calls)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self.tools, self.tool_choice, self.parser, self.parallel_tool_calls)

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """vLLM's: "tool_calls" where "auto" called a tool, or "required" called and stopped; else `reason`."""
        if called and (self.tool_choice == "auto" or (self.tool_choice == "required" and reason == "stop")):
            return "tool_calls"
        return reason


def tool_request(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None = True,
    parser: str = "hermes",
) -> ToolRequest:
    """The checked ToolRequest of a chat request's fields (a 400 naming tools or tool_choice otherwise)."""
    tools, choice = check_tools(tools, tool_choice)
    parallel = parallel_tool_calls is not False
    if choice != "none":
        tool_schema(tools, choice, parallel)  # a 400 now for tools the grammar cannot hold
    TOOL_PARSERS.get(parser)  # a ValueError naming the parsers there are
    return ToolRequest(tools, choice, parallel, parser)
