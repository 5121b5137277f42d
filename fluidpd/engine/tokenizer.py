"""Tokenizer and chat template, offline: from GGUF metadata or a tokenizer.json directory."""

from __future__ import annotations

import copy
import json
import os
import re
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from fluidpd.engine.chat_template import compile_template, template_messages

if TYPE_CHECKING:
    from fluidpd.engine.gguf_file import GGUFFile

# GGUF tokenizer.ggml.pre -> the pre-tokenizer regex of the original tokenizer.json
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4
ENCODE_PIECE_CHARS = 1 << 16  # a longer text is encoded in pieces of about this many characters
_PIECE_CUT = re.compile(r"(?<=\S) (?=\S)")  # no pre-token spans a non-space and the space after it


class Tokenizer:
    """Encode/decode text and render the chat template (Hugging Face `tokenizers` underneath)."""

    def __init__(
        self,
        tk: HFTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos: bool,
        chat_template: str | None,
    ) -> None:
        self.tk = tk
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.tool_chat_template: str | None = None  # the model's "tool_use" template, rendered when tools are given
        self._compiled: dict[str, Any] = {}  # template source -> compiled jinja2 template
        self._split_ok: bool | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def load(cls, source: str) -> Tokenizer:
        if source.endswith(".gguf"):
            return cls.from_gguf(source)
        return cls.from_pretrained_dir(source)

    @classmethod
    def from_gguf(cls, path: str, reader: GGUFFile | None = None) -> Tokenizer:
        from fluidpd.engine.gguf_file import GGUFFile

        if reader is None and not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path!r}")
        get = (reader if reader is not None else GGUFFile(path)).fields.get
        kind = get("tokenizer.ggml.model")
        tokens = get("tokenizer.ggml.tokens")
        if not tokens:
            raise ValueError(f"{path!r} has no tokenizer in its metadata")
        types = get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if kind == "gpt2":
            tk = _bpe_tokenizer(tokens, get("tokenizer.ggml.merges") or [], get("tokenizer.ggml.pre", "default"))
        elif kind == "llama":
            tk = _spm_tokenizer(
                tokens,
                get("tokenizer.ggml.scores") or [0.0] * len(tokens),
                get("tokenizer.ggml.add_space_prefix", True),
            )
        else:
            raise ValueError(f"GGUF tokenizer model {kind!r} not supported (gpt2, llama)")
        _add_special(tk, tokens, types)
        bos = get("tokenizer.ggml.bos_token_id")
        eos = get("tokenizer.ggml.eos_token_id")
        tok = cls(
            tk,
            bos_token_id=bos,
            eos_token_ids=() if eos is None else (int(eos),),
            add_bos=bool(get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos is not None,
            chat_template=get("tokenizer.chat_template"),
        )
        tok.tool_chat_template = get("tokenizer.chat_template.tool_use")
        return tok

    @classmethod
    def from_pretrained_dir(cls, path: str) -> Tokenizer:
        file = path if path.endswith(".json") else os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"tokenizer.json not found: {file!r}")
        d = os.path.dirname(file)
        tk = HFTokenizer.from_file(file)
        cfg = _read_json(os.path.join(d, "tokenizer_config.json"))
        template = cfg.get("chat_template")
        jinja = os.path.join(d, "chat_template.jinja")
        if template is None and os.path.isfile(jinja):
            with open(jinja) as f:
                template = f.read()
        tool_template = None
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template, tool_template = named.get("default"), named.get("tool_use")
        bos, eos = _token_id(tk, cfg.get("bos_token")), _token_id(tk, cfg.get("eos_token"))
        # tokenizer.json's post-processor already adds BOS where the model wants it
        tok = cls(
            tk, bos_token_id=bos, eos_token_ids=() if eos is None else (eos,), add_bos=False, chat_template=template
        )
        tok.tool_chat_template = tool_template
        return tok

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer rendering chats with `template` instead of the model's own (vLLM's --chat-template)."""
        tok = copy.copy(self)
        tok.chat_template, tok.tool_chat_template, tok._compiled = template, None, {}
        return tok

    # ------------------------------------------------------------------ use
    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > ENCODE_PIECE_CHARS and self._splittable():
            ids = self._encode_pieces(text, add_special_tokens)
        else:
            ids = self.tk.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def _splittable(self) -> bool:
        """Byte-level BPE with no normalizer or post-processor and no added token holding a space:
        a text cut between a non-space and a space encodes as the concatenation of its pieces."""
        if self._split_ok is None:
            tk = self.tk
            added = tk.get_added_tokens_decoder().values()
            self._split_ok = (
                tk.normalizer is None
                and tk.post_processor is None
                and "ByteLevel" in repr(tk.pre_tokenizer)
                and not any(any(c.isspace() for c in t.content) for t in added)
            )
        return self._split_ok

    def _encode_pieces(self, text: str, add_special_tokens: bool) -> list[int]:
        """A long text in pieces of ~ENCODE_PIECE_CHARS, encoded off the GIL (encode_batch): the id
        lists come back piece by piece, so no single call holds the GIL for the whole text."""
        pieces, start = [], 0
        while start < len(text):
            cut = _PIECE_CUT.search(text, start + ENCODE_PIECE_CHARS)
            end = cut.start() if cut else len(text)
            pieces.append(text[start:end])
            start = end
        ids: list[int] = []
        for enc in self.tk.encode_batch(pieces, add_special_tokens=add_special_tokens):
            ids.extend(enc.ids)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_str(self, token_id: int) -> str | None:
        return self.tk.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` and `tools` (OpenAI tool dicts), rendered with jinja2 as transformers'
        apply_chat_template does: keys whose value is None are dropped from the messages, reasoning is
        aliased, and the template sees messages, tools, documents, add_generation_prompt and the special tokens."""
        source = self.tool_chat_template if tools is not None and self.tool_chat_template else self.chat_template
        if not source:
            raise ValueError("this tokenizer has no chat template")
        template = self._compiled.get(source)
        if template is None:
            template = self._compiled[source] = compile_template(source)
        tok = lambda i: self.tk.id_to_token(i) if i is not None else ""
        special = {
            "bos_token": tok(self.bos_token_id),
            "eos_token": tok(self.eos_token_ids[0] if self.eos_token_ids else None),
        }
        context = {"tools": tools, "documents": None, **special, **kwargs}
        return template.render(
            messages=template_messages(messages), add_generation_prompt=add_generation_prompt, **context
        )

    def encode_chat(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        # the template writes the special tokens itself (as transformers' apply_chat_template)
        return self.encode(self.apply_chat_template(messages, **kwargs), add_special_tokens=False)


# ---------------------------------------------------------------------- helpers


def _bpe_tokenizer(tokens: list[str], merges: list[str], pre: str) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre == "qwen2":
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre in ("smollm", "starcoder", "refact"):  # digits split one by one, then GPT-2's regex
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    return tk


def _spm_tokenizer(tokens: list[str], scores: list[float], add_space_prefix: bool) -> HFTokenizer:
    """SentencePiece BPE (Llama 2, Mistral) rebuilt as a `tokenizers` BPE: merges ranked by score."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        local = [
            (piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    unk = tokens[0] if tokens and tokens[0] == "<unk>" else None
    tk = HFTokenizer(
        models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges], unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    norm = [normalizers.Replace(" ", "\u2581")]
    if add_space_prefix:
        norm.insert(0, normalizers.Prepend("\u2581"))
    tk.normalizer = normalizers.Sequence(norm)
    tk.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1 if add_space_prefix else 0, 0),
        ]
    )
    return tk


def _add_special(tk: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    special = [
        AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if int(ty) == TOKEN_CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if int(ty) == TOKEN_USER_DEFINED
    ]
    if special:
        tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_id(tk: HFTokenizer, tok: Any) -> int | None:
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tk.token_to_id(tok) if isinstance(tok, str) else None
