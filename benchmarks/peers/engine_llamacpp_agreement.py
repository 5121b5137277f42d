"""`--quantization gguf-q8` (and gguf, none) judged against llama.cpp itself on the shipped SmolLM2 GGUF.

Both engines get the same token ids (fluidpd's tokenizer and chat template, generation prompt added): llama.cpp's
server takes them as a token array on `/completion` (checked: it evaluates exactly those tokens, no BOS or template
of its own). Greedy continuations (`--tokens`, EOS ends one on both sides) are compared token by token, with the
top-1 minus top-2 logprob margin each engine saw where they first differ (a small margin is a near tie, which any
arithmetic difference may flip). llama.cpp is measured against itself the same way (a second server start; -t 1 vs
-t 2; one request at a time vs all sent at once to -np 8 --cont-batching; f16 KV + flash attention, its default, vs
f32 KV without), and so is gguf-q8 (1 vs 2 threads; one prompt at a time vs all batched in one engine; its KV dtype,
where that is a knob). Perplexity is computed as
llama-perplexity does (chunks of 512 tokens, the second half of each scored) on the held texts of
engine_quantization.py, by llama-perplexity and by fluidpd, each with its own tokenizer (the ids are compared).

    .venv/bin/python benchmarks/peers/engine_llamacpp_agreement.py [--prompts 25] [--tokens 32] [--out results/...json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # the engine group's helpers
from engine_common import engine, progress
from engine_quantization import held_texts

from fluidpd.bench.peers.llamacpp import llama_server_binary, llama_server_cmd
from fluidpd.bench.peers.process import ServerProcess, free_port
from fluidpd.engine import EngineConfig, SamplingParams
from fluidpd.engine.loaders import smollm2_gguf
from fluidpd.engine.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 512  # llama-perplexity -c
SLOT_CTX = 2048  # KV tokens per llama-server slot (the long prompt + its answer fit)
FORMATS = ("gguf-q8", "gguf", "none")
TOP_K = 10  # logprobs asked for at every position (margins use the top two; the first position compares all)

LONG = (
    "Read the passage and answer the question after it.\n\n"
    "Lighthouses were once the most important aids to navigation along dangerous coasts. The earliest known "
    "lighthouse, the Pharos of Alexandria, was built in the third century BC and stood for more than a thousand "
    "years before earthquakes brought it down. For centuries the light came from open fires of wood or coal, "
    "which burned unevenly and were hard to see in rain or fog. In the eighteenth century oil lamps with "
    "polished metal reflectors made the beams brighter, and in 1822 the French physicist Augustin Fresnel "
    "designed a lens built from concentric rings of glass prisms. His lens bent the scattered light of a single "
    "flame into a narrow, powerful beam that sailors could see more than twenty miles away. Each lighthouse was "
    "given its own pattern of flashes, so that a captain who counted the seconds between them knew exactly which "
    "light he was looking at. Keepers lived in the towers with their families, trimming wicks, winding the "
    "clockwork that turned the lens, and polishing the glass every morning. During storms they stayed awake all "
    "night to keep the flame burning. In the twentieth century electric lamps replaced the flames, and automatic "
    "timers replaced the keepers. Today satellite navigation guides most ships, but many lighthouses still shine, "
    "kept as museums or as backups for the day when electronic systems fail.\n\n"
    "Question: What did Fresnel's lens do, and why did each lighthouse have its own pattern of flashes?"
)

PROMPTS: list[tuple[str, str]] = [  # (label, user message): questions, instructions, code, lists, arithmetic, ...
    ("capital", "What is the capital of France?"),
    ("sky", "Explain why the sky is blue in two sentences."),
    ("fib", "Write a Python function that returns the n-th Fibonacci number."),
    ("red-fruits", "List five fruits that are red."),
    ("mul", "What is 17 multiplied by 23?"),
    ("to-es", "Translate 'Good morning, how are you?' into Spanish."),
    ("fr", "Quelle est la plus grande planète du système solaire ?"),
    ("de", "Wie viele Tage hat ein Schaltjahr?"),
    ("haiku", "Write a haiku about autumn leaves."),
    ("sleep", "Give me three tips for sleeping better."),
    ("http404", "What does the HTTP status code 404 mean?"),
    ("romeo", "Summarize the plot of Romeo and Juliet in one paragraph."),
    ("sql", "Write a SQL query that counts the rows in a table named users."),
    ("train", "If a train travels 60 km in 45 minutes, what is its speed in km/h?"),
    ("planets", "Name the planets of the solar system in order from the Sun."),
    ("list-tuple", "What is the difference between a list and a tuple in Python?"),
    ("email", "Write a short email asking a colleague to move our meeting to Friday."),
    ("es", "¿Cuál es el río más largo del mundo?"),
    ("recursion", "Explain recursion to a ten-year-old."),
    ("f-to-c", "Convert 100 degrees Fahrenheit to Celsius and show the steps."),
    ("bash", "Write a bash command that finds all .txt files under the current directory."),
    ("primary", "What are the primary colors?"),
    ("sequence", "Continue the sequence and explain the rule: 2, 4, 8, 16, ..."),
    ("ja", "日本の首都はどこですか？"),
    ("long", LONG),
]


# ----------------------------------------------------------------------------- runs


@dataclass
class Run:
    """One engine setting's greedy continuations: per prompt the ids, and per position the chosen token's
    logprob and the top two (id, logprob)."""

    name: str
    what: str
    seqs: list[list[int]] = field(default_factory=list)
    lps: list[list[float | None]] = field(default_factory=list)  # None: not reported (see llama_run)
    tops: list[list[list[tuple[int, float]] | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, ids: list[int], lps: list[float | None], tops: list[list[tuple[int, float]] | None]) -> None:
        self.seqs.append(list(ids))
        self.lps.append(list(lps))
        self.tops.append([None if t is None else list(t) for t in tops])

    def margin(self, k: int, i: int) -> float | None:
        """Top-1 minus top-2 logprob at position i of prompt k (None where the engine did not report it)."""
        t = self.tops[k][i] if i < len(self.tops[k]) else None
        return None if t is None or len(t) < 2 else t[0][1] - t[1][1]

    def runner_up(self, k: int, i: int) -> int | None:
        t = self.tops[k][i] if i < len(self.tops[k]) else None
        return None if t is None or len(t) < 2 else t[1][0]


def chat_ids(tok: Tokenizer, text: str) -> list[int]:
    """The ids fluidpd's server gives a one-message chat (template + generation prompt, as server/prompts.py)."""
    return tok.encode_chat([{"role": "user", "content": text}])


def kv_dtype(eng) -> str:
    """The engine's KV cache dtype (its `torch_kv_dtype` where the config has one, else the model dtype)."""
    c = eng.config
    return str(getattr(c, "torch_kv_dtype", c.torch_dtype)).removeprefix("torch.")


def fluidpd_run(name: str, eng, prompts: list[list[int]], tokens: int, threads: int, batched: bool) -> Run:
    how = "all batched" if batched else "one at a time"
    run = Run(name, f"fluidpd {eng.config.quantization}, KV {kv_dtype(eng)}, {threads} thread(s), {how}")
    params = SamplingParams(max_tokens=tokens, logprobs=TOP_K)  # greedy (temperature 0), stops at EOS
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the GGUF kernel splits rows over torch.get_num_threads() too
    try:
        if batched:
            outs = eng.generate(prompts, params)
        else:
            outs = [eng.generate([p], params)[0] for p in progress(prompts, name)]
    finally:
        torch.set_num_threads(before)
    for o in outs:
        tops = [sorted(lp.top.items(), key=lambda kv: -kv[1]) for lp in o.logprobs]
        run.add(o.token_ids, [lp.logprob for lp in o.logprobs], tops)
    return run


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, extra = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTE_DECODER = _byte_decoder()


def token_bytes(tok: Tokenizer, token_id: int) -> bytes:
    s = tok.token_str(token_id) or ""
    return bytes(BYTE_DECODER[c] for c in s) if all(c in BYTE_DECODER for c in s) else s.encode()


def utf8_complete(buf: bytes) -> bool:
    """llama-server's validate_utf8: False while the text ends inside a multi-byte character."""
    for i in range(1, min(4, len(buf)) + 1):
        c = buf[-i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or ((c & 0xF8) == 0xF0 and i < 4):
            return False
    return True


def reported_positions(tok: Tokenizer, ids: list[int]) -> list[int]:
    """The positions llama-server reports probabilities for: it drops a token's probabilities when the text so far
    ends inside a UTF-8 character (the token that completes the character gets its own)."""
    out, buf = [], b""
    for i, t in enumerate(ids):
        buf += token_bytes(tok, t)
        if utf8_complete(buf):
            out.append(i)
    return out


def llama_server(threads: int, parallel: int, extra: list[str], log: Path) -> ServerProcess:
    port = free_port()
    cmd = llama_server_cmd(llama_server_binary(), smollm2_gguf(), port, threads, parallel, parallel * SLOT_CTX)
    return ServerProcess("llama-server", [*cmd, *extra], f"http://127.0.0.1:{port}", log)


def llama_body(ids: list[int], tokens: int) -> dict:
    return {
        "prompt": ids, "n_predict": tokens, "temperature": 0, "top_k": 1, "cache_prompt": False,
        "n_probs": TOP_K, "return_tokens": True,
    }  # fmt: skip


async def _llama_all(url: str, prompts: list[list[int]], tokens: int, concurrent: bool, desc: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(ids: list[int], bar) -> dict:
            r = await client.post("/completion", json=llama_body(ids, tokens))
            r.raise_for_status()
            bar.update(1)
            return r.json()

        with progress(range(len(prompts)), desc) as bar:
            if concurrent:  # all at once: the server runs `parallel` of them, continuously batched
                return list(await asyncio.gather(*(one(p, bar) for p in prompts)))
            return [await one(p, bar) for p in prompts]


def llama_run(
    name: str, what: str, tok: Tokenizer, prompts: list[list[int]], tokens: int, *, threads: int, parallel: int = 1,
    concurrent: bool = False, extra: tuple[str, ...] = (), logdir: Path,
) -> Run:  # fmt: skip
    run = Run(name, what)
    with llama_server(threads, parallel, list(extra), logdir / f"{name}.log") as srv:
        answers = asyncio.run(_llama_all(srv.url, prompts, tokens, concurrent, name))
    for k, (ids, r) in enumerate(zip(prompts, answers)):
        probs, out = r["completion_probabilities"], list(r["tokens"])  # `tokens`: every generated id
        where = reported_positions(tok, out)
        if [out[i] for i in where] != [p["id"] for p in probs]:
            run.notes.append(f"prompt {k}: probabilities for {[p['id'] for p in probs]} do not align with {out}")
            where = []
        if r.get("tokens_evaluated") != len(ids):
            run.notes.append(f"prompt {k}: llama-server evaluated {r.get('tokens_evaluated')} tokens, sent {len(ids)}")
        if r.get("prompt") is not None and r["prompt"] != tok.decode(ids, skip_special_tokens=False):
            run.notes.append(f"prompt {k}: llama-server's prompt text differs from the ids' text")
        lps: list[float | None] = [None] * len(out)
        tops: list[list[tuple[int, float]] | None] = [None] * len(out)
        for i, p in zip(where, probs):
            top = sorted(((t["id"], t["logprob"]) for t in p["top_logprobs"]), key=lambda t: -t[1])
            lps[i], tops[i] = p["logprob"], top
        if len(where) < len(out):
            run.notes.append(f"prompt {k}: no probabilities at {len(out) - len(where)} position(s) inside UTF-8 chars")
        run.add(out, lps, tops)
    return run


# ----------------------------------------------------------------------------- comparison


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The first position where a and b differ (one ending early counts), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(a: Run, b: Run, labels: list[str], tok: Tokenizer) -> dict:
    equal, prefixes, dlp, divs, first = 0, [], [], [], []
    for k, (sa, sb) in enumerate(zip(a.seqs, b.seqs)):
        ta0, tb0 = a.tops[k][0] if a.tops[k] else None, b.tops[k][0] if b.tops[k] else None
        if ta0 is not None and tb0 is not None:  # the first position: the prompt alone, no history to differ
            da, db = dict(ta0), dict(tb0)
            if da.keys() & db.keys():
                first.append(max(abs(da[t] - db[t]) for t in da.keys() & db.keys()))
        i = first_diff(sa, sb)
        common = len(sa) if i is None else i
        prefixes.append(common)
        dlp += [abs(x - y) for x, y in zip(a.lps[k][:common], b.lps[k][:common]) if x is not None and y is not None]
        if i is None:
            equal += 1
            continue
        ta, tb = (s[i] if i < len(s) else None for s in (sa, sb))
        divs.append(
            {
                "prompt": k, "label": labels[k], "pos": i,
                "token_a": ta, "token_b": tb,
                "text_a": None if ta is None else tok.decode([ta], skip_special_tokens=False),
                "text_b": None if tb is None else tok.decode([tb], skip_special_tokens=False),
                "margin_a": a.margin(k, i), "margin_b": b.margin(k, i),
                "runner_up_a": a.runner_up(k, i), "runner_up_b": b.runner_up(k, i),
            }
        )  # fmt: skip
    return {
        "a": a.name, "b": b.name, "n": len(a.seqs), "equal": equal,
        "mean_prefix": statistics.fmean(prefixes), "mean_len": statistics.fmean(len(s) for s in a.seqs),
        "dlp_median": statistics.median(dlp) if dlp else math.nan, "dlp_max": max(dlp, default=math.nan),
        "top_first_median": statistics.median(first) if first else math.nan,
        "top_first_max": max(first, default=math.nan), "divergences": divs,
    }  # fmt: skip


def all_margins(run: Run) -> list[float]:
    ms = (run.margin(k, i) for k in range(len(run.seqs)) for i in range(len(run.seqs[k])))
    return [m for m in ms if m is not None]


# ----------------------------------------------------------------------------- perplexity


def llama_bin(name: str) -> Path:
    return llama_server_binary().resolve().parent / name


def llama_tokens(text_file: Path) -> list[int]:
    """llama.cpp's ids for the file (llama-tokenize, the vocabulary's own BOS rule, as llama-perplexity)."""
    cmd = [str(llama_bin("llama-tokenize")), "-m", smollm2_gguf(), "-f", str(text_file), "--ids", "--log-disable"]
    cmd += ["--no-escape", "--no-parse-special"]  # as llama-perplexity reads and tokenizes its file
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in reversed(out.splitlines()) if ln.startswith("["))
    return json.loads(line)


def llama_perplexity(text_file: Path, threads: int, batch: int, log: Path) -> dict:
    cmd = [str(llama_bin("llama-perplexity")), "-m", smollm2_gguf(), "-f", str(text_file), "-c", str(N_CTX)]
    cmd += ["-t", str(threads), "-b", str(batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    text = proc.stdout + proc.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    c = re.search(r"calculating perplexity over (\d+) chunks", text)
    if proc.returncode != 0 or not m or not c:
        raise RuntimeError(f"llama-perplexity failed (rc {proc.returncode}); log {log}")
    chunks = int(c.group(1))
    return {"ppl": float(m.group(1)), "err": float(m.group(2)), "chunks": chunks, "scored": chunks * (N_CTX // 2 - 1)}


def fluidpd_perplexity(eng, ids: list[int], bos: int | None) -> dict:
    """llama-perplexity's method: chunks of N_CTX tokens (the first replaced by BOS if the vocabulary adds one),
    logits at positions N_CTX/2 .. N_CTX-2 scored against the next token; PPL and its +/- as it prints them."""
    first, chunks = N_CTX // 2, len(ids) // N_CTX
    nll = nll2 = 0.0
    count = 0
    for c in progress(range(chunks), f"ppl {eng.config.quantization}"):
        chunk = ids[c * N_CTX : (c + 1) * N_CTX]
        if bos is not None:
            chunk = [bos, *chunk[1:]]
        logp = torch.log_softmax(eng.prompt_logits(chunk)[first : N_CTX - 1].double(), -1)
        x = -logp.gather(1, torch.tensor(chunk[first + 1 :])[:, None])[:, 0]
        nll, nll2, count = nll + x.sum().item(), nll2 + (x * x).sum().item(), count + x.numel()
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    return {
        "ppl": ppl,
        "err": math.sqrt(max(mean2 - mean * mean, 0) / (count - 1)) * ppl,
        "chunks": chunks,
        "scored": count,
    }


# ----------------------------------------------------------------------------- report


def engine_tree() -> dict:
    """The commit and the uncommitted engine files the run used (read-only git; others edit the tree)."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    changed = git("status", "--porcelain", "--", "fluidpd/engine").splitlines()
    return {"head": git("rev-parse", "--short", "HEAD") or "?", "engine_changes": len(changed), "files": changed}


def fmt_div(d: dict) -> str:
    ma, mb = (f"{m:.3f}" if m is not None else "?" for m in (d["margin_a"], d["margin_b"]))
    known = d["runner_up_a"] is not None and d["runner_up_b"] is not None
    swap = d["runner_up_a"] == d["token_b"] and d["runner_up_b"] == d["token_a"]
    flag = "top-2 swapped" if swap else "not a swap" if known else "?"
    return f"{d['label']}@{d['pos']}: {d['text_a']!r}/{d['text_b']!r} margin {ma}/{mb} ({flag})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} prompts")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--out", default=str(ROOT / "results" / "engine_llamacpp_agreement.json"))
    ap.add_argument("--no-ppl", action="store_true", help="skip the perplexity part")
    args = ap.parse_args()
    t0 = time.perf_counter()
    chosen = PROMPTS[: args.prompts]
    labels = [label for label, _ in chosen]
    tok = Tokenizer.load(smollm2_gguf())
    prompts = [chat_ids(tok, text) for _, text in chosen]
    n, T = len(prompts), args.tokens
    logdir = Path(tempfile.mkdtemp(prefix="llamacpp_agreement_"))
    print(f"{n} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {T} greedy tokens; logs {logdir}")
    tree = engine_tree()
    print(f"fluidpd at {tree['head']}, {tree['engine_changes']} uncommitted file(s) under fluidpd/engine")

    # --- llama.cpp, one server start per setting
    L = {}
    common = {"tok": tok, "prompts": prompts, "tokens": T, "logdir": logdir}
    L["llama t2"] = llama_run("llama t2", "llama-server -t 2 -np 1, one at a time", threads=2, **common)
    L["llama t2 again"] = llama_run("llama t2 again", "the same, a second server start", threads=2, **common)
    L["llama t1"] = llama_run("llama t1", "llama-server -t 1 -np 1, one at a time", threads=1, **common)
    L["llama np8"] = llama_run(
        "llama np8", "llama-server -t 2 -np 8 --cont-batching, all sent at once", threads=2, parallel=8,
        concurrent=True, **common,
    )  # fmt: skip
    L["llama f32kv"] = llama_run(
        "llama f32kv", "llama-server -t 2 -np 1 -fa off -ctk f32 -ctv f32, one at a time", threads=2,
        extra=("-fa", "off", "-ctk", "f32", "-ctv", "f32"), **common,
    )  # fmt: skip

    # --- fluidpd in-process (no prefix cache: every prompt prefilled from scratch, as cache_prompt false)
    engines = {q: engine(512, quantization=q, enable_prefix_caching=False) for q in FORMATS}
    q8kv = kv_dtype(engines["gguf-q8"])
    F = {}
    F["q8 t1"] = fluidpd_run("q8 t1", engines["gguf-q8"], prompts, T, threads=1, batched=False)
    F["q8 t2"] = fluidpd_run("q8 t2", engines["gguf-q8"], prompts, T, threads=2, batched=False)
    F["q8 batched"] = fluidpd_run("q8 batched", engines["gguf-q8"], prompts, T, threads=1, batched=True)
    F["gguf t1"] = fluidpd_run("gguf t1", engines["gguf"], prompts, T, threads=1, batched=False)
    F["none t1"] = fluidpd_run("none t1", engines["none"], prompts, T, threads=1, batched=False)
    other_kv = None
    if "kv_cache_dtype" in EngineConfig.__dataclass_fields__:  # the KV dtype is a knob: gguf-q8 with the other one
        other_kv = "float32" if q8kv == "float16" else "float16"
        eng = engine(512, quantization="gguf-q8", enable_prefix_caching=False, kv_cache_dtype=other_kv)
        F[f"q8 kv {other_kv[-2:]}"] = fluidpd_run(f"q8 kv {other_kv[-2:]}", eng, prompts, T, threads=1, batched=False)
    runs = {**L, **F}

    # --- comparisons
    pairs = [
        ("llama t2", "llama t2 again", "llama.cpp run to run"),
        ("llama t1", "llama t2", "llama.cpp threads"),
        ("llama t2", "llama np8", "llama.cpp batching"),
        ("llama t2", "llama f32kv", "llama.cpp KV f16+FA / f32"),
        ("q8 t1", "q8 t2", "gguf-q8 threads"),
        ("q8 t1", "q8 batched", "gguf-q8 batching"),
        ("q8 t1", "llama t2", "gguf-q8 vs llama.cpp"),
        ("gguf t1", "llama t2", "gguf vs llama.cpp"),
        ("none t1", "llama t2", "none vs llama.cpp"),
        ("q8 t1", "llama f32kv", "gguf-q8 vs llama f32kv"),
        ("gguf t1", "llama f32kv", "gguf vs llama f32kv"),
        ("none t1", "llama f32kv", "none vs llama f32kv"),
        ("q8 t1", "none t1", "gguf-q8 vs none"),
        ("gguf t1", "none t1", "gguf vs none"),
    ]
    if other_kv is not None:
        q8_16, q8_32 = ("q8 t1", "q8 kv 32") if q8kv == "float16" else ("q8 kv 16", "q8 t1")
        pairs += [
            (q8_16, q8_32, "gguf-q8 KV f16 / f32"),
            (q8_16, "llama t2", "gguf-q8 KV16 vs llama.cpp"),
            (q8_32, "llama f32kv", "gguf-q8 KV32 vs llama f32kv"),
        ]
    results = {what: compare(runs[a], runs[b], labels, tok) for a, b, what in pairs}

    print("\nruns:")
    for r in runs.values():
        m = all_margins(r)
        print(
            f"  {r.name:14} {r.what:64} mean len {statistics.fmean(map(len, r.seqs)):5.1f}, "
            f"median top-1/top-2 margin {statistics.median(m):.3f}, {sum(x < 0.05 for x in m)} of {len(m)} under 0.05"
        )
        for note in r.notes:
            print(f"    ! {note}")
    names = list(runs)
    print(f"\ngreedy continuations equal (of {n}), every pair of runs:")
    print(" " * 15 + " ".join(f"{x:>14}" for x in names))
    for a in names:
        row = [sum(x == y for x, y in zip(runs[a].seqs, runs[b].seqs)) for b in names]
        print(f"{a:14} " + " ".join(f"{v:>14}" for v in row))
    print(
        f"\n{'pair (A / B)':28} {'equal':>6} {'prefix':>7} {'|dlp| med':>10} {'|dlp| max':>10} {'top@0 med':>10} "
        f"{'top@0 max':>10}  first differences"
    )
    for what, c in results.items():
        print(
            f"{what:28} {c['equal']:>3}/{c['n']:<2} {c['mean_prefix']:7.1f} {c['dlp_median']:10.2e} "
            f"{c['dlp_max']:10.2e} {c['top_first_median']:10.2e} {c['top_first_max']:10.2e}  "
            f"{len(c['divergences'])} differ"
        )
        for d in c["divergences"]:
            print(" " * 31 + fmt_div(d))
    print(
        "  (prefix: mean common prefix in tokens, of a mean length "
        f"{statistics.fmean(map(len, runs['llama t2'].seqs)):.1f}; |dlp|: |chosen-token logprob A - B| over the common "
        f"prefixes; top@0: per prompt the largest |logprob A - B| over the tokens in both top-{TOP_K} lists at the "
        "first generated position (the prompt alone); margin: top-1 minus top-2 logprob at the first difference "
        "as A / B saw it, ? where llama-server reports none (inside a UTF-8 character))"
    )

    # --- perplexity
    ppl = {}
    ppl_tokens = {}
    if not args.no_ppl:
        text_file = logdir / "held.txt"
        text_file.write_text("\n\n".join(held_texts().values()), encoding="utf-8")
        text = text_file.read_text(encoding="utf-8")
        lids = llama_tokens(text_file)
        fids = tok.encode(text)
        i = first_diff(lids, fids)
        ppl_tokens = {"llama.cpp": len(lids), "fluidpd": len(fids), "first_difference": i}
        settings = (("llama.cpp -t 2", 2, 2048), ("llama.cpp -t 1", 1, 2048), ("llama.cpp -t 2 -b 512", 2, 512))
        for name, t, b in progress(settings, "llama-perplexity"):
            ppl[name] = llama_perplexity(text_file, t, b, logdir / f"ppl_t{t}_b{b}.log") | {"tokens": len(lids)}
        bos = tok.bos_token_id if tok.add_bos else None
        for q in FORMATS:
            ppl[f"fluidpd {q}"] = fluidpd_perplexity(engines[q], fids, bos) | {"tokens": len(fids)}
        if i is not None:  # tokenizers disagree: also score llama.cpp's ids
            for q in FORMATS:
                ppl[f"fluidpd {q} (llama.cpp's ids)"] = fluidpd_perplexity(engines[q], lids, bos) | {
                    "tokens": len(lids)
                }
        print(f"\nperplexity, held texts ({len(text)} characters), -c {N_CTX}: second half of each chunk scored")
        print(f"{'engine':34} {'tokens':>7} {'chunks':>6} {'scored':>7} {'PPL':>9} {'+/-':>8}")
        for name, p in ppl.items():
            print(f"{name:34} {p['tokens']:7} {p['chunks']:6} {p['scored']:7} {p['ppl']:9.4f} {p['err']:8.4f}")
        print(
            f"  tokenizers: llama.cpp {len(lids)} ids, fluidpd {len(fids)} ids, "
            + ("identical" if i is None else f"first difference at id {i}")
        )

    wall = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "prompts": [{"label": lab, "ids": p} for lab, p in zip(labels, prompts)],
                "tokens": T, "runs": {k: asdict(r) for k, r in runs.items()}, "pairs": results,
                "perplexity": ppl, "perplexity_tokens": ppl_tokens, "wall_s": wall, "tree": tree,
            },
            indent=1,
        )
    )  # fmt: skip
    print(f"\nwall {wall:.0f} s; written {out}")
    eq = lambda what: f"{results[what]['equal']}/{n}"
    head = (
        f"gguf-q8 vs llama.cpp: {eq('gguf-q8 vs llama.cpp')} greedy continuations equal (llama.cpp vs itself: "
        f"{eq('llama.cpp threads')} across threads, {eq('llama.cpp batching')} across batching, "
        f"{eq('llama.cpp run to run')} run to run; gguf-q8 vs itself: "
        f"{eq('gguf-q8 threads')} across threads, {eq('gguf-q8 batching')} across batching); "
        f"gguf vs llama.cpp: {eq('gguf vs llama.cpp')}; none vs llama.cpp: {eq('none vs llama.cpp')}"
    )
    if ppl:
        head += "; PPL " + ", ".join(
            f"{k} {ppl[k]['ppl']:.4f}" for k in ("llama.cpp -t 2", *(f"fluidpd {q}" for q in FORMATS))
        )
    print(head)


if __name__ == "__main__":
    main()
