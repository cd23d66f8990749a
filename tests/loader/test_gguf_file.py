"""GGUFFile (the loader's own GGUF reader) against the `gguf` package's GGUFReader: the same
metadata values for every value type, the same tensor table and bytes, on a written file and
on the real models; clear errors for files that are not GGUF or are cut short."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants

from vllmx.loader.gguf import load_gguf
from vllmx.loader.gguf_file import GGUFFile
from vllmx.loader.gguf_metadata import read_gguf_metadata


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "all_types.gguf")
    w = GGUFWriter(path, "llama")
    for add, key, value in [(w.add_uint8, "u8", 200), (w.add_int8, "i8", -100),
                            (w.add_uint16, "u16", 60000), (w.add_int16, "i16", -30000),
                            (w.add_uint32, "u32", 4_000_000_000), (w.add_int32, "i32", -2**31),
                            (w.add_uint64, "u64", 2**63 + 5), (w.add_int64, "i64", -2**62),
                            (w.add_float32, "f32", 0.1), (w.add_float64, "f64", 0.1),
                            (w.add_bool, "b", True), (w.add_string, "s", "héllo ▁ wörld")]:
        add(f"t.{key}", value)
    w.add_array("t.strings", ["a", "", "ünï", "<0x0A>"] * 50)
    w.add_array("t.ints", list(range(-5, 300)))
    w.add_array("t.floats", [0.5, -1.25, 3.0e-8])
    rng = np.random.default_rng(0)
    w.add_tensor("dense", rng.standard_normal((3, 40)).astype(np.float32))
    q = quants.quantize(rng.standard_normal((20, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("blocks", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("half", rng.standard_normal(96).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_same_as_gguf_package(path):
    mine, reader = GGUFFile(path), GGUFReader(path)
    assert mine.metadata == read_gguf_metadata(reader)
    assert [(t.name, t.ggml_type, t.dims, t.offset) for t in mine.tensors] == [
        (t.name, int(t.tensor_type), tuple(t.shape.tolist()), t.data_offset) for t in reader.tensors]
    _, weights = load_gguf(path)
    for t in reader.tensors:
        got = weights[t.name].data
        assert np.array_equal(got.view(np.uint8).reshape(-1), t.data.view(np.uint8).reshape(-1))
        assert not got.flags.writeable  # a view of the file, never a copy


def test_matches_gguf_package_on_every_value_type(written):
    check_same_as_gguf_package(written)
    meta = GGUFFile(written).metadata
    assert meta["t.u64"] == 2**63 + 5 and meta["t.b"] is True
    assert isinstance(meta["t.f32"], float) and meta["t.f32"] == float(np.float32(0.1))


def test_matches_gguf_package_on_real_models(smollm2_gguf, gemma3_gguf):
    check_same_as_gguf_package(smollm2_gguf)
    check_same_as_gguf_package(gemma3_gguf)


def test_bad_files_are_value_errors(written, tmp_path):
    with open(written, "rb") as f:
        data = f.read()
    cases = {"not_gguf.gguf": b"GGML" + data[4:], "cut_in_metadata.gguf": data[:200],
             "cut_in_tensors.gguf": data[:-100]}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf(str(tmp_path / "not_gguf.gguf"))
    with pytest.raises(ValueError, match="truncated"):
        load_gguf(str(tmp_path / "cut_in_metadata.gguf"))
    with pytest.raises(ValueError, match="past the end of the file"):
        load_gguf(str(tmp_path / "cut_in_tensors.gguf"))
