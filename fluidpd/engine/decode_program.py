"""A decode-only step's decoder layers as one C call (fluidpd/engine/kernels/decode_step.c).

The C loop calls the same kernels with the same arguments, in the same order, as `DecoderLayer.forward`
does from Python (gguf linears, the fused small ops, paged attention), so the residual stream is
bit-identical; it saves the Python and ctypes around some 270 calls a step (about 2.5 ms of a 13 ms
SmolLM2 step on two cores) and spreads decode attention over the linear kernel's thread pool.
It runs where every piece is a C kernel: GGUF linears without bias, the fused layer ops, the paged
decode kernel, a step of decode rows only, under the linear kernel's row limit; anything else (and a
profiled step, whose ops the profiler should see) takes the layer-by-layer path.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import TYPE_CHECKING, Protocol

import torch

from fluidpd.engine.gguf_linear import GgufLinear
from fluidpd.engine.kernels import KernelUnavailable, load
from fluidpd.engine.layer_ops import KV_WRITERS, FusedLayerOps, OpsStep

if TYPE_CHECKING:
    from fluidpd.engine.arena import KVArena
    from fluidpd.engine.attention_meta import AttentionMetadata
    from fluidpd.engine.decoder_layer import DecoderLayer
    from fluidpd.engine.layer_ops import LayerOps
    from fluidpd.engine.model_config import ModelConfig
    from fluidpd.engine.paged_attention import PagedDecodeAttention

_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Lin(ctypes.Structure):
    _fields_ = [("fn", _p), ("w", _p), ("type", _i64), ("rows", _i64), ("cols", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("in_norm", _p), ("post_norm", _p), ("qkv", _Lin), ("o", _Lin), ("gate_up", _Lin), ("down", _Lin)]


class _Model(ctypes.Structure):
    _fields_ = [
        ("norm", _p), ("silu", _p), ("parallel", _p),
        *[(f, _i64) for f in ("layers", "hidden", "inter", "heads", "kv_heads", "head_dim")],
        ("eps", _f32), ("scale", _f32), ("layer", ctypes.POINTER(_Layer)),
    ]  # fmt: skip


class _Step(ctypes.Structure):
    _fields_ = [
        ("rope", _p), ("attn", _p), ("k_pages", ctypes.POINTER(_p)), ("v_pages", ctypes.POINTER(_p)),
        *[(f, _i64) for f in ("kv_bytes", "block_stride", "token_stride", "block_size", "n", "threads", "max_blocks")],
        *[(f, _p) for f in ("positions", "slot_blocks", "slot_offsets", "cos", "sin", "tables", "ctx_lens")],
        *[(f, _p) for f in ("qkv", "attn_out", "o_out", "norm_out", "gu", "act", "down")],
    ]  # fmt: skip


class DecodeModel(Protocol):
    """What a program reads of its model (`fluidpd.engine.model.LlamaModel`, which builds one)."""

    config: ModelConfig
    ops: LayerOps
    paged: PagedDecodeAttention | None
    layers: list[DecoderLayer]


def _addr(fn) -> int:
    return ctypes.cast(fn, _p).value or 0


class DecodeProgram:
    """The layers of a decode-only step in one C call, over one model's weights (any arena)."""

    def __init__(self, model: DecodeModel) -> None:
        cfg, ops, paged = model.config, model.ops, model.paged
        assert isinstance(ops, FusedLayerOps) and paged is not None
        lib = load("decode_step")
        self.run = lib.decode_layers
        self.run.restype, self.run.argtypes = ctypes.c_int32, [ctypes.POINTER(_Model), ctypes.POINTER(_Step), _p]
        self.ops, self.paged = ops, paged
        lins: list[GgufLinear] = [lin for layer in model.layers for lin in layer.linears]  # type: ignore[misc]
        self.rows_limit = min(lin.mm_from_rows or 1 << 30 for lin in lins)
        self.layers = (_Layer * cfg.num_layers)(
            *[
                _Layer(layer.input_norm.data_ptr(), layer.post_norm.data_ptr(), *[_lin(lin) for lin in layer.linears])
                for layer in model.layers
            ]
        )
        self.model = _Model(
            _addr(ops.lib.add_rms_norm), _addr(ops.lib.silu_mul), _addr(lins[0].k.parallel),
            cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.rms_norm_eps, paged.scale, self.layers,
        )  # fmt: skip
        self.widths = (ops.qk_dim + ops.kv * ops.d, ops.q_dim, cfg.hidden_size, 2 * cfg.intermediate_size)
        self.hidden = cfg.hidden_size

    @staticmethod
    def for_model(model: DecodeModel) -> DecodeProgram | None:
        """The program for `model`, or None where a piece of its layer is not a C kernel."""
        if (
            not isinstance(model.ops, FusedLayerOps)
            or model.paged is None
            or model.config.qk_norm
            or model.config.num_experts
        ):
            return None
        lins = [lin for layer in model.layers for lin in layer.linears]
        if not all(isinstance(lin, GgufLinear) and lin.bias is None for lin in lins):
            return None
        try:
            return DecodeProgram(model)
        except KernelUnavailable as exc:
            warnings.warn(f"decode steps run layer by layer: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def runs(self, n: int, meta: AttentionMetadata) -> bool:
        """Whether this step (n rows) is one the program runs: decode rows only, all paged."""
        rows = meta.paged
        return (
            0 < n < self.rows_limit
            and not meta.prefills
            and not meta.decodes
            and rows is not None
            and rows.start == 0
            and rows.end == n
            and not torch.autograd._profiler_enabled()
        )

    def __call__(self, x: torch.Tensor, st: OpsStep, meta: AttentionMetadata, arena: KVArena) -> None:
        """x [n, hidden] (the embedded tokens, contiguous float32) becomes the residual stream after every layer."""
        n, rows = x.shape[0], meta.paged
        assert rows is not None and x.is_contiguous() and x.dtype == torch.float32
        kc, t = arena.k_layers[0], rows.tables  # their dtype and layout checked by the step's ops.begin
        qkv, a, o, gu = self.widths
        scratch = torch.empty(n * (qkv + a + o + gu + self.hidden))
        parts, at = [], 0
        for w in (qkv, a, o, gu, self.hidden):
            parts.append(scratch.data_ptr() + at * n * 4)
            at += w
        pages = ctypes.c_void_p * len(arena.k_layers)
        step = _Step(
            _addr(getattr(self.ops.lib, KV_WRITERS[kc.dtype])), _addr(self.paged.fns[kc.dtype]),
            pages(*[c.data_ptr() for c in arena.k_layers]), pages(*[c.data_ptr() for c in arena.v_layers]),
            kc.element_size(), kc.stride(0), kc.stride(1), kc.shape[1], n, torch.get_num_threads(), t.shape[1],
            st.positions.data_ptr(), st.slot_blocks.data_ptr(), st.slot_offsets.data_ptr(), st.cos.data_ptr(),
            st.sin.data_ptr(), t.data_ptr(), rows.ctx_lens.data_ptr(),
            parts[0], parts[1], parts[2], st.norm_out.data_ptr(), parts[3], st.act_out.data_ptr(), parts[4],
        )  # fmt: skip
        rc = self.run(ctypes.byref(self.model), ctypes.byref(step), x.data_ptr())
        if rc != 0:
            raise ValueError(f"a decode step kernel refused its arguments (code {rc})")


def _lin(lin: GgufLinear) -> _Lin:
    return _Lin(_addr(lin.kernel_fn), lin.ptr, lin.type, lin.out_features, lin.in_features)
