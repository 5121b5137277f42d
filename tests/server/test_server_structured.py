"""Structured outputs through the OpenAI API: response_format, vLLM's structured_outputs and guided_* fields."""

from __future__ import annotations

import json
import re

import openai
import pytest

jsonschema = pytest.importorskip("jsonschema")

ASK = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _chat(client, model, messages=ASK, **kw):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=120, temperature=0, **kw)
    return r.choices[0]


def test_response_format_json_object(client, model):
    ask = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    choice = _chat(client, model, ask, response_format={"type": "json_object"})
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


def test_response_format_json_schema(client, model):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    choice = _chat(client, model, response_format=rf, seed=4)
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_response_format_text_is_unconstrained(client, model):
    a = _chat(client, model, response_format={"type": "text"}, max_completion_tokens=8)
    b = _chat(client, model, max_completion_tokens=8)
    assert a.message.content == b.message.content


def test_structured_outputs_regex_and_choice(client, model):
    r = client.completions.create(
        model=model,
        prompt="Call me at",
        max_tokens=30,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    choice = _chat(client, model, extra_body={"structured_outputs": {"choice": ["cat", "dog", "fish"]}})
    assert choice.message.content in ("cat", "dog", "fish")


def test_guided_json_as_object_and_as_string(client, model):
    for schema in (PERSON, json.dumps(PERSON)):
        choice = _chat(client, model, extra_body={"guided_json": schema})
        jsonschema.validate(json.loads(choice.message.content), PERSON)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, ["response_format", "guided_regex"]),
        ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, ["structured_outputs.regex", "choice"]),
        ({"guided_json": PERSON, "structured_outputs": {"json_object": True}}, ["json_object", "guided_json"]),
    ],
)
def test_two_constraints_are_a_400_naming_them(client, model, extra, named):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, extra_body=extra)
    assert err.value.status_code == 400
    msg = err.value.body["message"]
    assert "at most one" in msg and all(n in msg for n in named), msg


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"guided_json": {"type": "strnig"}}, "guided_json", "strnig"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex", "regex"),
        ({"guided_grammar": "start: nowhere"}, "guided_grammar", "nowhere"),
        ({"guided_grammar": "u["}, "guided_grammar", "invalid grammar"),  # a GBNF parse error (the fuzzer's 500)
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"minimum": "a"}}}},
            "response_format.json_schema",
            "minimum",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ],
)
def test_an_invalid_constraint_is_a_400(client, model, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, extra_body=extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body
