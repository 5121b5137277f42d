"""Where replayed sessions come from: the chat generator (`chat`) or a trace that carries sessions."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from fluidpd.core.knobs import knob
from fluidpd.workload.sessions import chat_sessions
from fluidpd.workload.trace import Trace

CHAT = "chat"
_DEFAULT = {k: p.default for k, p in inspect.signature(chat_sessions).parameters.items()}


@dataclass
class ChatSessionsConfig:
    """The generated chat sessions (`--sessions chat`): turns over a shared system prompt."""

    turns: int = knob(_DEFAULT["turns"], "chat: turns per session")
    system_tokens: int = knob(_DEFAULT["system_tokens"], "chat: tokens of the shared system prompt")
    new_tokens: int = knob(_DEFAULT["new_tokens"], "chat: new input tokens per turn")
    output_tokens: int = knob(_DEFAULT["output_tokens"], "chat: answer tokens per turn")
    think_time_s: float = knob(
        _DEFAULT["think_time_s"], "chat: mean think time before a later turn, seconds", flag="--think-time"
    )
    system_prompts: int = knob(_DEFAULT["groups"], "chat: distinct system prompts (session i uses i mod N)")
    start_spread_s: float = knob(
        _DEFAULT["start_spread_s"], "chat: session starts uniform over this many seconds", flag="--start-spread"
    )

    def trace(self, n_sessions: int, seed: int) -> Trace:
        return chat_sessions(
            n_sessions,
            self.turns,
            self.system_tokens,
            self.new_tokens,
            self.output_tokens,
            self.think_time_s,
            groups=self.system_prompts,
            start_spread_s=self.start_spread_s,
            seed=seed,
        )


def session_trace(source: str, chat: ChatSessionsConfig, n_sessions: int, seed: int, /, **options) -> Trace:
    """`chat`: generated sessions; otherwise a named trace (loaded as sessions: SESSION_OPTIONS, with
    its loader's `options`, e.g. the datacenter generator's) or a file, which must carry sessions."""
    if source == CHAT:
        return chat.trace(n_sessions, seed)
    from fluidpd.workload.registry import SESSION_OPTIONS, TRACES, load_trace, session_options

    if source in TRACES and source not in SESSION_OPTIONS:
        raise ValueError(
            f"trace {source!r} carries no sessions; these do: {', '.join([CHAT, *SESSION_OPTIONS])} "
            f"(or replay it open loop with --trace)"
        )
    trace = load_trace(source, seed=seed, **(session_options(source) if source in SESSION_OPTIONS else {}), **options)
    if not trace.has_sessions:
        raise ValueError(
            f"trace {source!r} carries no sessions (session ids and think times); "
            f"replay it open loop with --trace, or use --sessions {CHAT}"
        )
    return trace
