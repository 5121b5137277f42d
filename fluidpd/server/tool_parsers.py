"""Tool-call parsers by name (`TOOL_PARSERS`, `--tool-call-parser`): tool calls read from a model's free
output (tool_choice "auto"), whole or streamed as OpenAI delta dicts. Torch-free."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fluidpd.core.registry import Registry


def call_id() -> str:
    """A new tool call id, in OpenAI's form."""
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call(name: str, arguments: str, id: str | None = None) -> dict[str, Any]:
    """One entry of a message's `tool_calls`: `arguments` is a JSON text."""
    return {"id": id or call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class ToolParser:
    """Tool calls in a model's free output (tool_choice "auto"): `parse` a whole text, or `feed` it in
    pieces and `finish`, which give OpenAI delta dicts ({"content": ...} or {"tool_calls": [...]})."""

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of a whole output; no calls: the whole text is the content."""
        raise NotImplementedError

    def feed(self, delta: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def finish(self) -> list[dict[str, Any]]:
        raise NotImplementedError


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool call parser")


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag` (held back until the next piece)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


@TOOL_PARSERS.register("hermes")
class HermesToolParser(ToolParser):
    """vLLM's "hermes" parser (Hermes 2 Pro, Qwen 2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    blocks, the last one possibly unclosed; the text before the first is the content, the rest is dropped.
    Streamed, each call comes whole in one delta once its block closes (so a block that turns out not to be
    JSON was never shown as a call), and the text from the first `<tool_call>` on is never content."""

    START, END = "<tool_call>", "</tool_call>"
    CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def __init__(self) -> None:
        self._buf = ""  # text not yet shown or parsed
        self._rest = ""  # everything from the first <tool_call> on (the content if no call parses)
        self._started = self._in_call = self._broken = False
        self._index = 0  # calls sent so far

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        if self.START not in text:
            return text, []
        try:
            calls = [self._call(json.loads(a or b)) for a, b in self.CALLS.findall(text)]
        except (ValueError, TypeError, KeyError):
            return text, []
        return text[: text.find(self.START)] or None, [tool_call(n, a) for n, a in calls]

    @staticmethod
    def _call(obj: Any) -> tuple[str, str]:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise TypeError("a tool call is {'name': ..., 'arguments': {...}}")
        return obj["name"], dumps(obj.get("arguments", {}))

    def feed(self, delta: str) -> list[dict[str, Any]]:
        if self._started:
            self._rest += delta
        self._buf += delta
        out: list[dict[str, Any]] = []
        while True:
            if not self._in_call:
                i = self._buf.find(self.START)
                if i < 0:
                    keep = _held(self._buf, self.START)
                    shown, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                    if shown and not self._started:
                        out.append({"content": shown})
                    break
                if not self._started:
                    if i:
                        out.append({"content": self._buf[:i]})
                    self._started, self._rest = True, self._buf[i:]
                self._buf = self._buf[i + len(self.START) :]
                self._in_call = True
                continue
            j = self._buf.find(self.END)
            if j < 0:
                break
            body, self._buf = self._buf[:j], self._buf[j + len(self.END) :]
            self._in_call = False
            out += self._close(body)
        return out

    def _close(self, body: str) -> list[dict[str, Any]]:
        if self._broken:
            return []
        try:
            name, args = self._call(json.loads(body))
        except (ValueError, TypeError):
            self._broken = True  # as parse: no call is read from this output
            return []
        self._index += 1
        return [call_delta(self._index - 1, {"name": name, "arguments": args}, call_id())]

    def finish(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._in_call:  # an unclosed last block
            out += self._close(self._buf)
        elif not self._started and self._buf:
            out.append({"content": self._buf})
        self._buf, self._in_call = "", False
        if self._broken and not self._index:  # nothing sent as a call: all of it is content
            out = [{"content": self._rest}] if self._rest else []
        return out


def call_delta(index: int, function: dict[str, str], id: str | None = None) -> dict[str, Any]:
    head = {"index": index} if id is None else {"index": index, "id": id, "type": "function"}
    return {"tool_calls": [{**head, "function": function}]}


def make_parser(name: str) -> ToolParser:
    """A fresh parser (one per request: it keeps the stream's state)."""
    return TOOL_PARSERS.build(name)
