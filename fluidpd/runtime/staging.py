"""Warm-start weights: a model staged once as safetensors (e.g. under /dev/shm) for later workers to load.

`stage_weights` writes a model's dequantised weights to a safetensors directory once, so that later
worker processes start from it instead of parsing the GGUF again (the "warm restart" of the seed's
Table 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from fluidpd.engine.config import EngineConfig


def stage_weights(config: EngineConfig, path: str, checkpoint=None) -> EngineConfig:
    """Write `config`'s model as a Hugging Face style directory at `path` (config.json,
    model.safetensors with the dequantised tensors in the engine's dtype, and the tokenizer as
    tokenizer.json + tokenizer_config.json); the EngineConfig that loads from there.

    Pass an already loaded `checkpoint` (fluidpd.engine.loaders.Checkpoint) to skip loading.
    Building the GGUF tokenizer alone takes seconds, so it is staged too (same encodings)."""
    from safetensors.torch import save_file

    from fluidpd.engine.loaders import load_checkpoint

    ckpt = checkpoint or load_checkpoint(
        config.model, config.load_format, config.torch_dtype, config.seed, config.model_overrides
    )
    if ckpt.rope_freqs is not None:
        raise ValueError("stage_weights: checkpoints with a rope_freqs tensor (llama3 GGUF) are not supported")
    os.makedirs(path, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in ckpt.tensors.items()}
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(ckpt.config.to_hf(), f)
    tokenizer = config.tokenizer
    if tokenizer is None:
        if ckpt.tokenizer is not None:
            _save_tokenizer(ckpt.tokenizer, path)  # found by the safetensors loader
        elif ckpt.tokenizer_source:
            tokenizer = ckpt.tokenizer_source
    return replace(config, model=path, load_format="safetensors", tokenizer=tokenizer)


def _save_tokenizer(tok, path: str) -> None:
    """tokenizer.json (+ config) that `Tokenizer.from_pretrained_dir` reads back identically."""
    tk = tok.tk
    bos = tok.token_str(tok.bos_token_id) if tok.bos_token_id is not None else None
    if tok.add_bos and bos is not None:  # the pretrained-dir reader relies on the post-processor
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import processors

        tk = HFTokenizer.from_str(tk.to_str())
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_token_id)]
        )
    tk.save(os.path.join(path, "tokenizer.json"))
    cfg = {
        "bos_token": bos,
        "chat_template": tok.chat_template,
        "eos_token": tok.token_str(tok.eos_token_ids[0]) if tok.eos_token_ids else None,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
