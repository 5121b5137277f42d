"""The decoder families the engine implements and their names: a GGUF's `general.architecture` and
config.json's `model_type` and `architectures` mapped onto a family, the names config.json is written
with, and the sets of families that share a feature (`ModelConfig`'s properties read them)."""

from __future__ import annotations

ARCHITECTURES = {  # GGUF general.architecture / HF model_type -> our family member
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}
HF_NAMES = {  # our family member -> the HF `architectures` name config.json is written with
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
HF_MODEL_TYPES = {"gemma3": "gemma3_text"}  # config.json's model_type where it is not the family's name
HF_ARCHITECTURES = {name: arch for arch, name in HF_NAMES.items()} | {"MistralForCausalLM": "llama"}
QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3"})  # RMSNorm of each query and key head before RoPE
MOE = frozenset({"mixtral", "qwen3_moe"})  # a sparse mixture-of-experts MLP (fluidpd.engine.moe)
FUSED_PROJECTIONS = frozenset({"phi3"})  # checkpoints hold self_attn.qkv_proj and mlp.gate_up_proj
# GeGLU (tanh GELU), (1 + w) RMSNorms before and after attention and the MLP, embeddings scaled by sqrt(hidden)
GEMMA = frozenset({"gemma2", "gemma3"})
SLIDING, FULL = "sliding_attention", "full_attention"  # config.json's layer_types
ROPE_TYPES = ("default", "linear", "llama3")
