"""Structured outputs (llguidance) on SmolLM2-135M-Instruct, CPU, one torch thread. Three claims:

* decode step time constrained by a JSON schema vs unconstrained, batch 1 and 8 (median over pure decode
  steps, rounds alternating the two; goal <= 1.10x);
* compile time per schema, cold (no cache): the check `add_request` runs synchronously (tokenizer-free, what
  the server also runs), the tokenizer-bound compile the thread pool runs, and the first mask;
* the share of greedy outputs that parse and validate (jsonschema) over 20 JSON schemas (goal 100%).

  .venv/bin/python benchmarks/engine/structured_outputs.py [--rounds 3] [--steps 24]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import jsonschema
import torch
from engine_common import engine

from fluidpd.engine import SamplingParams
from fluidpd.engine.plan import StepPlan
from fluidpd.engine.structured import GrammarSpec
from fluidpd.engine.structured.backends import bound_backend
from fluidpd.engine.structured.llguidance_backend import _checked

torch.set_num_threads(1)


def strict(props: dict, **kw) -> dict:
    """An object schema as OpenAI's strict mode writes them: every property required, no others."""
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False, **kw}


S = {"type": "string", "maxLength": 40}
INT = {"type": "integer", "minimum": 0, "maximum": 10000}
SCHEMAS = {
    "person": strict({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "email": S}),
    "city": strict({"city": S, "country": S, "population": INT}),
    "weather": strict({"city": S, "temp_c": {"type": "number"}, "sky": {"enum": ["sunny", "cloudy", "rain"]}}),
    "book": strict({"title": S, "author": S, "year": {"type": "integer", "minimum": 1000, "maximum": 2030}}),
    "todo": strict(
        {"tasks": {"type": "array", "items": strict({"task": S, "done": {"type": "boolean"}}), "maxItems": 4}}
    ),
    "colors": strict(
        {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]}, "maxItems": 4}}
    ),
    "sentiment": strict({"label": {"enum": ["positive", "negative", "neutral"]}, "score": {"type": "number"}}),
    "yes_no": strict({"answer": {"enum": ["yes", "no"]}, "reason": S}),
    "const": strict({"kind": {"const": "fruit"}, "name": S}),
    "date": strict({"event": S, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
    "product": strict({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "price": {"type": "number"}}),
    "address": strict(
        {"address": strict({"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})}
    ),
    "nullable": strict({"name": S, "nickname": {"anyOf": [S, {"type": "null"}]}}),
    "ref": {
        "$defs": {"point": strict({"x": INT, "y": INT})},
        **strict({"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}),
    },
    "tags": strict({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
    "math": strict({"question": S, "answer": {"type": "integer", "minimum": -1000, "maximum": 1000}}),
    "recipe": strict({"dish": S, "ingredients": {"type": "array", "items": S, "maxItems": 5}, "minutes": INT}),
    "movie": strict({"title": S, "rating": {"type": "number", "minimum": 0, "maximum": 10}, "genre": S}),
    "animal": strict(
        {"animal": S, "legs": {"type": "integer", "minimum": 0, "maximum": 8}, "wild": {"type": "boolean"}}
    ),
    "oneof": strict({"shape": {"oneOf": [strict({"circle": INT}), strict({"square": INT})]}}),
}
LONG = strict({"notes": {"type": "array", "items": S, "minItems": 64, "maxItems": 64}})  # decodes past the timing


def ask(name: str, schema: dict) -> list[dict]:
    return [{"role": "user", "content": f"Give an example {name} as JSON following this schema: {json.dumps(schema)}"}]


def paired_steps(eng, b: int, steps: int) -> tuple[list[float], list[float]]:
    """`b` unconstrained and `b` constrained sequences decoding in one engine, their decode steps alternating
    (which goes first alternating too), so the host's drift hits both alike: (free s, bound s) per step."""
    free = SamplingParams(max_tokens=4096, ignore_eos=True)
    bound = SamplingParams(max_tokens=4096, structured=GrammarSpec("json", json.dumps(LONG)))
    prompt = ask("list of notes", LONG)
    rids = {k: [eng.add_request(prompt, p, chat=True) for _ in range(b)] for k, p in (("free", free), ("bound", bound))}
    while any(not eng.request(r).is_decoding for group in rids.values() for r in group):
        eng.step()
    times = {"free": [], "bound": []}
    for i in range(steps):
        for kind in ("free", "bound") if i % 2 == 0 else ("bound", "free"):
            t = time.perf_counter()
            eng.run_step(StepPlan(decodes=list(rids[kind])))
            times[kind].append(time.perf_counter() - t)
    for group in rids.values():
        for r in group:
            eng.abort(r)
    return times["free"], times["bound"]


def step_ratio(eng, rounds: int, steps: int) -> dict[int, tuple[float, float]]:
    out = {}
    for b in (1, 8):
        paired_steps(eng, b, 2)  # warm: compile, first masks
        free, bound = [], []
        for _ in range(rounds):
            f, g = paired_steps(eng, b, steps)
            free += f
            bound += g
        out[b] = (statistics.median(free), statistics.median(bound))
    return out


def compile_times(tok) -> dict[str, float]:
    backend = bound_backend(tok)
    check, comp, first = [], [], []
    row = torch.zeros(tok.vocab_size)
    for schema in SCHEMAS.values():
        spec = GrammarSpec("json", json.dumps(schema))
        t0 = time.perf_counter()
        _checked.__wrapped__(spec)  # uncached
        t1 = time.perf_counter()
        g = backend._compile(spec)  # uncached
        t2 = time.perf_counter()
        g.matcher(tok.eos_token_ids).mask(row.clone())
        t3 = time.perf_counter()
        check.append(t1 - t0)
        comp.append(t2 - t1)
        first.append(t3 - t2)
    return {
        "check_ms": statistics.median(check) * 1e3,
        "check_max_ms": max(check) * 1e3,
        "compile_ms": statistics.median(comp) * 1e3,
        "compile_max_ms": max(comp) * 1e3,
        "first_mask_ms": statistics.median(first) * 1e3,
    }


def validity(eng, max_tokens: int) -> tuple[int, list[str]]:
    prompts = [ask(n, s) for n, s in SCHEMAS.items()]
    params = [
        SamplingParams(max_tokens=max_tokens, structured=GrammarSpec("json", json.dumps(s))) for s in SCHEMAS.values()
    ]
    outs = eng.generate(prompts, params, chat=True)
    ok, bad = 0, []
    for (name, schema), out in zip(SCHEMAS.items(), outs):
        try:
            jsonschema.validate(json.loads(out.text), schema)
            ok += out.finish_reason == "stop"
        except (ValueError, jsonschema.ValidationError) as exc:
            bad.append(f"{name}: {out.finish_reason}, {type(exc).__name__}: {out.text[:80]!r}")
    return ok, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24, help="decode steps timed per round")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    eng = engine(512)
    tok = eng.tokenizer
    bound_backend(tok)  # the tokenizer's llguidance view, built once
    comp = compile_times(tok)
    ok, bad = validity(eng, args.max_tokens)
    ratios = step_ratio(eng, args.rounds, args.steps)
    print(f"SmolLM2-135M-Instruct ({eng.config.quantization}), CPU, torch threads 1, llguidance")
    print("decode step, median (ms)   unconstrained   JSON schema   ratio")
    for b, (free, bound) in ratios.items():
        print(f"  batch {b:<19} {free * 1e3:>13.2f} {bound * 1e3:>13.2f} {bound / free:>7.3f}x")
    print(
        f"compile per schema, cold, median (max) over {len(SCHEMAS)}: admission check {comp['check_ms']:.2f} ms "
        f"({comp['check_max_ms']:.2f}), tokenizer-bound compile {comp['compile_ms']:.2f} ms "
        f"({comp['compile_max_ms']:.2f}), first mask {comp['first_mask_ms']:.2f} ms"
    )
    print(f"greedy outputs that parse, validate and stop: {ok}/{len(SCHEMAS)}")
    for line in bad:
        print("  invalid:", line)
    r1, r8 = (bound / free for free, bound in ratios.values())
    print(
        f"headline: constrained decode step {r1:.3f}x (batch 1), {r8:.3f}x (batch 8) of unconstrained (goal <= 1.10x); "
        f"compile {comp['check_ms'] + comp['compile_ms']:.2f} ms median; {100 * ok / len(SCHEMAS):.0f}% of "
        f"{len(SCHEMAS)} schemas valid (goal 100%)"
    )


if __name__ == "__main__":
    main()
