"""EngineConfig: everything an engine is built from, validated once (without torch, for a cpu or
cuda device: a serving process checks it and never loads torch; CUDA's presence is checked where an
engine is built, by `torch_device`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fluidpd.core.knobs import knob
from fluidpd.engine.model_source import resolve_model

if TYPE_CHECKING:
    import torch

DTYPES = {  # accepted spelling -> torch dtype name (torch is imported only to build an engine)
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
LOAD_FORMATS = ("auto", "gguf", "safetensors", "dummy")  # "auto" + fluidpd.engine.loaders.LOADERS
QUANTIZATIONS = ("none", "fp16", "int8", "gguf", "gguf-q8")  # fluidpd.engine.linear.LINEARS (it imports torch)
LAYER_OPS = ("fused", "torch")  # fluidpd.engine.layer_ops (not imported: it imports torch)
ATTENTIONS = ("paged", "gather")  # decode attention: fluidpd.engine.paged_attention, or page gathers + SDPA
MiB = 1 << 20
_CPU_OR_CUDA = re.compile(r"(cpu|cuda)(:\d+)?")


def device_type(device: str) -> str:
    """The type of torch device `device` ("cpu", "cuda", ...); ValueError when torch would refuse it.
    Torch is imported only for a device other than cpu and cuda[:N]."""
    m = _CPU_OR_CUDA.fullmatch(device)
    if m is not None:
        return m.group(1)
    import torch

    try:
        return torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"bad device {device!r}: {exc}") from None


@dataclass
class EngineConfig:
    """How to build one engine (one worker's model, arena and scheduler).

    Arena sizing, by what is given:
      * `num_kv_blocks` only: arena = num_kv_blocks blocks + `scratch_bytes`;
      * `arena_bytes` only: KV gets everything but `scratch_bytes`;
      * both: KV gets `num_kv_blocks`, scratch the rest of `arena_bytes`;
      * neither: KV holds one max_model_len request (at least `default_kv_tokens` tokens), plus
        `scratch_bytes` (on the CPU resident only as it is used: `fluidpd.engine.arena`).
    A block's bytes are its elements times the KV dtype's size (`torch_kv_dtype`).
    """

    model: str = knob(
        "smollm2",
        "'smollm2', a .gguf file, or a safetensors directory; with --load-format dummy also a preset or config.json",
    )
    load_format: str = knob("auto", "how to read --model (auto: by its file name)", choices=LOAD_FORMATS)
    dtype: str = knob("auto", "model dtype (auto: float32 on cpu, bfloat16 on cuda)", choices=("auto", *DTYPES))
    kv_cache_dtype: str = knob(
        "auto",
        "KV cache dtype: auto (float16 where the model runs in float32 on the CPU: half the arena, the "
        "kernels convert on the KV write and read; the model dtype elsewhere), float32, float16 or bfloat16 "
        "(bfloat16 not through the CPU float32 kernels: with a float32 CPU model it needs --attention gather "
        "--layer-ops torch)",
        choices=("auto", *DTYPES),
    )
    device: str = knob("cpu", "torch device (cpu, cuda, cuda:N)")
    quantization: str = knob(
        "auto",
        "weight format of the linear layers: none (the model dtype, the reference), fp16 (fp16 weights), "
        "int8 (per-channel int8 weights, per-token int8 activations), gguf (a GGUF's Q4_1 / Q8_0 blocks "
        "read as shipped by a C kernel; float weights as fp16), gguf-q8 (gguf with activations quantised to "
        "int8 blocks, as llama.cpp computes: faster, drifts); all but none run on the CPU in float32 "
        "(auto: gguf there for a GGUF checkpoint, else fp16; none elsewhere)",
        choices=("auto", *QUANTIZATIONS),
    )
    attention: str = knob(
        "auto",
        "decode attention: paged (a C kernel reads each row's K/V pages in place; CPU float32 model, float32 "
        "or float16 KV, built with the machine's C compiler) or gather (pages copied into scratch, then "
        "SDPA); auto: paged where it builds, else gather",
        choices=("auto", *ATTENTIONS),
    )
    layer_ops: str = knob(
        "auto",
        "the small ops around the linears (residual add + RMSNorm, RoPE + KV write, silu * up): fused "
        "(one C kernel call each; CPU float32 model, float32 or float16 KV, built with the machine's C "
        "compiler) or torch (the reference); auto: fused where it builds, else torch",
        choices=("auto", *LAYER_OPS),
    )
    tokenizer: str | None = knob(
        None, "tokenizer source: a .gguf, a directory, or 'smollm2' (default: the model's own)"
    )
    block_size: int = 16
    num_kv_blocks: int | None = knob(
        None, "KV cache blocks (default: enough for one max_model_len request, at least 4096 tokens)"
    )
    arena_bytes: int | None = None
    scratch_bytes: int = 32 * MiB
    default_kv_tokens: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # the per-step token budget of the built-in scheduler
    max_model_len: int | None = knob(
        None, "longest prompt + completion (default: the model's context length, capped at 8192)"
    )
    seed: int = knob(0, "seed of the dummy (random) weights")
    model_overrides: dict[str, Any] = field(default_factory=dict)  # HF config keys (dummy shapes)
    enable_prefix_caching: bool = knob(
        True,
        "reuse the KV of cached full blocks of earlier prompts and answers (vLLM's automatic prefix "
        "caching: hash-chained blocks, LRU eviction of freed ones)",
    )

    kv_store: str = ""  # a node-shared KV store file (fluidpd.engine.kvstore.shm) behind the arena; "": none
    kv_store_bytes: int = 0  # its size, if this engine creates it

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in DTYPES:
            raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.kv_cache_dtype!r}")
        dev = device_type(self.device)
        if self.quantization != "auto" and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be 'auto' or one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.quantization not in ("auto", "none") and (dev != "cpu" or self.dtype_name != "float32"):
            raise ValueError(
                f"quantization {self.quantization!r} runs on the CPU in float32 (fbgemm); "
                f"got device {self.device!r}, dtype {self.dtype!r}"
            )
        if self.attention != "auto" and self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be 'auto' or one of {ATTENTIONS}, got {self.attention!r}")
        if self.layer_ops != "auto" and self.layer_ops not in LAYER_OPS:
            raise ValueError(f"layer_ops must be 'auto' or one of {LAYER_OPS}, got {self.layer_ops!r}")
        if self.attention == "paged" and (dev != "cpu" or self.dtype_name != "float32"):
            raise ValueError(
                f"attention 'paged' runs on the CPU in float32; got device {self.device!r}, dtype {self.dtype!r}"
            )
        if (
            self.kv_dtype_name == "bfloat16"
            and dev == "cpu"
            and self.dtype_name == "float32"
            and (self.attention != "gather" or self.layer_ops != "torch")
        ):
            raise ValueError(
                "kv_cache_dtype 'bfloat16' with a float32 model on the CPU: the paged attention and fused "
                "layer-op kernels read and write float32 or float16 KV only; use kv_cache_dtype 'float16', or "
                "attention 'gather' with layer_ops 'torch'"
            )
        _positive("block_size", self.block_size)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("default_kv_tokens", self.default_kv_tokens)
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.arena_bytes is not None:
            _positive("arena_bytes", self.arena_bytes)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.kv_store and self.kv_store_bytes < 1:
            raise ValueError("a KV store (kv_store) needs kv_store_bytes >= 1")
        if self.scratch_bytes < 0:
            raise ValueError(f"scratch_bytes must be >= 0, got {self.scratch_bytes}")

    @property
    def torch_device(self) -> torch.device:
        """The device (ValueError for CUDA where torch has none: checked here, where the engine is built)."""
        import torch

        dev = torch.device(self.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
        return dev

    @property
    def dtype_name(self) -> str:
        """The torch dtype's name: `dtype`, auto resolved (bfloat16 on cuda, float32 elsewhere)."""
        if self.dtype == "auto":
            return "bfloat16" if device_type(self.device) == "cuda" else "float32"
        return DTYPES[self.dtype]

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype_name)

    @property
    def kv_dtype_name(self) -> str:
        """The KV arena's dtype name: `kv_cache_dtype`, auto resolved (float16 for a float32 model on the
        CPU, else the model dtype)."""
        if self.kv_cache_dtype != "auto":
            return DTYPES[self.kv_cache_dtype]
        model = self.dtype_name
        return "float16" if model == "float32" and device_type(self.device) == "cpu" else model

    @property
    def torch_kv_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.kv_dtype_name)

    @property
    def weight_format(self) -> str:
        """`quantization` with auto resolved: on the CPU in float32 gguf for a GGUF file, else fp16; none otherwise."""
        if self.quantization != "auto":
            return self.quantization
        if device_type(self.device) != "cpu" or self.dtype_name != "float32":
            return "none"
        return "gguf" if self.checkpoint_format == "gguf" else "fp16"

    @property
    def gguf_blocks(self) -> bool:
        """Whether the linear layers read a GGUF's blocks as shipped (gguf, gguf-q8: the C kernel's thread pool)."""
        return self.weight_format in ("gguf", "gguf-q8")

    @property
    def checkpoint_format(self) -> str | None:
        """The load format `model` resolves to (None: it does not exist)."""
        try:
            return resolve_model(self.model, self.load_format)[1]
        except (FileNotFoundError, ValueError):
            return None

    def arena_layout(self, block_bytes: int, max_model_len: int = 0) -> tuple[int, int]:
        """(initial KV blocks, total arena bytes) for blocks of `block_bytes` bytes, on an engine whose
        longest request is `max_model_len` tokens."""
        if self.num_kv_blocks is not None and self.arena_bytes is not None:
            blocks, total = self.num_kv_blocks, self.arena_bytes
        elif self.num_kv_blocks is not None:
            blocks = self.num_kv_blocks
            total = blocks * block_bytes + self.scratch_bytes
        elif self.arena_bytes is not None:
            total = self.arena_bytes
            blocks = (total - self.scratch_bytes) // block_bytes
        else:
            blocks = -(-max(self.default_kv_tokens, max_model_len) // self.block_size)
            total = blocks * block_bytes + self.scratch_bytes
        if blocks < 1 or blocks * block_bytes > total:
            raise ValueError(f"arena of {total} bytes cannot hold {max(blocks, 1)} KV block(s) of {block_bytes} bytes")
        return blocks, total


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
