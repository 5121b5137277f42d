"""A chat request's tools and tool_choice checked as vLLM's OpenAI server checks them, and normalised for
the chat template (torch-free: the server process imports it)."""

from __future__ import annotations

from typing import Any

from fluidpd.server.errors import bad_request

CHOICES = ("none", "auto", "required")
_FUNCTION_FIELDS = ("name", "description", "parameters")  # vLLM's FunctionDefinition, in its order


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
