"""The model an engine runs: weights and tokenizer loaded for a config, or a shared model checked against it."""

from __future__ import annotations

from fluidpd.core.memory import trim_heap
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.loaders import Checkpoint, load_checkpoint, smollm2_gguf
from fluidpd.engine.model import LlamaModel
from fluidpd.engine.tokenizer import Tokenizer

MAX_DEFAULT_LEN = 8192


def load_model(config: EngineConfig, checkpoint: Checkpoint | None = None) -> tuple[LlamaModel, Tokenizer | None]:
    """Weights (and tokenizer) for `config`; share the result between engines of one process."""
    ckpt = checkpoint or load_checkpoint(
        config.model,
        config.load_format,
        config.torch_dtype,
        config.seed,
        config.model_overrides,
        keep_quantized=config.gguf_blocks,
    )
    max_len = config.max_model_len or min(ckpt.config.max_position_embeddings, MAX_DEFAULT_LEN)
    model = LlamaModel(
        ckpt, config.torch_dtype, config.torch_device, max_len, config.weight_format, config.attention, config.layer_ops
    )
    src = smollm2_gguf() if config.tokenizer == "smollm2" else config.tokenizer
    if src:
        tok = Tokenizer.load(src)
    elif ckpt.tokenizer is not None:
        tok = ckpt.tokenizer
    else:
        tok = Tokenizer.load(ckpt.tokenizer_source) if ckpt.tokenizer_source else None
    del ckpt
    trim_heap()
    return model, tok


def check_model(model: LlamaModel, config: EngineConfig) -> None:
    """ValueError when a shared model was built for another dtype, device, format or length than `config`."""
    c = config
    if model.dtype != c.torch_dtype or model.device.type != c.torch_device.type:
        raise ValueError(
            f"shared model is {model.dtype} on {model.device}, config wants {c.torch_dtype} on {c.torch_device}"
        )
    if model.quantization != c.weight_format:
        raise ValueError(f"shared model's quantization is {model.quantization!r}, config wants {c.weight_format!r}")
    if c.attention != "auto" and model.attention != c.attention:
        raise ValueError(f"shared model's decode attention is {model.attention!r}, config wants {c.attention!r}")
    if c.layer_ops != "auto" and model.layer_ops != c.layer_ops:
        raise ValueError(f"shared model's layer ops are {model.layer_ops!r}, config wants {c.layer_ops!r}")
    if c.max_model_len and c.max_model_len > model.max_positions:
        raise ValueError(f"max_model_len {c.max_model_len} exceeds the shared model's {model.max_positions}")
