"""Mixture-of-experts GGUFs as llama.cpp writes them: expert metadata, stacked and per-expert expert tensors.

(The GGUF == safetensors logits of Mixtral and Qwen3-MoE: test_engine_weights; their quantised experts
through the gguf kernel: test_engine_quantization.)"""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import pytest
import torch
from gguf_testdata import Q, write_gguf
from safetensors.torch import save_file

from fluidpd.engine import EngineConfig, LLMEngine
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.loaders.gguf import load_gguf
from fluidpd.engine.quantized import QuantizedTensor

MIXTRAL = replace(tiny_config("mixtral", vocab_size=64), rms_norm_eps=2.0**-20, max_position_embeddings=128)
QWEN3_MOE = replace(  # norm_topk_prob=False, as tiny_config has it (the released Qwen3-MoE models set True)
    tiny_config("qwen3_moe", vocab_size=64), rms_norm_eps=2.0**-20, max_position_embeddings=128
)
IDS = [3, 9, 27, 1, 40, 22, 8, 63]


def test_older_per_expert_names_load_as_the_stacked_experts(tmp_path):
    """Mixtral GGUFs converted before llama.cpp stacked the experts name them blk.N.ffn_gate.E etc."""
    tensors = random_tensors(MIXTRAL, torch.float32, seed=5)
    write_gguf(tmp_path / "old.gguf", tensors, cfg=MIXTRAL, stacked=False)
    ck = load_gguf(str(tmp_path / "old.gguf"))
    assert ck.config == MIXTRAL and set(ck.tensors) == set(tensors)
    assert all(torch.equal(ck.tensors[n], t) for n, t in tensors.items())


def test_qwen3moe_renormalises_the_top_k_unless_the_file_says_otherwise(tmp_path):
    """No expert_weights_norm key (what convert_hf_to_gguf.py writes): llama.cpp's renormalised top k; the key,
    where a file has it, decides, and the engine then equals the safetensors checkpoint of that config."""
    tensors = random_tensors(QWEN3_MOE, torch.float32, seed=6)
    write_gguf(tmp_path / "a.gguf", tensors, cfg=QWEN3_MOE)
    assert load_gguf(str(tmp_path / "a.gguf")).config == replace(QWEN3_MOE, norm_topk_prob=True)
    write_gguf(tmp_path / "b.gguf", tensors, cfg=QWEN3_MOE, extra=lambda w: w.add_expert_weights_norm(False))
    ck = load_gguf(str(tmp_path / "b.gguf"))
    assert ck.config == QWEN3_MOE and ck.config.expert_intermediate_size == 48  # expert_feed_forward_length
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "config.json").write_text(json.dumps(QWEN3_MOE.to_hf()))
    save_file(tensors, str(tmp_path / "st" / "model.safetensors"))
    a = LLMEngine(EngineConfig(model=str(tmp_path / "a.gguf"), num_kv_blocks=8)).prompt_logits(IDS)
    b = LLMEngine(EngineConfig(model=str(tmp_path / "b.gguf"), num_kv_blocks=8)).prompt_logits(IDS)
    st = LLMEngine(EngineConfig(model=str(tmp_path / "st"), num_kv_blocks=8)).prompt_logits(IDS)
    assert torch.equal(b, st) and not torch.equal(a, st)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=["Q8_0", "Q4_1"])
def test_stacked_quantised_experts_are_split_into_their_blocks(tmp_path, qtype):
    """keep_quantized: each expert's slice of ffn_*_exps is its own QuantizedTensor, its blocks dequantising
    exactly to the float loader's expert of the same index; the router stays float."""
    tensors = random_tensors(MIXTRAL, torch.float32, seed=7)
    write_gguf(tmp_path / "q.gguf", tensors, qtype, cfg=MIXTRAL)
    kept = load_gguf(str(tmp_path / "q.gguf"), keep_quantized=True).tensors
    floats = load_gguf(str(tmp_path / "q.gguf")).tensors
    experts = [n for n in tensors if ".experts." in n]
    assert len(experts) == MIXTRAL.num_layers * MIXTRAL.num_experts * 3
    for n in experts:
        assert isinstance(kept[n], QuantizedTensor) and kept[n].kind == qtype.name
        assert kept[n].shape == tuple(tensors[n].shape)
        assert torch.equal(kept[n].dequantize(), floats[n])
    router = "model.layers.0.block_sparse_moe.gate.weight"
    assert torch.equal(kept[router], tensors[router])  # F32 in the file, as llama.cpp keeps it


def test_expert_count_and_unsupported_routing_are_errors(tmp_path):
    tensors = random_tensors(MIXTRAL, torch.float32, seed=8)
    write_gguf(tmp_path / "n.gguf", tensors, cfg=replace(MIXTRAL, num_experts=3))
    with pytest.raises(ValueError, match="holds 4 experts, the metadata says 3"):
        load_gguf(str(tmp_path / "n.gguf"))
    sigmoid = lambda w: w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    write_gguf(tmp_path / "s.gguf", tensors, cfg=MIXTRAL, extra=sigmoid)
    with pytest.raises(ValueError, match="gating other than softmax"):
        load_gguf(str(tmp_path / "s.gguf"))
    write_gguf(tmp_path / "sh.gguf", tensors, cfg=MIXTRAL, extra=lambda w: w.add_expert_shared_count(1))
    with pytest.raises(ValueError, match="shared experts"):
        load_gguf(str(tmp_path / "sh.gguf"))
