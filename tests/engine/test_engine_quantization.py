"""Quantised linear layers (fp16, int8) against the unquantised fp32 reference on the shipped GGUF; GGUF blocks
of every architecture (experts included) through the gguf kernel against the same file dequantised."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from engine_testdata import MAX_TOKENS, PROMPTS
from gguf_testdata import Q, write_gguf

from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, load_model
from fluidpd.engine.config import QUANTIZATIONS
from fluidpd.engine.gguf_linear import GgufLinear
from fluidpd.engine.linear import LINEARS
from fluidpd.engine.loaders.dummy import random_tensors, tiny_config
from fluidpd.engine.model_config import ModelConfig
from fluidpd.engine.moe import moe_tensor_names

# The stated tolerances (README, "Quantised weights"); measured on HELD below: fp16 max |dlogit|
# 0.2% of the largest logit and perplexity equal to 4 digits; int8 perplexity +3..6% (8-bit
# activations, VNNI) or +15..25% (7-bit, AVX2), top-1 agreement 80..90%.
FP16_LOGIT_REL = 0.01
FP16_PPL_REL = 0.002
INT8_PPL_REL = 0.35
INT8_TOP1 = 0.7

HELD = (
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion "
    "about the rising cost of maintenance, the members agreed to postpone the purchase of new equipment "
    "and to spend the savings on repairs to the old library roof, which had leaked through the winter. "
    "The treasurer warned that the reserve fund would fall below its target unless donations improved, "
    "and the chair asked each member to bring one idea for raising money to the next meeting."
)


@pytest.fixture(scope="module")
def models(smol):
    out = {"none": smol}
    for q in ("fp16", "int8"):
        out[q] = load_model(EngineConfig(quantization=q))
    return out


def _engine(models, q: str, **kw) -> LLMEngine:
    model, tok = models[q]
    return LLMEngine(EngineConfig(quantization=q, **kw), model=model, tokenizer=tok)


def _ppl(logits: torch.Tensor, ids: list[int]) -> float:
    lp = torch.log_softmax(logits[:-1].double(), -1)
    return math.exp(-lp.gather(1, torch.tensor(ids[1:])[:, None]).mean().item())


def test_auto_is_fp16_for_float32_on_cpu_and_none_otherwise():
    assert EngineConfig(load_format="dummy").weight_format == "fp16"  # a GGUF gets gguf (test_engine_gguf_linear)
    assert EngineConfig(dtype="bfloat16").weight_format == "none"
    assert EngineConfig(quantization="int8").weight_format == "int8"
    with pytest.raises(ValueError, match="runs on the CPU in float32"):
        EngineConfig(quantization="int8", dtype="bfloat16")
    with pytest.raises(ValueError, match="quantization must be"):
        EngineConfig(quantization="q3")
    assert set(QUANTIZATIONS) == set(LINEARS.names())  # the config's list is the registry's


@pytest.mark.slow
def test_quantised_weights_stream_fewer_bytes(models):
    full = models["none"][0].weight_bytes()
    assert models["fp16"][0].weight_bytes() < 0.55 * full
    assert models["int8"][0].weight_bytes() < 0.35 * full


@pytest.mark.slow
def test_fp16_logits_and_perplexity_stay_within_the_stated_tolerance(models):
    ref_eng, eng = _engine(models, "none", num_kv_blocks=16), _engine(models, "fp16", num_kv_blocks=16)
    ids = ref_eng.tokenizer.encode(HELD)
    ref, got = ref_eng.prompt_logits(ids), eng.prompt_logits(ids)
    assert (got - ref).abs().max().item() <= FP16_LOGIT_REL * ref.abs().max().item()
    assert (got - ref).abs().max().item() > 0  # the fp16 path really ran
    assert abs(_ppl(got, ids) / _ppl(ref, ids) - 1) <= FP16_PPL_REL


@pytest.mark.slow
def test_fp16_greedy_outputs_equal_the_reference(models, reference):
    eng = _engine(models, "fp16", num_kv_blocks=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == reference


@pytest.mark.slow
def test_int8_perplexity_and_top1_stay_within_the_stated_tolerance(models):
    ref_eng, eng = _engine(models, "none", num_kv_blocks=16), _engine(models, "int8", num_kv_blocks=16)
    ids = ref_eng.tokenizer.encode(HELD)
    ref, got = ref_eng.prompt_logits(ids), eng.prompt_logits(ids)
    drift = _ppl(got, ids) / _ppl(ref, ids) - 1
    assert abs(drift) <= INT8_PPL_REL
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= INT8_TOP1


def test_int8_rows_are_independent_of_the_rest_of_the_batch():
    torch.manual_seed(0)
    w = torch.randn(96, 64)
    lin = LINEARS.build("int8", w)
    x = torch.randn(5, 64)
    x[3] *= 1000  # a row with a huge range must not coarsen the others' quantisation
    whole = lin(x)
    for i in range(5):
        assert torch.equal(lin(x[i : i + 1]), whole[i : i + 1])
        exact = x[i] @ w.t()
        assert (whole[i] - exact).abs().max().item() <= 0.03 * exact.abs().max().item()


@pytest.mark.slow
def test_fp16_chunked_prefill_and_batched_decode_match_each_prompt_alone(models):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    alone = [_engine(models, "fp16", num_kv_blocks=64).generate([p], params)[0].token_ids for p in PROMPTS]
    batched = _engine(models, "fp16", num_kv_blocks=64, max_num_batched_tokens=16).generate(PROMPTS, params)
    assert [o.token_ids for o in batched] == alone


@pytest.mark.slow
def test_tied_embedding_rows_come_from_the_quantised_table(models):
    ids = torch.tensor([0, 17, 4000, 49151])
    ref = models["none"][0].embed_tokens(ids)
    for q, tol in (("fp16", 1e-3), ("int8", 0.02)):
        got = models[q][0].embed_tokens(ids)
        assert got.dtype == torch.float32
        assert (got - ref).abs().max().item() <= tol * ref.abs().max().item()


# The gguf kernel against dequantise-then-torch.mm of the same blocks: both exact float32 weights, summed in
# another order, the kernel's Q4_1 as d * sum(q x) + m * sum(x), which cancel (bounded per output in
# test_engine_gguf_linear). Measured max |dlogit| <= 4.1e-5 of the largest logit here, the same with
# ATEN_CPU_CAPABILITY=default: the kernel gives the same bits on every instruction set, only the torch reference's
# last bits (~1e-6) move with the CPU; the routers' top-k logit margins are >= 2e-3, so no expert choice flips.
GGUF_KERNEL_LOGIT_REL = 3e-4
# blocks dequantise within half a step of the weights written: amax / 254 (Q8_0), range / 30 (Q4_1), fp16 scales
HALF_STEP = {"Q8_0": 1 / 127, "Q4_1": 1 / 15}  # of the largest |weight|
BLOCK_ARCHS = {  # every linear's columns whole blocks of 32 (tiny qwen3_moe's 48-wide experts are not)
    "qwen3": replace(tiny_config("qwen3"), tie_word_embeddings=True),
    "phi3": tiny_config("phi3"),
    "mixtral": tiny_config("mixtral"),
    "qwen3_moe": replace(tiny_config("qwen3_moe"), moe_intermediate_size=64, norm_topk_prob=True),
    # tied lm_head; columns 64, 128 (o_proj), 96 (down_proj); the window of 8 under IDS' 12 tokens, the caps, and
    # gemma3's per-layer pattern in the file; its scores scaled by head_dim (a GGUF carries no other scale)
    "gemma2": tiny_config("gemma2"),
    "gemma3": tiny_config("gemma3"),
}
IDS = [5, 17, 99, 3, 64, 120, 7, 33, 2, 81, 45, 12]


def _layer_weights(cfg: ModelConfig, w: dict[str, torch.Tensor], i: int) -> list[torch.Tensor]:
    """The weights layer i's linears compute with, from the checkpoint's: q|k|v, o, then gate|up and down
    (each expert's in expert order with MoE); Phi-3 ships q|k|v and gate|up fused."""
    p = f"model.layers.{i}."
    fused = lambda name, parts: w[p + name] if p + name in w else torch.cat([w[p + x] for x in parts])
    qkv = fused("self_attn.qkv_proj.weight", [f"self_attn.{x}_proj.weight" for x in "qkv"])
    out = [qkv, w[p + "self_attn.o_proj.weight"]]
    if not cfg.num_experts:
        gate_up = fused("mlp.gate_up_proj.weight", ["mlp.gate_proj.weight", "mlp.up_proj.weight"])
        return [*out, gate_up, w[p + "mlp.down_proj.weight"]]
    _, *experts = moe_tensor_names(cfg, p)
    for gate, up, down in zip(experts[::3], experts[1::3], experts[2::3], strict=True):
        out += [torch.cat([w[gate], w[up]]), w[down]]
    return out


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=["Q8_0", "Q4_1"])
@pytest.mark.parametrize("arch", list(BLOCK_ARCHS))
def test_gguf_blocks_of_every_architecture_run_through_the_kernel(tmp_path, arch, qtype):
    """llama.cpp's Q8_0 / Q4_1 GGUF of each architecture under --quantization gguf: every linear layer (each
    expert's, Phi-3's fused q|k|v and gate|up, the tied or untied lm_head) is the kernel's, on blocks that
    dequantise to the weights written; logits equal the dequantised file's within the stated tolerance and
    greedy continuations are the same."""
    cfg = BLOCK_ARCHS[arch]
    tensors = random_tensors(cfg, torch.float32, seed=3)
    write_gguf(tmp_path / "m.gguf", tensors, qtype, cfg=cfg)
    kernel = LLMEngine(EngineConfig(model=str(tmp_path / "m.gguf"), quantization="gguf", num_kv_blocks=16))
    floats = LLMEngine(EngineConfig(model=str(tmp_path / "m.gguf"), quantization="none", num_kv_blocks=16))
    model = kernel.model
    assert isinstance(model.lm_head, GgufLinear) and model.lm_head.weight.kind == qtype.name
    for i, layer in enumerate(model.layers):
        want = _layer_weights(cfg, tensors, i)
        assert len(layer.linears) == len(want)
        for lin, w in zip(layer.linears, want, strict=True):
            assert isinstance(lin, GgufLinear) and lin.weight.kind == qtype.name
            assert (lin.weight.dequantize() - w).abs().max() <= HALF_STEP[qtype.name] * w.abs().max()
    got, ref = kernel.prompt_logits(IDS), floats.prompt_logits(IDS)
    assert (got - ref).abs().max().item() <= GGUF_KERNEL_LOGIT_REL * ref.abs().max().item()
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    assert kernel.generate([IDS], params)[0].token_ids == floats.generate([IDS], params)[0].token_ids
