"""Worker backends (in-process and process) on the real SmolLM2 engine: same greedy tokens as a
plain engine, errors keep their type, resize through the backend, dead/closed workers fail fast."""

from __future__ import annotations

import os
import pickle
import signal
import time

import pytest
import torch
from rtbackend_help import NUM_KV_BLOCKS, decode, run_to_end, smol, start_request, tiny_config

from fluidpd.engine.block_manager import NoFreeBlocksError
from fluidpd.engine.outputs import EngineStats, ResizeResult, StepResult
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.backend import WorkerBackend, start_workers
from fluidpd.runtime.inprocess import InProcessWorker
from fluidpd.runtime.messages import RemoteError, WorkerClosedError, WorkerDiedError, portable_error
from fluidpd.runtime.process import ProcessWorker
from fluidpd.runtime.transport import release
from fluidpd.runtime.transport.shm import leftover_segments

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(900)  # a hang guard, far above the work on a loaded host


@pytest.fixture(scope="module")
def workers():
    s = smol()
    inproc = InProcessWorker(0, s.config, model=s.model, tokenizer=s.tokenizer)
    proc = ProcessWorker(1, s.staged)
    start_workers([inproc, proc])
    yield {"inprocess": inproc, "process": proc}
    inproc.close()
    proc.close()


@pytest.fixture(params=["inprocess", "process"])
def worker(request, workers):
    return workers[request.param]


def test_backends_satisfy_protocol(workers):
    for w in workers.values():
        assert isinstance(w, WorkerBackend)


def test_start_info(workers):
    s, info = smol(), workers["process"].info
    assert info.pid == workers["process"].pid != os.getpid()
    assert info.weight_load_s > 0 and info.warmup_s > 0 and info.process_start_s > 0
    assert info.total_s >= info.weight_load_s + info.warmup_s
    assert info.stats.num_kv_blocks == NUM_KV_BLOCKS and info.stats.num_used_blocks == 0
    assert info.stats.num_running == info.stats.num_waiting == 0  # warm-up left nothing behind
    assert info.kv_layout.num_layers == 30 and info.transport == "shm"
    # safetensors weights: OpenMP keeps its default wait (the gguf case: test_server_torch_free)
    assert not s.staged.gguf_blocks
    assert info.omp_wait_policy == os.environ.get("OMP_WAIT_POLICY", "")
    assert workers["inprocess"].info.pid == os.getpid() and workers["inprocess"].info.transport == "local"


@pytest.mark.parametrize("prompt", [0, 1])
def test_step_by_step_matches_generate(worker, prompt):
    s = smol()
    got = run_to_end(worker, f"gen-{prompt}", s.prompt_ids(prompt))
    assert got == s.expected(prompt)
    st = worker.submit("stats").result(timeout=30)
    assert st.num_used_blocks == 0 and st.num_running == 0


def test_batched_requests_and_pipelined_submits(worker):
    """Two requests decoded together; every call submitted without waiting (order is the contract)."""
    s = smol()
    ids = [s.prompt_ids(0), s.prompt_ids(1)]
    futs = [worker.submit("add_request", f"b{i}", p, SamplingParams(max_tokens=4)) for i, p in enumerate(ids)]
    futs += [worker.submit("run_step", StepPlan(prefills=[PrefillChunk(f"b{i}", len(p))])) for i, p in enumerate(ids)]
    futs += [worker.submit("run_step", StepPlan(decodes=["b0", "b1"])) for _ in range(3)]
    results = [f.result(timeout=60) for f in futs]
    toks = {"b0": [], "b1": []}
    for r in results[2:]:
        assert isinstance(r, StepResult)
        for o in r.outputs:
            toks[o.request_id] += o.new_token_ids
    assert toks["b0"] == s.expected(0, 4) and toks["b1"] == s.expected(1, 4)
    assert results[-1].num_decode_tokens == 2 and all(o.finished for o in results[-1].outputs)


def test_abort(worker):
    s = smol()
    start_request(worker, "ab", s.prompt_ids(0), SamplingParams(max_tokens=8))
    assert worker.submit("stats").result(timeout=30).num_used_blocks > 0
    assert worker.submit("abort", "ab").result(timeout=30) is True
    assert worker.submit("abort", "ab").result(timeout=30) is False
    assert worker.submit("stats").result(timeout=30).num_used_blocks == 0


def test_engine_errors_keep_their_type(worker):
    s = smol()
    with pytest.raises(KeyError, match="no live request 'nope'"):
        worker.submit("run_step", StepPlan(decodes=["nope"])).result(timeout=30)
    with pytest.raises(ValueError, match="prompt is empty"):
        worker.submit("add_request", "e", [], SamplingParams()).result(timeout=30)
    with pytest.raises(ValueError, match="num_blocks must be in"):
        worker.submit("resize_kv", 0).result(timeout=30)
    with pytest.raises(AttributeError, match="no method 'frobnicate'"):
        worker.submit("frobnicate").result(timeout=30)
    # a step that needs more blocks than the pool has: the engine's own NoFreeBlocksError
    big = s.prompt_ids(0) * 4
    assert worker.submit("add_request", "big", big, SamplingParams()).result(timeout=30) == "big"
    worker.submit("resize_kv", 1).result(timeout=30)
    try:
        with pytest.raises(NoFreeBlocksError, match="more KV blocks"):
            worker.submit("run_step", StepPlan(prefills=[PrefillChunk("big", len(big))])).result(timeout=30)
    finally:
        worker.submit("abort", "big").result(timeout=30)
        worker.submit("resize_kv", NUM_KV_BLOCKS).result(timeout=30)
    # the worker is still usable after errors
    assert worker.submit("ping").result(timeout=30)["worker_id"] == worker.worker_id


def test_resize_kv_through_backend(worker):
    """Shrink the KV pool to exactly the live blocks (some must move), then grow it back, while a
    request is mid-decode: it keeps producing the reference tokens."""
    s = smol()
    other = [s.prompt_ids(2)[0] + 1, *s.prompt_ids(2)[1:]]  # as long, no block in common
    start_request(worker, "fill", other, SamplingParams(max_tokens=2))  # takes the low block ids
    first, _ = start_request(worker, "rz", s.prompt_ids(2), SamplingParams(max_tokens=MAX_T))
    worker.submit("abort", "fill").result(timeout=30)
    used = worker.submit("stats").result(timeout=30).num_used_blocks
    assert used >= 2
    with pytest.raises(ValueError, match="in use"):
        worker.submit("resize_kv", used - 1).result(timeout=30)
    res = worker.submit("resize_kv", used).result(timeout=30)
    assert isinstance(res, ResizeResult) and (res.old_blocks, res.new_blocks) == (NUM_KV_BLOCKS, used)
    assert res.moved_blocks == used  # all of "rz"'s blocks sat above the new end
    st = worker.submit("stats").result(timeout=30)
    assert isinstance(st, EngineStats)
    assert (st.num_kv_blocks, st.num_used_blocks, st.num_free_blocks) == (used, used, 0)
    assert st.kv_bytes + st.scratch_bytes == st.arena_bytes
    assert worker.submit("resize_kv", NUM_KV_BLOCKS).result(timeout=30).new_blocks == NUM_KV_BLOCKS
    toks, done = decode(worker, "rz", MAX_T)
    assert done and first + toks == s.expected(2, MAX_T)


MAX_T = 6


def test_step_result_pickles():
    s = smol()
    w = InProcessWorker(9, s.config, model=s.model, tokenizer=s.tokenizer, warmup=False)
    w.start()
    try:
        start_request(w, "p", s.prompt_ids(0), SamplingParams(max_tokens=2, logprobs=3))
        r = w.submit("run_step", StepPlan(decodes=["p"])).result(timeout=30)
        back = pickle.loads(pickle.dumps(r))
        assert back.outputs[0].output.token_ids == r.outputs[0].output.token_ids
        assert back.outputs[0].logprobs[0].top == r.outputs[0].logprobs[0].top
    finally:
        w.close()


def test_unpicklable_error_becomes_remote_error():
    class Local(Exception):  # not importable by name: cannot be unpickled elsewhere
        pass

    err = portable_error(Local("boom"))
    assert isinstance(err, RemoteError) and "Local: boom" in str(err)
    assert pickle.loads(pickle.dumps(err)).remote_traceback == err.remote_traceback
    ok = portable_error(ValueError("fine"))
    assert type(ok) is ValueError and "raised in worker" in ok.__notes__[0]


def test_killed_process_fails_pending_and_later_calls():
    w = ProcessWorker(7, tiny_config())
    w.start()
    assert w.submit("ping").result(timeout=30)["pid"] == w.pid
    pending = [w.submit("ping", 30.0), w.submit("stats"), w.submit("ping")]
    time.sleep(0.2)
    os.kill(w.pid, signal.SIGKILL)
    for f in pending:
        with pytest.raises(WorkerDiedError, match=r"died \(killed by signal 9\)"):
            f.result(timeout=10)
    assert not w.alive
    later = w.submit("ping")
    assert later.done()
    with pytest.raises(RuntimeError, match="died"):
        later.result(timeout=0)
    w.close()
    w.close()


def test_close_is_idempotent_and_later_submits_fail():
    w = ProcessWorker(8, tiny_config(), kv_pool_bytes=4 << 20)
    w.start()
    start_request(w, "x", list(range(1, 40)), SamplingParams(max_tokens=4))
    h = w.submit("export_kv", "x").result(timeout=30)
    assert h.generation > 0 and h.name in leftover_segments(w.pid)  # a pooled segment
    release(h)  # marked free, still owned by the worker
    assert h.name in leftover_segments(w.pid)
    last = w.submit("ping", 0.2)  # sent before close: answered before the worker exits
    w.close()
    assert last.result(timeout=0)["worker_id"] == 8
    assert leftover_segments(w.pid) == []  # the worker unlinked its pool on the way out
    assert not w.process.is_alive()
    w.close()
    with pytest.raises(WorkerClosedError):
        w.submit("ping").result(timeout=0)
    s = smol()
    iw = InProcessWorker(3, s.config, model=s.model, tokenizer=s.tokenizer, warmup=False)
    with pytest.raises(WorkerClosedError, match="not started"):
        iw.submit("ping").result(timeout=0)
    iw.start()
    f = iw.submit("ping", 0.1)
    iw.close()
    iw.close()
    assert f.result(timeout=0)["worker_id"] == 3
    with pytest.raises(WorkerClosedError, match="closed"):
        iw.submit("stats").result(timeout=0)


def test_a_killed_workers_kv_segments_are_unlinked_when_it_is_closed():
    """kill -9 leaves its pool and any export nobody imported in /dev/shm; close() unlinks them."""
    w = ProcessWorker(9, tiny_config(), kv_pool_bytes=4 << 20)
    w.start()
    start_request(w, "x", list(range(1, 40)), SamplingParams(max_tokens=4))
    h = w.submit("export_kv", "x").result(timeout=30)  # exported, never imported
    w.kill()
    w.process.join(10)
    assert h.name in leftover_segments(w.pid)  # the dead worker could not unlink it
    w.close()
    assert leftover_segments(w.pid) == []


def test_start_failure_is_reported():
    from fluidpd.engine.config import EngineConfig
    from fluidpd.runtime.messages import WorkerStartError

    w = ProcessWorker(5, EngineConfig(model="/nonexistent/model.gguf"))
    with pytest.raises(WorkerStartError, match="model not found"):
        w.start()
    w.close()


def test_staged_weights_load_the_same_model():
    """stage_weights: safetensors + tokenizer.json in /dev/shm; same encodings (the tokens test
    above already shows the same greedy outputs from a worker started from it)."""
    from fluidpd.engine.tokenizer import Tokenizer

    s = smol()
    assert s.staged.load_format == "safetensors" and s.staged.model.startswith("/dev/shm/")
    assert s.staged.tokenizer is None
    tok = Tokenizer.load(s.staged.model)
    msgs = [{"role": "user", "content": "hi there"}]
    for text in ("The capital of France is", "héllo wörld 123\n\n  <|im_start|>x"):
        assert tok.encode(text) == s.tokenizer.encode(text)
    assert tok.encode_chat(msgs) == s.tokenizer.encode_chat(msgs)
    assert (tok.bos_token_id, tok.eos_token_ids) == (s.tokenizer.bos_token_id, s.tokenizer.eos_token_ids)


@pytest.mark.slow
def test_cold_process_from_the_gguf_matches_generate():
    """The default path: the child parses and dequantises the GGUF itself."""
    s = smol()
    w = ProcessWorker(4, s.config)
    try:
        info = w.start()
        assert info.load_format == "auto" and info.weight_load_s > 0
        assert run_to_end(w, "cold", s.prompt_ids(0)) == s.expected(0)
    finally:
        w.close()


def test_cancelled_future_still_runs_in_order(worker):
    s = smol()
    block = worker.submit("ping", 0.3)  # keeps the next call queued
    f = worker.submit("add_request", "cx", s.prompt_ids(0), SamplingParams())
    assert f.cancel() and f.cancelled()
    assert block.result(timeout=30)["worker_id"] == worker.worker_id
    st = worker.submit("stats").result(timeout=30)
    assert st.num_waiting == 1  # the cancelled call ran anyway
    assert worker.submit("abort", "cx").result(timeout=30) is True
