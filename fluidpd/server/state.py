"""What the routes share: the runtime, the served model name and the server's metrics."""

from __future__ import annotations

import time

from fastapi import Request

from fluidpd.server.config import load_chat_template
from fluidpd.server.errors import APIError
from fluidpd.server.metrics import ServerMetrics


class ServerState:
    """The runtime behind the app and what the server keeps about it."""

    def __init__(self, runtime, config) -> None:
        self.runtime = runtime
        self.config = config  # ServeConfig
        self.tokenizer = runtime.tokenizer
        template = load_chat_template(getattr(config, "chat_template", None))
        if template is not None and self.tokenizer is not None:  # --chat-template: this server's prompts only
            self.tokenizer = self.tokenizer.with_chat_template(template)
        self.model_name: str = runtime.model_name
        self.metrics = ServerMetrics(runtime, self.model_name)
        self.created = int(time.time())
        self.token_bytes = _longest_token_bytes(self.tokenizer)

    def check_prompt_fits(self, texts: list[str], param: str) -> None:
        """A 400 before tokenising when `texts` cannot fit max_model_len whatever they encode to:
        every token covers at most `token_bytes` bytes (byte-level BPE without a normalizer)."""
        if not self.token_bytes:
            return
        fewest = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) // self.token_bytes
        limit = self.runtime.max_model_len
        if fewest > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt has at "
                f"least {fewest} tokens. Please reduce the length of the prompt.",
                param=param,
                code="context_length_exceeded",
            )

    def model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "fluidpd",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.runtime.max_model_len,
        }

    def check_model(self, name: str | None) -> None:
        """Accept exactly the served name (or none), else 404 model_not_found as vLLM does."""
        if name is None or name == self.model_name:
            return
        raise APIError(
            404,
            f"The model `{name}` does not exist. This server serves `{self.model_name}`.",
            "not_found_error",
            "model",
            "model_not_found",
        )


def _longest_token_bytes(tokenizer) -> int:
    """Bytes of text the longest token stands for (0: no such bound, e.g. a normalizer rewrites text)."""
    tk = getattr(tokenizer, "tk", None)
    if tk is None or tk.normalizer is not None or "ByteLevel" not in repr(tk.pre_tokenizer):
        return 0
    return max(len(tk.id_to_token(i) or "") for i in range(tk.get_vocab_size()))


def server_state(request: Request) -> ServerState:
    """A FastAPI dependency: the app's ServerState."""
    return request.app.state.server
