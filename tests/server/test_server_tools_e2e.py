"""Tool calling end to end through a real server: required and named calls constrained to valid arguments,
auto calls read back by the Hermes parser (whole and streamed), tool history rendered back."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def _valid(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_are_valid_calls_of_the_tools(client, model):
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, temperature=0
    )
    msg = r.choices[0].message
    assert msg.tool_calls and r.choices[0].finish_reason == "tool_calls"
    for call in msg.tool_calls:
        _valid(call)


def test_a_named_function_gets_one_call_with_valid_arguments(client, model):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=80, temperature=0
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    _valid(call)


def test_auto_reads_hermes_calls_back_whole_and_streamed(client, model):
    forced = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Lyon)", "unit": "C"\}\}</tool_call>'
    kw = dict(
        model=model,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"regex": forced}},
    )
    whole = client.chat.completions.create(**kw)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and whole.choices[0].finish_reason == "tool_calls"
    _valid(call)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == json.loads(call.function.arguments)
    assert not any(ch.delta.content and "<tool_call>" in ch.delta.content for c in chunks for ch in c.choices)
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]


def test_tool_history_renders_through_the_template(client, model):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ]
    r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens > 0 and r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_bad_tool_requests_are_400(served, extra, param):
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": ASK, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
