"""The model's own chat template, from a GGUF's `tokenizer.chat_template` or tokenizer_config.json's
`chat_template`, rendered as transformers' apply_chat_template renders it: Qwen3's (tests/server/data, as
Qwen3-0.6B ships it), with tools, tool calls, tool results, reasoning and `enable_thinking`."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from fluidpd.engine import EngineConfig
from fluidpd.engine.loaders import smollm2_gguf
from fluidpd.engine.model_source import load_tokenizer
from fluidpd.engine.tokenizer import Tokenizer
from fluidpd.server.errors import APIError
from fluidpd.server.prompts import chat_messages, chat_prompt
from fluidpd.server.protocol import ChatMessage

QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in São Paulo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "SP"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "<think>\nMild.\n</think>\n\n21 °C."},
    {"role": "user", "content": "And Lima?"},
]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """One tiny vocabulary shipped twice with Qwen3's template: a GGUF's metadata, a tokenizer.json directory."""
    d = tmp_path_factory.mktemp("qwen3")
    vocab = [*SPECIAL, "a", "b"]
    w = gguf.GGUFWriter(str(d / "m.gguf"), "qwen3")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab)
    w.add_token_types([3, 3, 3, 1, 1])  # the specials are control tokens
    w.add_token_merges([])
    w.add_eos_token_id(2)
    w.add_chat_template(QWEN3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (d / "hf").mkdir()
    HFTokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="a")).save(str(d / "hf/tokenizer.json"))
    config = {"chat_template": QWEN3, "eos_token": "<|im_end|>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (d / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_the_template_is_the_models_own(model_files):
    assert load_tokenizer(EngineConfig(model=str(model_files / "m.gguf"))).chat_template == QWEN3
    assert Tokenizer.load(str(model_files / "hf")).chat_template == QWEN3


@pytest.mark.parametrize("source", ["m.gguf", "hf"])
@pytest.mark.parametrize(
    "turns, kwargs",
    [
        (6, {}),  # a finished tool round trip, then a new question: earlier reasoning dropped
        (4, {}),  # mid tool loop: the call's turn is after the last query
        (6, {"enable_thinking": False}),  # the empty think block after the generation prompt
        (2, {"add_generation_prompt": False}),
    ],
)
def test_qwen3_renders_as_transformers_with_tools(model_files, source, turns, kwargs):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(model_files / "hf"))
    ours = Tokenizer.load(str(model_files / source))
    msgs = chat_messages([ChatMessage(**m) for m in CONVERSATION[:turns]])  # as the server hands them over
    reasoning = [{**m, "reasoning_content": "Call the tool."} if i == 2 else m for i, m in enumerate(msgs)]
    for messages in (msgs, reasoning):
        expect = theirs.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, **{"add_generation_prompt": True, **kwargs}
        )
        assert ours.apply_chat_template(messages, tools=TOOLS, **kwargs) == expect
        assert "# Tools" in expect and '"name": "get_weather"' in expect
    no_tools = ours.apply_chat_template(msgs, **kwargs)
    assert "# Tools" not in no_tools
    assert no_tools == theirs.apply_chat_template(msgs, tokenize=False, **{"add_generation_prompt": True, **kwargs})


def test_the_request_path_passes_reasoning_and_chat_template_kwargs(model_files):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(model_files / "hf"))
    ours = Tokenizer.from_gguf(smollm2_gguf()).with_chat_template(QWEN3)  # a byte-level vocabulary: decodes back
    turns = [{**m, "reasoning_content": "Call the tool."} if i == 2 else m for i, m in enumerate(CONVERSATION[:4])]
    request = [ChatMessage(**m) for m in turns]  # reasoning_content arrives as an extra field of the message
    assert chat_messages(request)[2]["reasoning_content"] == "Call the tool."
    for kwargs in ({}, {"enable_thinking": False}):
        ids = chat_prompt(ours, request, TOOLS, kwargs)
        expect = theirs.apply_chat_template(turns, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kwargs)
        assert ours.decode(ids, skip_special_tokens=False) == expect
        assert "Call the tool." in expect
    assert chat_prompt(ours, request, TOOLS, {"enable_thinking": False}) != chat_prompt(ours, request, TOOLS)


def test_chat_template_kwargs_cannot_replace_the_request(model_files):
    ours = Tokenizer.load(str(model_files / "m.gguf"))
    with pytest.raises(APIError, match="chat_template_kwargs cannot set messages") as err:
        chat_prompt(ours, [ChatMessage(role="user", content="a")], None, {"messages": []})
    assert err.value.status == 400
