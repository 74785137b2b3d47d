"""Tests for bert_jax.interop.hf_weights: torch-free, pickle-safe loading of HF checkpoints."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from bert_jax.interop import hf_weights
from bert_jax.interop.hf_weights import load_hf_weights

# torch is imported only inside the tests that need it: it is optional and slow to import, and
# the loader under test must work without it.
TIED = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


def _assert_same(got: np.ndarray, t) -> None:
    """Bitwise equality of a loaded array with a torch tensor (bf16 compared as float32)."""
    import torch

    t = t.detach().cpu()
    assert got.shape == tuple(t.shape)
    assert got.flags.c_contiguous
    if t.dtype == torch.bfloat16:
        assert got.dtype == ml_dtypes.bfloat16
        assert got.astype(np.float32).tobytes() == t.float().numpy().tobytes()
    else:
        exp = t.numpy()
        assert got.dtype == exp.dtype
        assert got.tobytes() == np.ascontiguousarray(exp).tobytes()


def _assert_all_same(got: dict, sd: dict) -> None:
    assert set(got) == set(sd)
    for k, t in sd.items():
        _assert_same(got[k], t)


@pytest.fixture
def state_dict():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(20, generator=g)
    lin = torch.nn.Linear(5, 3)
    sd = {
        "f32": torch.randn(3, 4, generator=g),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(4, 2, generator=g).bfloat16(),
        "f64": torch.randn(3, generator=g).double(),
        "i64": torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
        "i32": torch.arange(6, dtype=torch.int32),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "shared_a": base[2:8],  # two views into one storage at different offsets
        "shared_b": base[10:16].view(2, 3),
        "transposed": torch.randn(3, 5, generator=g).t(),  # non-contiguous
        "strided": base[1::3],
        "param": torch.nn.Parameter(torch.ones(2, 2)),
    }
    sd.update({f"linear.{k}": v for k, v in lin.state_dict().items()})
    return sd


def test_pytorch_bin(tmp_path, state_dict):
    import torch

    torch.save(state_dict, tmp_path / "pytorch_model.bin")
    _assert_all_same(load_hf_weights(tmp_path), state_dict)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64"])
def test_pytorch_bin_big_endian(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=getattr(torch, dtype)).reshape(3, 4) * 3 - 7
    sd = {"x": t, "xt": t.t(), "s": t[1, 2]}
    torch.save(sd, tmp_path / "le.bin")
    # Rewrite the archive the way a big-endian host would have written it.
    itemsize = t.element_size()
    with zipfile.ZipFile(tmp_path / "le.bin") as src, \
            zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in name:
                data = np.frombuffer(data, f"<u{itemsize}").astype(f">u{itemsize}").tobytes()
            dst.writestr(name, data)
    _assert_all_same(load_hf_weights(tmp_path), sd)


def test_pytorch_bin_sharded(tmp_path, state_dict):
    import torch

    names = sorted(state_dict)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2],
              "pytorch_model-00002-of-00002.bin": names[1::2]}
    for fname, keys in shards.items():
        torch.save({k: state_dict[k] for k in keys}, tmp_path / fname)
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _assert_all_same(load_hf_weights(tmp_path), state_dict)


def _contiguous(sd: dict) -> dict:
    return {k: v.detach().contiguous().clone() for k, v in sd.items()}


def test_safetensors(tmp_path, state_dict):
    from safetensors.torch import save_file

    save_file(_contiguous(state_dict), tmp_path / "model.safetensors")
    _assert_all_same(load_hf_weights(tmp_path), state_dict)


def test_safetensors_sharded(tmp_path, state_dict):
    from safetensors.torch import save_file

    sd = _contiguous(state_dict)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[:5],
              "model-00002-of-00002.safetensors": names[5:]}
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, tmp_path / fname)
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_all_same(load_hf_weights(tmp_path), state_dict)

    # A name the index promises but no shard holds is an error, not a silent omission.
    weight_map["ghost"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="ghost"):
        load_hf_weights(tmp_path)


def _numpy_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "bf16": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "u8": np.arange(4, dtype=np.uint8),
        "bool": np.array([True, False]),
        "scalar": np.array(2.5, dtype=np.float32),
    }


def test_safetensors_raw_parser_matches_library(tmp_path, monkeypatch):
    arrays = _numpy_tensors()
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(arrays, path, metadata={"format": "np"})
    raw = hf_weights._read_safetensors_raw(path)
    assert set(raw) == set(arrays)
    for k, a in arrays.items():
        assert raw[k].dtype == a.dtype and raw[k].shape == a.shape
        assert raw[k].tobytes() == a.tobytes()

    # Simulate an old safetensors that cannot map BF16: load_hf_weights must fall back.
    def no_bf16(_path):
        raise TypeError("data type 'bfloat16' not understood")

    monkeypatch.setattr(safetensors.numpy, "load_file", no_bf16)
    got = load_hf_weights(tmp_path)
    assert got["bf16"].dtype == ml_dtypes.bfloat16
    assert got["bf16"].tobytes() == arrays["bf16"].tobytes()


def test_safetensors_preferred_over_bin(tmp_path):
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    (tmp_path / "pytorch_model.bin").write_bytes(b"never read")
    assert load_hf_weights(tmp_path)["w"].tolist() == [1.0, 1.0]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _write_torch_like_zip(path: Path, payload: bytes) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def test_malicious_pickle_rejected_without_torch(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"w": _Evil(marker)}, protocol=2)
    _write_torch_like_zip(tmp_path / "pytorch_model.bin", payload)
    with pytest.raises(ValueError, match=r"forbidden global 'posix\.system'.*model\.safetensors") as e:
        load_hf_weights(tmp_path)
    assert "pytorch_model.bin" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()
    # Sanity check that the payload is live: a plain unpickler runs it.
    pickle.loads(payload)
    assert marker.exists()


def test_malicious_torch_save_rejected(tmp_path, state_dict):
    import torch

    marker = tmp_path / "pwned"
    torch.save({**state_dict, "evil": _Evil(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="forbidden global"):
        load_hf_weights(tmp_path)
    assert not marker.exists()


def test_rebuild_rejects_out_of_bounds_view():
    storage = np.zeros(4, np.float32)
    with pytest.raises(pickle.UnpicklingError, match="exceeds"):
        hf_weights._rebuild_tensor_v2(storage, 2, (3,), (1,))
    with pytest.raises(pickle.UnpicklingError, match="exceeds"):
        hf_weights._rebuild_tensor_v2(storage, 0, (2, 2), (1, 4))
    assert hf_weights._rebuild_tensor_v2(storage, 4, (0,), (1,)).shape == (0,)


def test_legacy_torch_format(tmp_path, state_dict):
    import torch

    torch.save(state_dict, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match=r"legacy \(pre-1\.6\).*safetensors") as e:
        load_hf_weights(tmp_path)
    assert "pytorch_model.bin" in str(e.value)


def test_garbage_files(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"hello, not a checkpoint")
    with pytest.raises(ValueError, match="not a torch zip archive"):
        load_hf_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage12345")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_hf_weights(tmp_path)


def test_empty_dir(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_hf_weights(tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg
    assert all(name in msg for name in hf_weights.WEIGHT_FILES)


def test_transformers_bert_for_pretraining(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, vocab_size=99)
    model = transformers.BertForPreTraining(config).eval()
    sd = model.state_dict()

    # transformers 5 ignores safe_serialization=False and always writes safetensors, so the
    # .bin is written the way transformers 4 did it: torch.save of the state dict (the tied
    # decoder weight then shares its storage with the word embeddings).
    (bin_dir := tmp_path / "bin").mkdir()
    torch.save(sd, bin_dir / "pytorch_model.bin")
    st_dir, sharded_dir = tmp_path / "st", tmp_path / "sharded"
    model.save_pretrained(st_dir)
    model.save_pretrained(sharded_dir, max_shard_size="20KB")
    assert (st_dir / "model.safetensors").is_file()
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    assert len(list(sharded_dir.glob("model-*.safetensors"))) >= 2

    loaded = {d.name: load_hf_weights(d) for d in (bin_dir, st_dir, sharded_dir)}
    _assert_all_same(loaded["bin"], sd)
    for name in ("st", "sharded"):
        got = loaded[name]
        assert set(got) <= set(sd) and set(sd) - set(got) <= TIED  # tied weights stored once
        for k, a in got.items():
            _assert_same(a, sd[k])
    assert set(loaded["st"]) == set(loaded["sharded"])


def _cache_entry(root: Path, snapshots: list[str], ref: str | None) -> Path:
    """A Hugging Face cache entry: files in blobs/, snapshots/<hash>/ symlinks, refs/main."""
    entry = root / "models--org--tiny"
    (entry / "blobs").mkdir(parents=True)
    safetensors.numpy.save_file({"w": np.arange(3, dtype=np.float32)}, entry / "blobs" / "abc")
    for name in snapshots:
        (entry / "snapshots" / name).mkdir(parents=True)
        (entry / "snapshots" / name / "model.safetensors").symlink_to("../../blobs/abc")
    if ref is not None:
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(ref + "\n")
    return entry


def test_hf_cache_entry_resolves_to_its_snapshot(tmp_path):
    entry = _cache_entry(tmp_path / "a", ["1111", "2222"], ref="2222")
    assert hf_weights.resolve_model_dir(entry) == entry / "snapshots" / "2222"
    assert load_hf_weights(hf_weights.resolve_model_dir(entry))["w"].tolist() == [0, 1, 2]
    only = _cache_entry(tmp_path / "b", ["3333"], ref=None)  # no refs/: its only snapshot
    assert hf_weights.resolve_model_dir(only) == only / "snapshots" / "3333"
    snapshot = only / "snapshots" / "3333"
    assert hf_weights.resolve_model_dir(snapshot) == snapshot  # any other folder: itself
    with pytest.raises(FileNotFoundError, match="no refs/main and 2 snapshots"):
        hf_weights.resolve_model_dir(_cache_entry(tmp_path / "c", ["1", "2"], ref=None))
    with pytest.raises(FileNotFoundError, match="names snapshot 9999, which is not in"):
        hf_weights.resolve_model_dir(_cache_entry(tmp_path / "d", ["1"], ref="9999"))


def test_incomplete_download_in_cache_is_clear(tmp_path):
    entry = _cache_entry(tmp_path, ["1111"], ref="1111")
    (entry / "blobs" / "abc").unlink()  # a dangling symlink, as an interrupted download leaves
    with pytest.raises(FileNotFoundError, match="No weights in"):
        load_hf_weights(hf_weights.resolve_model_dir(entry))


def _safetensors_file(path: Path, header: dict, data: bytes, length: int | None = None) -> Path:
    """A safetensors file of `header` and `data` as written, right or wrong (`length`: the
    header length it claims, if not its own)."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


_TWO = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}


@pytest.mark.parametrize("header, data, length, says", [
    (_TWO, bytes(12), 10**6, "its header length says 1000000 bytes but"),
    ({"a": 1}, bytes(12), None, "tensor 'a' has no dtype, shape and data_offsets"),
    ([1, 2], b"", None, "its header is a JSON list, not an object"),
    (_TWO, bytes(10), None,
     "tensor 'b' ends at byte 12 of the data, which has 10 bytes (the file is cut short)"),
    ({**_TWO, "b": {**_TWO["b"], "shape": [3]}}, bytes(12), None,
     "tensor 'b' is F32 [3] (12 bytes) but its byte range [8, 12) holds 4"),
    ({**_TWO, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(12), None,
     "tensors 'a' and 'b' overlap (bytes 4 to 8 of the data)"),
    (_TWO, bytes(16), None, "bytes 12 to 16 of the data belong to no tensor"),
    ({**_TWO, "b": {**_TWO["b"], "dtype": "Q7"}}, bytes(12), None,
     "tensor 'b' has dtype 'Q7', which safetensors does not define"),
    ({**_TWO, "b": {**_TWO["b"], "data_offsets": [12, 8]}}, bytes(12), None,
     "tensor 'b' has data_offsets [12, 8], not [start, end]"),
    ({**_TWO, "a": {**_TWO["a"], "shape": [-2]}}, bytes(12), None, "tensor 'a' has shape [-2]"),
], ids=["header-longer-than-file", "tensor-not-described", "header-not-object", "cut-short",
        "shape-not-its-bytes", "overlap", "trailing-bytes", "unknown-dtype", "offsets-reversed",
        "negative-size"])
def test_a_damaged_safetensors_header_is_one_line_before_any_tensor_is_read(
        tmp_path, header, data, length, says):
    path = _safetensors_file(tmp_path / "model.safetensors", header, data, length)
    with pytest.raises(ValueError) as e:
        load_hf_weights(tmp_path)
    message = str(e.value)
    assert message.startswith(f"{path}: not a valid safetensors file: {says}"), message
    assert "download the model's files again" in message and "\n" not in message


def test_a_safetensors_file_too_short_or_not_json_is_one_line(tmp_path):
    for raw, says in ((struct.pack("<Q", 4) + b"{oop", "its 4-byte header is not JSON"),
                      (b"\x05\x00", "2 bytes, shorter than the 8-byte header length")):
        (tmp_path / "model.safetensors").write_bytes(raw)
        with pytest.raises(ValueError, match=says):
            load_hf_weights(tmp_path)


def test_a_sound_safetensors_header_reads_as_the_library_does(tmp_path):
    path = _safetensors_file(tmp_path / "model.safetensors",
                             {"__metadata__": {"format": "pt"}, **_TWO}, np.arange(3, dtype="<f4").tobytes())
    header, begin = hf_weights.check_safetensors(path)
    assert set(header) == {"__metadata__", "a", "b"} and begin == path.stat().st_size - 12
    assert load_hf_weights(tmp_path)["b"].tolist() == [2.0]


def test_a_sharded_index_naming_a_missing_or_outside_shard_is_one_line(tmp_path):
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, tmp_path / "one.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    for shard in ("two.safetensors", "../one.safetensors"):
        index.write_text(json.dumps({"weight_map": {"w": "one.safetensors", "v": shard}}))
        with pytest.raises(FileNotFoundError) as e:
            load_hf_weights(tmp_path)
        assert str(e.value) == (f"{index}: lists shard {shard!r}, which is not a file in {tmp_path}; "
                                "download the model's files again")
    index.write_text(json.dumps({"weight_map": {"w": 3}}))
    with pytest.raises(ValueError, match="not a valid sharded-checkpoint index"):
        load_hf_weights(tmp_path)


def test_a_cached_file_whose_bytes_differ_from_its_recorded_hash_is_refused(tmp_path):
    import hashlib

    entry = _cache_entry(tmp_path, ["1111"], ref="1111")
    blobs = entry / "blobs"
    good = (blobs / "abc").read_bytes()
    sha = hashlib.sha256(good).hexdigest()  # as the hub names a Git LFS file's blob
    (blobs / sha).write_bytes(good)
    link = entry / "snapshots" / "1111" / "model.safetensors"
    link.unlink()
    link.symlink_to(f"../../blobs/{sha}")
    assert load_hf_weights(link.parent)["w"].tolist() == [0, 1, 2]
    # the same length, the header intact, a value written over: only the hash shows it
    (blobs / sha).write_bytes(good[:-4] + np.float32(7).tobytes())
    with pytest.raises(ValueError) as e:
        load_hf_weights(link.parent)
    assert str(e.value).startswith(f"{link}: its bytes differ from the SHA-256 its download "
                                   f"recorded (the blob's name, {blobs / sha})")
    assert "download the model again" in str(e.value)
