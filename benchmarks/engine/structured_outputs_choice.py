"""Which grammar engine backs structured outputs: llguidance or xgrammar, measured on SmolLM2's vocabulary.

Per library, CPU only, on SmolLM2-135M-Instruct's 49,152-token byte-level BPE vocabulary:
  * the token mask fill time per token (median over the tokens of a JSON document, each mask filled then
    the document's next token accepted; the first mask reported apart, it includes lazy work);
  * the compile time of a JSON schema (median over SCHEMAS, each compiled fresh: no compiler cache), and
    compile + first mask (llguidance builds masks lazily, xgrammar precomputes them at compile time);
  * which JSON Schema features each enforces: the feature's schema compiles, a valid instance is accepted
    to the end and an invalid one is refused (a token rejected, or the grammar unable to end).

    .venv/bin/python benchmarks/engine/structured_outputs_choice.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

torch.set_num_threads(1)

from fluidpd.engine import EngineConfig  # noqa: E402
from fluidpd.engine.model_source import load_tokenizer  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city"],
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
}
PERSON_DOC = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["mathematician", "writer", "analyst"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"},
    "active": True,
}
SCHEMAS = [
    PERSON,
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 8},
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                        "qty": {"type": "integer"},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
            "status": {"enum": ["open", "paid", "shipped"]},
        },
        "required": ["items", "status"],
    },
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    },
]


def obj(props: dict, **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(props), **kw}


# feature -> (schema, a valid instance, an invalid one): enforced if the library takes the first, refuses the second
FEATURES = {
    "$ref/$defs": (
        {"$defs": {"p": {"type": "integer"}}, **obj({"a": {"$ref": "#/$defs/p"}})},
        {"a": 3},
        {"a": "x"},
    ),
    "recursive $ref": (
        {"$defs": {"t": obj({"k": {"type": "array", "items": {"$ref": "#/$defs/t"}}})}, "$ref": "#/$defs/t"},
        {"k": [{"k": []}]},
        {"k": [{"k": [1]}]},
    ),
    "anyOf": (obj({"a": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}), {"a": True}, {"a": "s"}),
    "oneOf": (obj({"a": {"oneOf": [{"type": "integer"}, {"type": "null"}]}}), {"a": None}, {"a": "s"}),
    "allOf": (
        {"allOf": [obj({"a": {"type": "integer"}}), obj({"b": {"type": "string"}})]},
        {"a": 1, "b": "x"},
        {"a": 1},
    ),
    "type list": (obj({"a": {"type": ["string", "null"]}}), {"a": None}, {"a": 1}),
    "enum": (obj({"a": {"enum": ["red", "green", 3]}}), {"a": "green"}, {"a": "blue"}),
    "const": (obj({"a": {"const": "fixed"}}), {"a": "fixed"}, {"a": "other"}),
    "pattern": (obj({"a": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}}), {"a": "ab12"}, {"a": "abc1"}),
    "minLength/maxLength": (
        obj({"a": {"type": "string", "minLength": 2, "maxLength": 3}}),
        {"a": "abc"},
        {"a": "abcd"},
    ),
    "minimum/maximum": (obj({"a": {"type": "integer", "minimum": 1, "maximum": 9}}), {"a": 9}, {"a": 10}),
    "exclusiveMinimum": (obj({"a": {"type": "number", "exclusiveMinimum": 0}}), {"a": 1}, {"a": 0}),
    "multipleOf": (obj({"a": {"type": "integer", "multipleOf": 5}}), {"a": 15}, {"a": 7}),
    "minItems/maxItems": (
        obj({"a": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}}),
        {"a": [1, 2]},
        {"a": [1, 2, 3]},
    ),
    "uniqueItems": (
        obj({"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}),
        {"a": [1, 2]},
        {"a": [1, 1]},
    ),
    "prefixItems": (
        obj({"a": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}}),
        {"a": [1, "x"]},
        {"a": ["x", 1]},
    ),
    "additionalProperties false": (
        obj({"a": {"type": "integer"}}, additionalProperties=False),
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    "additionalProperties schema": (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"k": 1},
        {"k": "v"},
    ),
    "required": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {}),
    "nested objects": (
        obj({"a": obj({"b": obj({"c": {"type": "boolean"}})})}),
        {"a": {"b": {"c": False}}},
        {"a": {"b": {"c": 1}}},
    ),
    "format date-time": (
        obj({"a": {"type": "string", "format": "date-time"}}),
        {"a": "2024-05-01T10:00:00Z"},
        {"a": "yesterday"},
    ),
    "format email": (obj({"a": {"type": "string", "format": "email"}}), {"a": "a@b.co"}, {"a": "not an email"}),
    "format uuid": (
        obj({"a": {"type": "string", "format": "uuid"}}),
        {"a": "123e4567-e89b-12d3-a456-426614174000"},
        {"a": "xyz"},
    ),
    "minProperties": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
        {"k": 1},
        {},
    ),
}
BAD_SCHEMAS = [  # each must fail to compile, with a message
    {"type": "strnig"},
    {"$ref": "#/$defs/missing"},
    {"type": "string", "pattern": "[a-"},
    {"type": "integer", "minimum": 5, "maximum": 1},
]


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok) -> None:
        import llguidance as llg
        import llguidance.numpy as lln

        self.llg, self.lln = llg, lln
        t = time.perf_counter()
        self.tk = llg.LLTokenizer(tok.tk.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_token_ids))
        self.tokenizer_s = time.perf_counter() - t
        self.eos = tok.eos_token_ids[0]
        self.mask = lln.allocate_token_bitmask(1, tok.vocab_size)
        self.version = _version("llguidance")

    def compile(self, schema: dict):
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        err = self.llg.LLMatcher.validate_grammar(g, self.tk)
        if err:
            raise ValueError(err)
        return g

    def matcher(self, compiled):
        m = self.llg.LLMatcher(self.tk, compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m) -> None:
        self.lln.fill_next_token_bitmask(m, self.mask, 0)

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)

    def can_end(self, m) -> bool:
        return m.is_accepting()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        t = time.perf_counter()
        vocab = [tok.token_str(i) or "" for i in range(tok.vocab_size)]
        info = xgr.TokenizerInfo(
            vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size, stop_token_ids=list(tok.eos_token_ids)
        )
        self.tokenizer_s = time.perf_counter() - t
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.eos = tok.eos_token_ids[0]
        self.mask = xgr.allocate_token_bitmask(1, tok.vocab_size)
        self.version = _version("xgrammar")

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m) -> None:
        m.fill_next_token_bitmask(self.mask)

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)

    def can_end(self, m) -> bool:
        return m.accept_token(self.eos)


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version(pkg)


def mask_times(lib, tok, schema: dict, doc: dict) -> tuple[float, float, int]:
    """(first mask s, median later mask s, tokens) filling the mask before each token of `doc`."""
    m = lib.matcher(lib.compile(schema))
    tokens = tok.encode(json.dumps(doc), add_special_tokens=False)
    times = []
    for t in tokens:
        t0 = time.perf_counter()
        lib.fill(m)
        times.append(time.perf_counter() - t0)
        if not lib.accept(m, t):
            raise RuntimeError(f"{lib.name} refused token {t} of the document")
    return times[0], statistics.median(times[1:]), len(tokens)


def compile_times(lib, rounds: int) -> tuple[float, float]:
    """Median over SCHEMAS x rounds of (compile s, compile + matcher + first mask s)."""
    comp, first = [], []
    for _ in range(rounds):
        for s in SCHEMAS:
            t0 = time.perf_counter()
            g = lib.compile(s)
            t1 = time.perf_counter()
            lib.fill(lib.matcher(g))
            t2 = time.perf_counter()
            comp.append(t1 - t0)
            first.append(t2 - t0)
    return statistics.median(comp), statistics.median(first)


def imports_torch(module: str) -> bool:
    """Whether importing `module` alone loads torch (the server process must stay torch-free)."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def rejects(lib, schema: dict) -> bool:
    try:
        lib.matcher(lib.compile(schema))
    except Exception:  # noqa: BLE001 - any compile error counts as a rejection
        return True
    return False


def enforces(lib, tok, schema: dict, good, bad) -> str:
    """ "yes" if `lib` takes `good` and refuses `bad`; else what went wrong."""

    def takes(doc) -> bool:
        m = lib.matcher(g)
        ok = all(lib.accept(m, t) for t in tok.encode(json.dumps(doc), add_special_tokens=False))
        return ok and lib.can_end(m)

    try:
        g = lib.compile(schema)
        lib.matcher(g)
    except Exception:  # noqa: BLE001 - any failure to compile means the feature is unsupported
        return "compile error"
    if not takes(good):
        return "refuses valid"
    return "yes" if not takes(bad) else "not enforced"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tok = load_tokenizer(EngineConfig())
    libs = [LLGuidance(tok), XGrammar(tok)]
    rows = {}
    for lib in libs:
        lib.compile(PERSON)  # warm up
        firsts, meds = [], []
        for _ in range(args.rounds):
            first, med, n = mask_times(lib, tok, PERSON, PERSON_DOC)
            firsts.append(first)
            meds.append(med)
        comp, comp_first = compile_times(lib, args.rounds)
        feats = {f: enforces(lib, tok, *case) for f, case in FEATURES.items()}
        rows[lib.name] = dict(
            version=lib.version,
            tokenizer_ms=lib.tokenizer_s * 1e3,
            mask_us=statistics.median(meds) * 1e6,
            first_mask_us=statistics.median(firsts) * 1e6,
            tokens=n,
            compile_ms=comp * 1e3,
            compile_first_ms=comp_first * 1e3,
            features=feats,
            torch="yes" if imports_torch(lib.name) else "no",
            bad=f"{sum(rejects(lib, s) for s in BAD_SCHEMAS)}/{len(BAD_SCHEMAS)}",
        )
    names = [lib.name for lib in libs]
    print(f"SmolLM2-135M-Instruct vocabulary ({tok.vocab_size} tokens), CPU, torch threads 1")
    print(f"{'':34}" + "".join(f"{n:>22}" for n in names))
    for key, label in [
        ("version", "version"),
        ("tokenizer_ms", "tokenizer build (ms)"),
        ("mask_us", "mask fill / token, median (us)"),
        ("first_mask_us", "first mask (us)"),
        ("compile_ms", "schema compile, median (ms)"),
        ("compile_first_ms", "compile + first mask, median (ms)"),
        ("bad", "invalid schemas rejected"),
        ("torch", "import loads torch"),
    ]:
        vals = [rows[n][key] for n in names]
        print(f"{label:34}" + "".join(f"{v:>22}" if isinstance(v, str) else f"{v:>22.1f}" for v in vals))
    print(f"(mask over the {rows[names[0]]['tokens']} tokens of a JSON document, {args.rounds} rounds)")
    print("JSON Schema feature enforced:")
    for f in FEATURES:
        print(f"  {f:32}" + "".join(f"{rows[n]['features'][f]:>22}" for n in names))
    counts = {n: sum(v == "yes" for v in rows[n]["features"].values()) for n in names}
    lg, xg = rows["llguidance"], rows["xgrammar"]
    print(
        f"headline: llguidance {lg['mask_us']:.0f} us/token mask, {lg['compile_ms']:.2f} ms compile, "
        f"{counts['llguidance']}/{len(FEATURES)} features, torch-free; xgrammar {xg['mask_us']:.0f} us/token, "
        f"{xg['compile_ms']:.1f} ms compile, {counts['xgrammar']}/{len(FEATURES)} features"
    )


if __name__ == "__main__":
    main()
