"""Structured outputs on SmolLM2: the grammar matcher, JSON Schema / regex / choice generation, and a
constrained request handed from one engine to another mid-generation."""

from __future__ import annotations

import json
import pickle
import re
import uuid

import pytest
import torch

from fluidpd.engine import SamplingParams
from fluidpd.engine.structured import GrammarSpec
from fluidpd.engine.structured.backend import GrammarError
from fluidpd.engine.structured.backends import bound_backend
from fluidpd.engine.structured.engine_hooks import PendingMatcher

jsonschema = pytest.importorskip("jsonschema")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
SCHEMAS = [
    PERSON,
    {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
            "primary": {"type": "boolean"},
        },
        "required": ["colors", "primary"],
        "additionalProperties": False,
    },
    {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "start": {"$ref": "#/$defs/point"},
            "end": {"$ref": "#/$defs/point"},
            "label": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,8}$"}]},
        },
        "required": ["start", "end", "label"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"answer": {"const": "yes"}, "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
]
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def _json_spec(schema: dict) -> GrammarSpec:
    return GrammarSpec("json", json.dumps(schema))


def _allowed(matcher, vocab: int) -> set[int]:
    return set(torch.isfinite(matcher.mask(torch.zeros(vocab))).nonzero().flatten().tolist())


def _drain(eng) -> dict:
    outs = {}
    while eng.has_unfinished():
        outs |= {o.request_id: o.output for o in eng.step() if o.finished}
    return outs


@pytest.fixture(scope="module")
def backend(smol):
    return bound_backend(smol[1])


def test_matcher_masks_and_accepts(smol, backend):
    tok = smol[1]
    eos = tok.eos_token_ids[0]
    m = backend.matcher(GrammarSpec("choice", json.dumps(["red", "green"])), eos_token_ids=[eos])
    first = _allowed(m, tok.vocab_size)
    assert first and all(("red".startswith(s) or "green".startswith(s)) for s in (tok.decode([t]) for t in first))
    assert eos not in first  # nothing is complete yet
    for t in tok.encode("red", add_special_tokens=False):
        m.accept(t)
    assert _allowed(m, tok.vocab_size) == {eos} and not m.is_terminated()  # complete: EOS only
    m.accept(eos)
    assert m.is_terminated() and m.error is None

    bad = backend.matcher(GrammarSpec("regex", "[0-9]{3}"), eos_token_ids=[eos])
    bad.accept(tok.encode("x", add_special_tokens=False)[0])
    assert bad.is_terminated() and "not allowed" in bad.error
    assert _allowed(bad, tok.vocab_size) == {eos}  # a refused token ends the output
    with pytest.raises(GrammarError, match="does not follow"):
        backend.matcher(GrammarSpec("regex", "[0-9]{3}"), tok.encode("abc", add_special_tokens=False), [eos])


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (GrammarSpec("regex", "[0-9]{3"), "regex"),
        (GrammarSpec("json", '{"type": "strnig"}'), "strnig"),
        (GrammarSpec("json", "{not json"), "invalid json"),
        (GrammarSpec("grammar", "start: undefined_rule"), "undefined_rule"),
        (GrammarSpec("choice", "[]"), "non-empty list"),
    ],
)
def test_add_request_rejects_a_bad_grammar_saying_why(make_engine, spec, words):
    eng = make_engine(num_kv_blocks=32)
    with pytest.raises(ValueError, match=re.escape(words)):
        eng.add_request("Hi", SamplingParams(max_tokens=4, structured=spec))
    assert not eng.has_unfinished()


def test_json_schema_outputs_parse_and_validate_greedy_and_sampled(make_engine):
    eng = make_engine(num_kv_blocks=256)
    params = []
    for schema in SCHEMAS:
        spec = _json_spec(schema)
        params.append(SamplingParams(max_tokens=160, structured=spec))
        params += [SamplingParams(max_tokens=160, temperature=1.0, seed=s, structured=spec) for s in (1, 2)]
    outs = eng.generate([ASK] * len(params), params, chat=True)
    for p, out in zip(params, outs):
        schema = json.loads(p.structured.value)
        assert out.finish_reason == "stop", (out.text, schema)
        jsonschema.validate(json.loads(out.text), schema)


def test_json_object_regex_and_choice(make_engine):
    eng = make_engine(num_kv_blocks=128)
    specs = [
        GrammarSpec("json_object"),
        GrammarSpec("regex", "[0-9]{3}-[a-z]{2,6}"),
        GrammarSpec("choice", json.dumps(["Paris", "London", "Rome"])),
        GrammarSpec("grammar", 'root ::= "The answer is " ("yes" | "no") "."'),
    ]
    params = [SamplingParams(max_tokens=120, structured=s) for s in specs]
    params.append(SamplingParams(max_tokens=20, temperature=1.0, seed=3, structured=specs[1]))
    outs = eng.generate([[{"role": "user", "content": "The capital of France?"}]] * len(params), params, chat=True)
    assert all(o.finish_reason == "stop" for o in outs), [o.text for o in outs]
    assert isinstance(json.loads(outs[0].text), dict)
    assert re.fullmatch("[0-9]{3}-[a-z]{2,6}", outs[1].text) and re.fullmatch("[0-9]{3}-[a-z]{2,6}", outs[4].text)
    assert outs[2].text in ("Paris", "London", "Rome")
    assert re.fullmatch("The answer is (yes|no)\\.", outs[3].text)


def test_a_replayed_matcher_equals_the_incremental_one(smol, make_engine, backend):
    tok = smol[1]
    eos = tok.eos_token_ids
    spec = _json_spec(PERSON)
    out = make_engine(num_kv_blocks=64).generate([ASK], SamplingParams(max_tokens=160, structured=spec), chat=True)[0]
    tokens = out.token_ids[:-1]  # the EOS that ended it left out
    assert len(tokens) > 8
    live = backend.matcher(spec, eos_token_ids=eos)
    for k, t in enumerate(tokens):
        if k % 4 == 0 or k == len(tokens) - 1:
            rebuilt = backend.matcher(spec, tokens[:k], eos)
            assert _allowed(rebuilt, tok.vocab_size) == _allowed(live, tok.vocab_size), k
        live.accept(t)
    done = backend.matcher(spec, tokens, eos)
    assert _allowed(done, tok.vocab_size) == _allowed(live, tok.vocab_size) == set(eos)


def test_a_new_grammar_compiles_off_the_step_and_still_holds(make_engine):
    eng = make_engine(num_kv_blocks=32)
    word = uuid.uuid4().hex[:6]
    spec = GrammarSpec("regex", f"(yes|no)-{word}")  # never compiled before: its matcher waits on the pool
    rid = eng.add_request("Answer:", SamplingParams(max_tokens=30, structured=spec))
    assert isinstance(eng.request(rid).state.matcher, PendingMatcher)
    out = _drain(eng)[rid]
    assert re.fullmatch(f"(yes|no)-{word}", out.text) and out.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_export_import_mid_generation_continues_to_valid_json(make_engine, temperature):
    a, b = make_engine(num_kv_blocks=64), make_engine(num_kv_blocks=64)
    p = SamplingParams(max_tokens=160, temperature=temperature, seed=11, structured=_json_spec(PERSON))
    whole = a.generate([ASK], p, chat=True)[0]
    rid = a.add_request(ASK, p, chat=True)
    while a.request(rid).num_output_tokens < 6:
        a.step()
    payload = pickle.loads(pickle.dumps(a.export_kv(rid)))  # as if sent to another process
    rid_b = b.import_kv(payload)
    assert b.request(rid_b).state.matcher is not None
    out = _drain(b)[rid_b]
    jsonschema.validate(json.loads(out.text), PERSON)
    assert out.token_ids == whole.token_ids  # the same stream as without the move


def test_import_refuses_output_that_breaks_the_grammar(smol, make_engine):
    a, b = make_engine(num_kv_blocks=32), make_engine(num_kv_blocks=32)
    rid = a.add_request(ASK, SamplingParams(max_tokens=40, ignore_eos=True), chat=True)
    while a.request(rid).num_output_tokens < 3:
        a.step()
    payload = a.export_kv(rid)
    bad = SamplingParams(max_tokens=40, structured=GrammarSpec("regex", "[0-9]+"))
    with pytest.raises(ValueError, match="does not follow the grammar"):
        b.import_kv(payload, bad)
    assert not b.has_unfinished()
