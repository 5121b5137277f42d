"""The response bodies of one OpenAI request: its choices (prompt i, sample j -> index i * n + j), as SSE
chunks while they stream or as one JSON body, with usage counting each prompt once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fluidpd.server.output import ChoiceOutput
from fluidpd.server.tool_output import ToolCallStream
from fluidpd.server.tools import ToolRequest


@dataclass
class PromptIn:
    """One prompt of a request: its token ids, and the text an echo shows (completions)."""

    ids: list[int]
    echo_text: str | None = None  # None: no echo


@dataclass
class Reply:
    """Every choice of one request and the bodies that carry them."""

    rid: str
    created: int
    model: str
    chat: bool
    prompts: list[PromptIn]
    choices: list[ChoiceOutput]
    n: int
    include_usage: bool = False
    per_token: bool = False
    return_token_ids: bool = False
    cached: list[int] = field(default_factory=list)  # per prompt: tokens its prefill took from the cache
    prompt_logprobs: list[list | None] = field(default_factory=list)  # per prompt, once its first event came
    started: set[int] = field(default_factory=set)  # choices whose first chunk went out
    tools: ToolRequest | None = None  # chat with tools: tool calls read back from each choice's text
    tool_streams: list[ToolCallStream] = field(default_factory=list)  # per choice, while streaming

    def __post_init__(self) -> None:
        self.cached = [0] * len(self.prompts)
        self.prompt_logprobs = [None] * len(self.prompts)
        if self.tools is not None:
            self.tool_streams = [self.tools.stream() for _ in self.choices]

    def tool_chunks(self, index: int, text: str, finish: str | None, logprobs, token_ids) -> list[str]:
        """A chat choice's chunks when tools are on: its text as content and tool-call deltas (the parser
        holds a call's text back), the last one with the finish reason OpenAI gives a call."""
        stream = self.tool_streams[index]
        deltas = stream.feed(text) if text else []
        if finish is not None:
            deltas += stream.finish()
            finish = self.tools.finish_reason(finish, stream.called)  # type: ignore[union-attr]
        out = [self._sse([{"index": index, "delta": d, "logprobs": None, "finish_reason": None}], None) for d in deltas]
        if finish is not None or logprobs is not None or (self.return_token_ids and token_ids):
            choice = {"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": finish}
            if self.return_token_ids and token_ids is not None:
                choice["token_ids"] = token_ids
            out.append(self._sse([choice], None))
        return out

    @property
    def obj(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def head(self, index: int) -> tuple[str, dict | None]:
        """What a choice's first chunk leads with: the echoed prompt and its logprobs (completions)."""
        self.started.add(index)
        p = self.prompts[index // self.n]
        if p.echo_text is None:
            return "", None
        out = self.choices[index]
        plps = self.prompt_logprobs[index // self.n]
        return p.echo_text, out.prompt_token_logprobs(p.ids, plps) if out.wants_logprobs else None

    # ------------------------------------------------------------------ streaming
    def chunk(self, index: int, text: str | None, finish: str | None, logprobs=None, token_ids=None) -> str:
        if self.chat:
            delta: dict[str, Any] = {"content": text} if text else {}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if self.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return self._sse([choice], None)

    def role_chunks(self) -> list[str]:
        return [
            self._sse(
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
                None,
            )
            for i in range(len(self.choices))
        ]

    def usage_chunk(self) -> str:
        return self._sse([], self.usage())

    def _sse(self, choices: list, usage: dict | None) -> str:
        body = {
            "id": self.rid,
            "object": self.obj + ("" if not self.chat else ".chunk"),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return sse_line(body)

    # ------------------------------------------------------------------ whole
    def final(self) -> dict:
        choices = []
        for i, out in enumerate(self.choices):
            text, head_lp = self.head(i)  # (first: the echoed prompt's offsets lead)
            lp = out.logprobs(out.all_logprobs) if out.all_logprobs is not None else None
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": out.text}
                finish = out.finish_reason
                if self.tools is not None:
                    message["content"], calls = self.tools.calls_from_output(out.text)
                    if calls:
                        message["tool_calls"] = calls
                    finish = self.tools.finish_reason(finish, bool(calls))
                choice: dict[str, Any] = {"index": i, "message": message, "logprobs": lp, "finish_reason": finish}
            else:
                if head_lp is not None:
                    lp = merge_logprobs(head_lp, lp)
                choice = {"index": i, "text": text + out.text, "logprobs": lp, "finish_reason": out.finish_reason}
                if out.params.prompt_logprobs is not None and self.prompt_logprobs[i // self.n] is not None:
                    choice["prompt_logprobs"] = out.vllm_prompt_logprobs(
                        self.prompts[i // self.n].ids, self.prompt_logprobs[i // self.n]
                    )
            if self.return_token_ids:
                choice["token_ids"] = list(out.token_ids)
            choices.append(choice)
        body = {
            "id": self.rid,
            "object": self.obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }
        return body

    def usage(self) -> dict:
        prompt = sum(len(p.ids) for p in self.prompts)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(self.cached)},
        }


def merge_logprobs(head: dict, tail: dict | None) -> dict:
    """Completions logprobs of the echoed prompt followed by the output's (offsets run on)."""
    if tail is None:
        return head
    return {k: head[k] + tail[k] for k in head}


def sse_line(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
