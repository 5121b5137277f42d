"""`fluidpd profile`: the real engine measured on this host, for the simulator's profiled latency model.

Each step point is the median of `repeats` timed `run_step` calls, recorded with its step shape
(the fields of `fluidpd.latency.shape.StepShape`):

  prefill   one chunk of c tokens after p tokens of earlier context
  decode    b sequences of n tokens of context each (b * n <= max_decode_tokens)
  mixed     a chunk of c fresh tokens fused into a decode step of b sequences

Then: step-time jitter (one decode step repeated: p50, p99, p99.9; delta_guard = 1.5 x the p99.9
excess; the excess of every sample over the median is the simulator's step noise), the serving
runtime's per-step dispatch overhead (plans sent to a worker process of the process backend),
KV hand-off bandwidth (export, shared-memory transport, import into a second engine),
FluidRole's remap (`resize_kv` shrinking and growing around live KV), and contention: a decode
and a prefill step timed while k = 1..workers worker processes run steps at once (of the same
kind, and of the other kind).

On one GPU (`--device cuda`: `config.gpu_config`'s grid, the decode batches within the KV its
memory holds) the parts are steps, jitter, KV hand-off and remap; dispatch and contention are
left at their neutral value and marked not measured. Shipped as specs/profiles/<gpu>-measured.json
it is the simulator's `--gpu <gpu>-measured`.
"""
