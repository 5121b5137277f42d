"""Prompts as token ids: a completion prompt (text or ids), chat messages through the template."""

from __future__ import annotations

from fluidpd.server.errors import bad_request
from fluidpd.server.protocol import ChatMessage


def completion_prompt(tokenizer, prompt) -> list[int]:
    """The ids of a completions `prompt`: one text, one list of ids, or a list holding one of those."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request(f"only one prompt per request (got {len(prompt)}); send them separately", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        ids = check_token_ids(tokenizer, prompt, "prompt")
    if not ids:
        raise bad_request("prompt is empty", "prompt")
    return ids


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


def chat_prompt(tokenizer, messages: list[ChatMessage]) -> list[int]:
    """The ids of `messages` rendered by the model's chat template."""
    msgs = chat_messages(messages)
    try:
        return tokenizer.encode_chat(msgs)
    except Exception as exc:  # noqa: BLE001 - template errors are the client's message shape
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from None


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template wants them: role + text content."""
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
        out.append({"role": role, "content": text})
    return out
