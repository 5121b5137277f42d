"""The tool calls read back from a response's output under its tool_choice, as vLLM answers them: from
the whole text (`tool_calls_from_output`) or streamed as OpenAI delta dicts (`ToolCallStream`).
Torch-free: the server process imports it."""

from __future__ import annotations

import json
import re
from typing import Any

from fluidpd.server.tool_choice import check_tools
from fluidpd.server.tool_parsers import call_delta, call_id, dumps, make_parser, tool_call

_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


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
