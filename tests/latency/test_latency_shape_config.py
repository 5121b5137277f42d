import pytest

from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.shape import StepShape


def test_add_chunk_and_decodes():
    s = StepShape()
    s.add_chunk(4, 10)  # 4*10 pairs with prior context + 4*5/2 causal pairs
    s.add_chunk(3, 0)
    s.add_decodes(5, 700)
    assert (s.prefill_tokens, s.prefill_seqs, s.prefill_kv_read) == (7, 2, 10)
    assert s.prefill_attn_pairs == 50 + 6
    assert (s.decode_tokens, s.decode_ctx, s.tokens) == (5, 700, 12)
    s.add_chunk(0, 99)  # empty chunk is ignored
    assert s.prefill_seqs == 2
    s.clear()
    assert s == StepShape()


def test_config_validation():
    c = LatencyConfig()
    assert (c.mfu, c.bw_efficiency, c.step_overhead_s) == (0.5, 0.8, 2e-3)
    for bad in (
        dict(mfu=0.0),
        dict(attn_efficiency=1.5),
        dict(bw_efficiency=-0.1),
        dict(tp_comm_efficiency=0.0),
        dict(step_overhead_s=-1e-3),
        dict(allreduce_latency_s=float("nan")),
    ):
        with pytest.raises(ValueError):
            LatencyConfig(**bad)
