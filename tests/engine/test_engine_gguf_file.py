"""GGUFFile reads what gguf-py's GGUFReader reads: every metadata value and every tensor's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from fluidpd.engine.gguf_file import GGUFFile
from fluidpd.engine.loaders import smollm2_gguf

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def assert_same_as_gguf_py(path) -> GGUFFile:
    ours, theirs = GGUFFile(str(path)), gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}  # its own header
    assert ours.fields == fields
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data.view(np.uint8), np.asarray(b.data).view(np.uint8)), a.name
    return ours


def test_every_value_type_and_tensor_kind_reads_as_gguf_py_reads_it(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(256)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ☃")
    w.add_array("t.strs", ["a", "", "Ġthe", "☃☃"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    for qtype in (Q.Q8_0, Q.Q4_1):
        w.add_tensor(
            qtype.name, gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), qtype), raw_dtype=qtype
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = assert_same_as_gguf_py(path)
    assert f.fields["t.strs"] == ["a", "", "Ġthe", "☃☃"] and f.fields["t.u64"] == 2**63 + 5
    q = next(t for t in f.tensors if t.name == "Q4_1")
    assert q.shape == (64, 4) and q.data.shape == (4, 2 * 20)  # 2 blocks of 20 bytes per row


def test_smollm2s_metadata_and_tensors_read_as_gguf_py_reads_them():
    f = assert_same_as_gguf_py(smollm2_gguf())
    assert len(f.fields["tokenizer.ggml.tokens"]) == 49152


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(str(path))
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ValueError, match="version 1 not supported"):
        GGUFFile(str(path))
