"""Tool calling as vLLM's OpenAI server does it: the request's tools checked and normalised for the chat
template, the JSON Schema that tool_choice "required" or a named function constrains the output to, and
the tool calls read back from the output, whole or streamed as OpenAI delta dicts.

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
import re
from dataclasses import dataclass
from typing import Any

from fluidpd.engine.structured.spec import GrammarSpec
from fluidpd.server.errors import bad_request
from fluidpd.server.tool_parsers import TOOL_PARSERS, call_delta, call_id, dumps, make_parser, tool_call

CHOICES = ("none", "auto", "required")
_FUNCTION_FIELDS = ("name", "description", "parameters")  # vLLM's FunctionDefinition, in its order
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


# ---------------------------------------------------------------------- the request


def check_tools(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any]]:
    """The tools as the chat template gets them (vLLM's model_dump: {"type", "function": {"name",
    "description", "parameters", ...}}, None where absent) and the tool_choice in effect ("auto" when tools
    are given without one, else "none"); a 400 naming `tools` or `tool_choice` for a request vLLM refuses."""
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("tools must be a list of {'type': 'function', 'function': {...}}", "tools")
        tools = [_tool(t, i) for i, t in enumerate(tools)]
    if tool_choice is None:
        return tools, "auto" if tools else "none"
    if tool_choice == "none":
        return tools, "none"
    if tools is None:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise bad_request(
                f"Invalid value for `tool_choice`: {tool_choice!r}! Only named tools, 'none', 'auto' or 'required' "
                "are supported.",
                "tool_choice",
            )
        if tool_choice == "required" and not tools:  # as OpenAI: nothing to call is no call
            return None, "none"
        return tools, tool_choice
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    if not isinstance(tool_choice, dict):
        raise bad_request(f"Invalid value for `tool_choice`: {tool_choice!r}! {usage}", "tool_choice")
    if tool_choice.get("type", "function") != "function":
        raise bad_request(
            f"tool_choice type must be 'function', got {tool_choice.get('type')!r}. {usage}", "tool_choice"
        )
    fn = tool_choice.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"Invalid value for `function` in `tool_choice`: {fn!r}! {usage}", "tool_choice")
    if fn["name"] not in {t["function"]["name"] for t in tools}:
        raise bad_request(
            f"The tool specified in `tool_choice` ({fn['name']!r}) does not match any of the specified `tools`",
            "tool_choice",
        )
    return tools, {"type": "function", "function": {"name": fn["name"]}}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"{where} must be an object {{'type': 'function', 'function': {{...}}}}", "tools")
    if tool.get("type", "function") != "function":
        raise bad_request(f"{where}.type must be 'function', got {tool.get('type')!r}", "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{where}.function must be an object with a name", "tools")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where}.function.name must be a non-empty string", "tools")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise bad_request(f"{where}.function.description must be a string", "tools")
    if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
        raise bad_request(f"{where}.function.parameters must be a JSON Schema object", "tools")
    function = {k: fn.get(k) for k in _FUNCTION_FIELDS} | {k: v for k, v in fn.items() if k not in _FUNCTION_FIELDS}
    extra = {k: v for k, v in tool.items() if k not in ("type", "function")}
    return {"type": "function", "function": function, **extra}


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


# ---------------------------------------------------------------------- the output


def tool_calls_from_output(
    text: str,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parser: str = "hermes",
    parallel_tool_calls: bool = True,
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole output as vLLM answers it: "none" (or no tools): the text, no calls;
    "auto": what the parser reads; "required": the JSON array's calls, content ""; a named function: one call
    whose arguments are the text, content "". Without parallel tool calls, at most the first call."""
    tools, tool_choice = check_tools(tools, tool_choice)
    if tool_choice == "none":
        return text, []
    if isinstance(tool_choice, dict):
        return "", [tool_call(tool_choice["function"]["name"], text)]
    if tool_choice == "required":
        calls = _required_calls(text)
        content, calls = (text, []) if calls is None else ("", calls)
    else:
        content, calls = make_parser(parser).parse(text)
    return content, calls if parallel_tool_calls else calls[:1]


def _required_calls(text: str) -> list[dict[str, Any]] | None:
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if not isinstance(items, list) or not all(_is_item(x) for x in items):
        return None
    return [tool_call(x["name"], dumps(x.get("parameters", {}))) for x in items]


def _is_item(x: Any) -> bool:
    return isinstance(x, dict) and isinstance(x.get("name"), str)


class ToolCallStream:
    """One response's output text as OpenAI stream deltas under its tool_choice: `feed` each new piece of
    text and `finish` at the end; each returns a list of delta dicts ({"content": ...} or {"tool_calls": [...]}),
    whose concatenation matches `tool_calls_from_output` of the whole text (ids aside)."""

    def __init__(
        self,
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None,
        parser: str = "hermes",
        parallel_tool_calls: bool = True,
    ) -> None:
        tools, self.choice = check_tools(tools, tool_choice)
        self.parallel = parallel_tool_calls
        self.parser = make_parser(parser) if self.choice == "auto" else None
        self.called = False  # whether a tool call was sent
        self._text = ""
        self._pos = 0  # "required": where the next array item starts
        self._opened = False  # "required": past the array's "["
        self._sent = 0  # "required": items sent
        self._id = call_id()

    def feed(self, delta: str) -> list[dict[str, Any]]:
        if self.choice == "none":
            return [{"content": delta}] if delta else []
        if self.parser is not None:
            return self._keep(self.parser.feed(delta))
        if isinstance(self.choice, dict):
            return self._named(delta)
        self._text += delta
        return self._required(final=False)

    def finish(self) -> list[dict[str, Any]]:
        if self.parser is not None:
            return self._keep(self.parser.finish())
        if isinstance(self.choice, dict) and not self.called:
            return self._named("", force=True)
        if self.choice == "required":
            return self._required(final=True)
        return []

    def _keep(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.parallel:
            deltas = [d for d in deltas if "tool_calls" not in d or d["tool_calls"][0]["index"] == 0]
        self.called = self.called or any("tool_calls" in d for d in deltas)
        return deltas

    def _named(self, delta: str, force: bool = False) -> list[dict[str, Any]]:
        if not delta and not force:
            return []
        if self.called:
            return [call_delta(0, {"arguments": delta})]
        self.called = True
        return [call_delta(0, {"name": self.choice["function"]["name"], "arguments": delta}, self._id)]

    def _required(self, final: bool) -> list[dict[str, Any]]:
        """Each item of the JSON array as one call delta once it is complete; at the end, if the text is not
        such an array and nothing was sent, the text as content (as tool_calls_from_output)."""
        out = []
        text = self._text
        while True:
            i = _WS.match(text, self._pos).end()
            if i >= len(text):
                break
            if not self._opened:
                if text[i] != "[":
                    break
                self._opened, self._pos = True, i + 1
                continue
            if self._sent:  # the next item comes after a comma
                if text[i] != ",":
                    break
                i = _WS.match(text, i + 1).end()
            try:
                item, end = _DECODER.raw_decode(text, i)
            except ValueError:
                break  # not complete yet (or not JSON: finish tells)
            if not _is_item(item):
                break
            self._pos = end
            if self.parallel or not self._sent:
                function = {"name": item["name"], "arguments": dumps(item.get("parameters", {}))}
                out.append(call_delta(self._sent, function, call_id()))
            self._sent += 1
            self.called = True
        if final and not self.called and text and _required_calls(text) is None:
            out.append({"content": text})
        return out


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
