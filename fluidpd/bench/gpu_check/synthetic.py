"""A random-weight checkpoint written on the spot: config.json, safetensors and a tokenizer of the
model's whole vocabulary, so the GPU machine needs no model files (the SmolLM2 package is too large
to send). The 8B shape is Llama-3.1-8B's (the simulator's `llama-3.1-8b`); `tiny` is the dry run's.

The weights are drawn on the device tensor by tensor and streamed into one safetensors file: the
host holds one tensor at a time (the 8B's 1 GB embedding at most), never the 16 GB model."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.model_source import DUMMY_PRESETS, llama3_rope

if TYPE_CHECKING:
    import torch

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": DUMMY_PRESETS["llama-3.1-8b"],
    "llama-3.2-1b": DUMMY_PRESETS["llama-3.2-1b"],
    "tiny": dict(  # Llama 3's conventions (untied, llama3 RoPE, BOS/EOS ids) at a few MB
        architectures=["LlamaForCausalLM"],
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        rope_scaling=llama3_rope(8.0, 1024),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1000,
        eos_token_id=1009,
    ),
}
# Llama 3's chat format, minus the system-date preamble
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIALS = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>"}
SPECIALS[9] = "<|eot_id|>"  # offsets from bos_token_id, as in Llama 3's vocabulary
SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
WEIGHTS = "model.safetensors"
DONE = ".complete"  # written last: a directory without it is rewritten


def write_checkpoint(path: Path, shape: str, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0) -> Path:
    """`path` holding a random-weight `shape` model (written once: a finished one of the same shape,
    dtype and seed is reused). The weights are drawn on `device` (seconds for 8B on a GPU)."""
    stamp = {"shape": shape, "dtype": dtype, "seed": seed}
    done = path / DONE
    if done.is_file() and json.loads(done.read_text()) == stamp:
        return path
    path.mkdir(parents=True, exist_ok=True)
    done.unlink(missing_ok=True)
    hf = SHAPES[shape]
    cfg = ModelConfig.from_hf(hf)
    config = {**cfg.to_hf(), "torch_dtype": dtype}  # the spelling transformers 4 and 5 both read
    (path / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    write_weights(path / WEIGHTS, cfg, device, dtype, seed)
    write_tokenizer(path, cfg.vocab_size, hf["bos_token_id"])
    done.write_text(json.dumps(stamp) + "\n")
    return path


def write_weights(file: Path, cfg: ModelConfig, device: str, dtype: str, seed: int) -> int:
    """Every weight of `cfg` drawn on `device` in `dtype` and streamed into one safetensors file through
    a host buffer of the largest tensor's size; its bytes. Norms are in [0.8, 1.2], the rest normal
    with std 0.02 at the 8B's width (4,096) and scaled by 1/sqrt(width) elsewhere: the logits spread
    as the 8B's do (std about 1.3), so a narrow model's greedy tokens are not bf16 ties."""
    import torch

    from fluidpd.engine.loaders.dummy import weight_shapes

    shapes = weight_shapes(cfg)
    width = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    sizes = {name: math.prod(dims) * width for name, dims in shapes.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in shapes.items():
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(dims),
            "data_offsets": [offset, offset + sizes[name]],
        }
        offset += sizes[name]
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data 8-byte aligned, as safetensors writes it
    on_host = torch.device(device).type == "cpu"
    staging = None if on_host else torch.empty(max(sizes.values()), dtype=torch.uint8, pin_memory=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    std = 0.02 * math.sqrt(4096 / cfg.hidden_size)
    tmp = file.with_name(file.name + ".part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, dims in shapes.items():
            raw = _draw(name, dims, getattr(torch, dtype), device, gen, std).view(-1).view(torch.uint8)
            if staging is not None:  # one synchronous copy into pinned memory: no 16 GB of pageable copies
                raw = staging[: raw.numel()].copy_(raw)
            f.write(raw.numpy().data)
    os.replace(tmp, file)
    return 8 + len(head) + offset


def _draw(
    name: str, dims: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator, std: float
) -> torch.Tensor:
    import torch

    t = torch.empty(dims, dtype=torch.float32, device=device)
    if name.endswith("norm.weight"):
        t.uniform_(0.8, 1.2, generator=gen)
    else:
        t.normal_(0.0, std, generator=gen)
    return t.to(dtype)


def write_tokenizer(path: Path, vocab_size: int, bos: int) -> None:
    """A byte-level BPE tokenizer with exactly `vocab_size` tokens, as Llama 3's: the 256 byte symbols
    (GPT-2's order), a filler token for every other id (so any id the random model samples decodes),
    Llama 3's control tokens at their offsets from BOS, and BOS prepended to every encoded text."""
    from tokenizers import pre_tokenizers, processors

    from fluidpd.engine.tokenizer import TOKEN_CONTROL, _add_special, _bpe_tokenizer

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + [f"t{i}" for i in range(256, vocab_size)]
    types = [1] * vocab_size
    for off, name in SPECIALS.items():
        if bos + off < vocab_size:
            tokens[bos + off], types[bos + off] = name, TOKEN_CONTROL
    tk = _bpe_tokenizer(tokens, [], "llama3")
    _add_special(tk, tokens, types)
    bos_token = SPECIALS[0]
    tk.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B:1", special_tokens=[(bos_token, bos)]
    )
    tk.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": SPECIALS[9],
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
