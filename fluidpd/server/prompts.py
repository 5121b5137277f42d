"""Prompts as token ids: a completion prompt (text or ids), chat messages through the template."""

from __future__ import annotations

import json
from typing import Any

from fluidpd.server.errors import bad_request
from fluidpd.server.protocol import ChatMessage


def completion_prompts(tokenizer, prompt) -> list[list[int]]:
    """The ids of each prompt of a completions `prompt`: one text or list of ids, or a batch of either."""
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
    out = []
    for i, p in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt[{i}]"
        ids = tokenizer.encode(p) if isinstance(p, str) else check_token_ids(tokenizer, p, param)
        if not ids:
            raise bad_request(f"{param} is empty", "prompt")
        out.append(ids)
    return out


def check_token_ids(tokenizer, ids: list[int], param: str) -> list[int]:
    """`ids`, or a 400 naming the first id outside the tokenizer's vocabulary."""
    vocab = tokenizer.vocab_size
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(
            f"{param}[{bad}] = {ids[bad]} is not a token id: the vocabulary has {vocab} tokens (ids 0 to {vocab - 1})",
            param,
        )
    return list(ids)


TEMPLATE_RESERVED = ("messages", "tools", "documents", "add_generation_prompt")  # set by the request itself


def chat_prompt(
    tokenizer, messages: list[ChatMessage], tools: list[dict] | None = None, template_kwargs: dict | None = None
) -> list[int]:
    """The ids of `messages` (and `tools`, OpenAI tool dicts, where given) rendered by the model's chat template,
    with `template_kwargs` (the request's chat_template_kwargs, e.g. Qwen3's enable_thinking) as more variables."""
    msgs = chat_messages(messages)
    extra = dict(template_kwargs or {})
    if clash := [k for k in TEMPLATE_RESERVED if k in extra]:
        raise bad_request(f"chat_template_kwargs cannot set {', '.join(clash)}", "chat_template_kwargs")
    try:
        return tokenizer.encode_chat(msgs, **({} if tools is None else {"tools": tools}), **extra)
    except Exception as exc:  # noqa: BLE001 - template errors are the client's message shape
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template wants them (as vLLM hands them to transformers): role, text content, and
    an assistant's tool_calls (each call's arguments parsed to a dict) and reasoning_content, a tool result's
    tool_call_id, a name."""
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}]: only text content parts are supported", "messages")
                parts.append(part["text"])
            text = "\n".join(parts)
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": text}
        if role == "assistant" and m.tool_calls is not None:
            msg["tool_calls"] = [
                _template_tool_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)
            ]
        reasoning = (m.model_extra or {}).get("reasoning_content", (m.model_extra or {}).get("reasoning"))
        if role == "assistant" and isinstance(reasoning, str):  # a reasoning model's earlier thinking
            msg["reasoning_content"] = reasoning
        if role == "tool" and m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def _template_tool_call(call: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of an assistant's tool call with its function's JSON arguments as a dict (vLLM: none or "" is {})."""
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(
            f"{where}: a tool call is {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}", "messages"
        )
    args = fn.get("arguments")
    if not args:
        args = {}
    elif not isinstance(args, (dict, list)):
        try:
            args = json.loads(args)
        except (TypeError, ValueError):
            raise bad_request(f"{where}.function.arguments is not JSON: {args!r:.200}", "messages") from None
    return {**call, "function": {**fn, "arguments": args}}
