"""Tool calling (fluidpd.server.tools, .tool_choice, .tool_output), tool-aware chat rendering: unit level, no server."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from fluidpd.engine.tokenizer import Tokenizer
from fluidpd.server.config import TOOL_CALL_PARSERS, ServeConfig, load_chat_template
from fluidpd.server.errors import APIError
from fluidpd.server.prompts import chat_messages
from fluidpd.server.protocol import ChatCompletionRequest, ChatMessage
from fluidpd.server.tool_choice import check_tools
from fluidpd.server.tool_output import ToolCallStream, tool_calls_from_output
from fluidpd.server.tool_parsers import TOOL_PARSERS, make_parser
from fluidpd.server.tools import tool_grammar, tool_request, tool_schema

QWEN25 = (Path(__file__).parent / "data" / "qwen2.5_instruct_chat_template.jinja").read_text()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]


def _call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"


HERMES_TEXTS = [
    "Just an answer, no tools.",
    "",
    _call("get_weather", {"city": "Paris"}),
    "Let me look.\n" + _call("get_weather", {"city": "São Paulo", "unit": "c"}) + "\n" + _call("get_time", {}),
    _call("get_weather", {"city": 'a "quoted" <tool_call> city'}) + "\ntrailing text is dropped",
    "unclosed last block " + _call("get_time", {})[: -len("\n</tool_call>")],
    "bad json " + '<tool_call>\n{"name": "get_time", "arguments": {}\n</tool_call>',
    'truncated <tool_call>\n{"name": "get_weather", "argu',
    "a lone < and <tool but no call <tool_cal",
    'name not first <tool_call>{"arguments": {"x": [1, 2]}, "name": "f\\u00e9"}</tool_call>',
]


def _collect(deltas: list[dict]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    """(content, [(name, arguments)], ids) from a stream of OpenAI delta dicts, as a client accumulates them."""
    content, calls = "", {}
    for d in deltas:
        assert set(d) in ({"content"}, {"tool_calls"}), d
        if "content" in d:
            assert d["content"]
            content += d["content"]
            continue
        (tc,) = d["tool_calls"]
        i = tc["index"]
        if "id" in tc:
            assert i not in calls and tc["type"] == "function" and tc["id"].startswith("call_")
            calls[i] = [tc["function"]["name"], "", tc["id"]]
        calls[i][1] += tc["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return content or None, [(calls[i][0], calls[i][1]) for i in sorted(calls)], [calls[i][2] for i in sorted(calls)]


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _whole(content, calls):
    return content or None, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


# ---------------------------------------------------------------------- the hermes parser


def test_hermes_parse_whole_text():
    p = make_parser("hermes")
    assert p.parse("no call here") == ("no call here", [])
    content, calls = p.parse(HERMES_TEXTS[3])
    assert content == "Let me look.\n"
    assert [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "São Paulo", "unit": "c"}'},
        {"name": "get_time", "arguments": "{}"},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert p.parse(HERMES_TEXTS[2])[0] is None  # nothing before the call: no content
    assert p.parse(HERMES_TEXTS[5])[1][0]["function"]["name"] == "get_time"  # the last block may be unclosed
    assert p.parse(HERMES_TEXTS[6]) == (HERMES_TEXTS[6], [])  # a block that is not JSON: all of it is content
    assert p.parse(HERMES_TEXTS[9])[1][0]["function"] == {"name": "fé", "arguments": '{"x": [1, 2]}'}


@pytest.mark.parametrize("text", HERMES_TEXTS)
def test_hermes_streamed_in_any_chunking_gives_the_whole_text_result(text):
    rng = random.Random(zlib.crc32(text.encode()))
    expect = _whole(*make_parser("hermes").parse(text))
    for _ in range(60):
        p = make_parser("hermes")
        deltas = [d for piece in _chunks(text, rng) for d in p.feed(piece)] + p.finish()
        content, calls, _ = _collect(deltas)
        assert (content, calls) == expect
        if expect[1]:  # text from the first <tool_call> on is never shown as content
            assert "<tool_call" not in (content or "") and "</tool_call" not in (content or "")


def test_hermes_stream_holds_a_call_until_its_block_closes():
    p = make_parser("hermes")
    assert p.feed("Hi <tool") == [{"content": "Hi "}]  # "<tool" might begin <tool_call>: held
    assert p.feed('_call>\n{"name": "get_weather", "arguments": {"ci') == []
    assert p.feed('ty": "Paris"}}') == []
    (delta,) = p.feed("\n</tool_call>\n")
    (call,) = delta["tool_calls"]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert p.finish() == []


def test_parser_registry_matches_the_config_choices():
    assert set(TOOL_PARSERS.names()) == set(TOOL_CALL_PARSERS)
    with pytest.raises(ValueError, match="hermes"):
        make_parser("nope")


# ---------------------------------------------------------------------- tool_choice: grammars and outputs


def _validator(schema):
    jsonschema = pytest.importorskip("jsonschema")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)  # a valid JSON Schema
    return cls(schema)


def test_required_grammar_is_a_json_schema_of_calls():
    spec = tool_grammar(TOOLS, "required")
    assert spec.kind == "json"
    v = _validator(json.loads(spec.value))
    ok = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    assert v.is_valid(ok)
    assert v.is_valid(ok[:1])
    assert not v.is_valid([])  # at least one call
    assert not v.is_valid([{"name": "get_wether", "parameters": {"city": "Paris"}}])  # no such function
    assert not v.is_valid([{"name": "get_weather", "parameters": {}}])  # its parameters' schema holds
    assert not v.is_valid([{"name": "get_weather"}])
    one = _validator(tool_schema(TOOLS, "required", parallel_tool_calls=False))
    assert one.is_valid(ok[:1]) and not one.is_valid(ok)


def test_required_grammar_hoists_defs():
    params = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/Place"}},
        "required": ["where"],
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    }
    tools = [{"type": "function", "function": {"name": "go", "parameters": params}}, TIME]
    schema = tool_schema(tools, "required")
    assert "Place" in schema["$defs"] and "$defs" in params  # the request's tools are left as they were
    v = _validator(schema)
    assert v.is_valid([{"name": "go", "parameters": {"where": {"city": "Rome"}}}])
    assert not v.is_valid([{"name": "go", "parameters": {"where": {"town": "Rome"}}}])
    clash = {**params, "$defs": {"Place": {"type": "string"}}}
    with pytest.raises(APIError) as e:
        tool_schema([*tools, {"type": "function", "function": {"name": "go2", "parameters": clash}}], "required")
    assert e.value.param == "tools"


def test_named_grammar_is_the_functions_parameters():
    named = {"type": "function", "function": {"name": "get_weather"}}
    v = _validator(json.loads(tool_grammar(TOOLS, named).value))
    assert v.is_valid({"city": "Paris", "unit": "f"})
    assert not v.is_valid({"unit": "f"}) and not v.is_valid({"city": "Paris", "unit": "k"})
    no_params = {"type": "function", "function": {"name": "ping"}}
    v = _validator(tool_schema([no_params], {"type": "function", "function": {"name": "ping"}}))
    assert v.is_valid({}) and not v.is_valid([])


def test_no_grammar_for_auto_and_none():
    assert tool_grammar(TOOLS, "auto") is None and tool_grammar(TOOLS, "none") is None
    assert tool_grammar(TOOLS, None) is None and tool_grammar(None, None) is None


def test_outputs_per_tool_choice():
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    content, calls = tool_calls_from_output(text, TOOLS, "required")
    assert content == "" and _whole(None, calls)[1] == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert len(tool_calls_from_output(text, TOOLS, "required", parallel_tool_calls=False)[1]) == 1
    named = {"type": "function", "function": {"name": "get_weather"}}
    content, calls = tool_calls_from_output('{"city": "Paris"}', TOOLS, named)
    assert content == "" and _whole(None, calls)[1] == [("get_weather", '{"city": "Paris"}')]
    hermes = HERMES_TEXTS[3]
    assert tool_calls_from_output(hermes, TOOLS, "none") == (hermes, [])
    assert tool_calls_from_output(hermes, None, None) == (hermes, [])
    assert len(tool_calls_from_output(hermes, TOOLS, None)[1]) == 2  # tools without tool_choice: auto
    assert len(tool_calls_from_output(hermes, TOOLS, "auto", parallel_tool_calls=False)[1]) == 1


@pytest.mark.parametrize(
    "choice,text",
    [
        (
            "required",
            '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]',
        ),
        ("required", ' [ {"name": "get_time", "parameters": {"a": "]}["}} ] '),
        ("required", '[{"name": "get_weather", "parameters": {"ci'),  # cut short: the text is the content
        ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Paris"}'),
        ({"type": "function", "function": {"name": "get_weather"}}, ""),
        ("auto", HERMES_TEXTS[3]),
        ("auto", HERMES_TEXTS[6]),
        ("none", HERMES_TEXTS[3]),
    ],
)
@pytest.mark.parametrize("parallel", [True, False])
def test_streamed_choices_match_the_whole_output(choice, text, parallel):
    rng = random.Random(len(text))
    expect = _whole(*tool_calls_from_output(text, TOOLS, choice, "hermes", parallel))
    for _ in range(30):
        s = ToolCallStream(TOOLS, choice, "hermes", parallel)
        deltas = [d for piece in _chunks(text, rng) for d in s.feed(piece)] + s.finish()
        content, calls, _ = _collect(deltas)
        assert (content, calls) == expect
        assert s.called == bool(calls)


def test_finish_reason():
    auto, req = tool_request(TOOLS, "auto"), tool_request(TOOLS, "required")
    named = tool_request(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert auto.finish_reason("stop", True) == "tool_calls" and auto.finish_reason("stop", False) == "stop"
    assert req.finish_reason("stop", True) == "tool_calls" and req.finish_reason("length", True) == "length"
    assert named.finish_reason("stop", True) == "stop"


# ---------------------------------------------------------------------- checking the request


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        (None, "auto", "tool_choice"),
        (None, "required", "tool_choice"),
        (None, {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (TOOLS, {"type": "function", "function": {}}, "tool_choice"),
        (TOOLS, {"type": "function"}, "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
        ([{"type": "function"}], "auto", "tools"),
        ([{"type": "function", "function": {"description": "no name"}}], None, "tools"),
        ([{"type": "retrieval", "function": {"name": "x"}}], None, "tools"),
        ([{"type": "function", "function": {"name": "x", "parameters": "{}"}}], None, "tools"),
        (["get_time"], None, "tools"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(tools, choice, param):
    with pytest.raises(APIError) as e:
        tool_request(tools, choice)
    assert e.value.status == 400 and e.value.param == param


def test_tool_choice_defaults_and_normalised_tools():
    assert check_tools(None, None) == (None, "none")
    assert check_tools(None, "none") == (None, "none")
    tools, choice = check_tools([{"function": {"name": "f"}, "x-extra": 1}], None)
    assert choice == "auto"
    # as vLLM's model_dump: declared fields first (None where absent), then extras
    assert tools == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}, "x-extra": 1}
    ]
    assert check_tools([], "required") == (None, "none")  # as OpenAI and vLLM: nothing to call
    assert tool_request(TOOLS, "none").tools is not None  # tool_choice none still renders the tools (vLLM's default)


def test_protocol_accepts_tool_fields():
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
    )
    tr = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    assert tr.tool_choice["function"]["name"] == "get_time" and tr.parallel_tool_calls is False


# ---------------------------------------------------------------------- rendering


def _tokenizers(template: str):
    """Our Tokenizer and transformers' PreTrainedTokenizerFast over one tiny vocabulary and `template`."""
    transformers = pytest.importorskip("transformers")
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3}
    tk = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    ours = Tokenizer(tk, bos_token_id=None, eos_token_ids=(2,), add_bos=False, chat_template=template)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", unk_token="[UNK]")
    return ours, theirs


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in São Paulo, and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "São Paulo", "unit": "c"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call_2", "name": "get_time", "content": [{"type": "text", "text": "10:42"}]},
    {"role": "assistant", "content": "21 °C and clear; it is 10:42."},
    {"role": "user", "content": "Thanks. And in Lima?"},
]


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_tool_conversation_renders_as_transformers_does(generation_prompt):
    ours, theirs = _tokenizers(QWEN25)
    msgs = chat_messages([ChatMessage(**m) for m in CONVERSATION])
    tools = tool_request([*TOOLS, {"type": "function", "function": {"name": "ping"}}], None).tools
    text = ours.apply_chat_template(msgs, add_generation_prompt=generation_prompt, tools=tools)
    expect = theirs.apply_chat_template(
        msgs, tools=tools, chat_template=QWEN25, add_generation_prompt=generation_prompt, tokenize=False
    )
    assert text == expect
    # what the template made of them: tools listed, the call's arguments as JSON (not a string), results in turn
    assert '\n{"type": "function", "function": {"name": "ping", "description": null, "parameters": null}}\n' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo", "unit": "c"}}'
        in text
    )
    assert '{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n' in text
    assert (
        "<|im_start|>user\n<tool_response>\n{" in text
        and "\n<tool_response>\n10:42\n</tool_response><|im_end|>" in text
    )
    assert text.endswith("<|im_start|>assistant\n") == generation_prompt
    no_tools = ours.apply_chat_template(msgs[:2])
    assert no_tools == theirs.apply_chat_template(
        msgs[:2], chat_template=QWEN25, add_generation_prompt=True, tokenize=False
    )
    assert "# Tools" not in no_tools


def test_template_filters_and_tags_as_transformers():
    template = (
        "{% for m in messages %}{% generation %}{{ m | tojson(indent=2, sort_keys=True, ensure_ascii=True) }}"
        "{{ m | tojson(separators=(',', ':')) }}{% endgeneration %}{% endfor %}"
        "{{ tools | tojson }}|{{ documents }}|{{ eos_token }}|{{ messages[0].reasoning_content }}"
    )
    ours, theirs = _tokenizers(template)
    msgs = [{"role": "assistant", "content": "é <b>", "reasoning": "hmm", "name": None}]
    expect = theirs.apply_chat_template(msgs, tools=[WEATHER], chat_template=template, tokenize=False)
    assert ours.apply_chat_template(msgs, add_generation_prompt=False, tools=[WEATHER]) == expect


def test_tool_use_template_is_rendered_when_tools_are_given(tmp_path):
    vocab = {"<|im_end|>": 0, "[UNK]": 1}
    HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    templates = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools:{{ tools|length }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates, "eos_token": "<|im_end|>"}))
    tok = Tokenizer.from_pretrained_dir(str(tmp_path))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "plain"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tools=TOOLS) == "tools:2"
    over = tok.with_chat_template("over")  # an override (--chat-template) wins, with tools too
    assert over.apply_chat_template([], tools=TOOLS) == "over" and tok.chat_template == "plain"


def test_bad_tool_call_arguments_in_messages_are_400s():
    msgs = [ChatMessage(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": "{not json"}}])]
    with pytest.raises(APIError) as e:
        chat_messages(msgs)
    assert e.value.param == "messages" and "arguments" in e.value.message
    with pytest.raises(APIError):
        chat_messages([ChatMessage(role="assistant", tool_calls=[{"type": "function"}])])


# ---------------------------------------------------------------------- configuration


def test_chat_template_flag(tmp_path):
    from fluidpd.cli import build_parser
    from fluidpd.cli.serve import configs

    path = tmp_path / "t.jinja"
    path.write_text(QWEN25)
    _, _, serve = configs(
        build_parser().parse_args(["serve", "--chat-template", str(path), "--tool-call-parser", "hermes"])
    )
    assert serve.chat_template == str(path) and serve.tool_call_parser == "hermes"
    assert load_chat_template(serve.chat_template) == QWEN25
    assert (
        load_chat_template("{{ messages[0].content }}\\n") == "{{ messages[0].content }}\n"
    )  # inline, escapes decoded
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="looks like a file path"):
        ServeConfig(chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError):
        ServeConfig(tool_call_parser="nope")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-call-parser", "nope"])


def test_the_chat_template_override_reaches_the_servers_tokenizer():
    from types import SimpleNamespace

    from fluidpd.server.state import ServerState

    ours, _ = _tokenizers("model's")
    runtime = SimpleNamespace(tokenizer=ours, model_name="m", max_model_len=64)
    state = ServerState(runtime, ServeConfig(chat_template="{{ 'override' }}\\n!"))
    assert state.tokenizer.apply_chat_template([]) == "override\n!"
    assert ours.apply_chat_template([]) == "model's"  # the runtime's own tokenizer is left as it was
    assert ServerState(runtime, ServeConfig()).tokenizer is ours
