"""Original Google TF BERT checkpoints, read without TensorFlow: the tensor-bundle reader against
what TensorFlow itself read from a checkpoint it wrote (tests/fixtures/tf_bert_tiny, made by
tests/fixtures/make_tf_bert_tiny.py), and the converted model against that model's outputs
as TensorFlow computed them."""

import json
import shutil
import struct
from pathlib import Path

import google_crc32c
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import FIXTURES

from bert_jax.interop import convert, tf_checkpoint
from bert_jax.interop.tf_checkpoint import TFCheckpointError, read_tf_checkpoint
from bert_jax.training import state

FIXTURE = FIXTURES / "tf_bert_tiny"
PREFIX = FIXTURE / "bert_model.ckpt"
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(FIXTURE / "expected.npz"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "converted"
    report = convert.convert_hf(FIXTURE, out)
    return out, report


def run_ours(model, expected, bare=False):
    inputs = dict(token_type_ids=jnp.asarray(expected["segment_ids"]),
                  attention_mask=jnp.asarray(expected["input_mask"]))
    ids = jnp.asarray(expected["input_ids"])
    return model(ids, **inputs) if bare else (model(ids, **inputs), model.bert(ids, **inputs))


def test_reader_matches_tensorflow():
    """Every tensor TF listed (weights, Adam slots, global_step): same shape, dtype and sum."""
    listing = json.loads((FIXTURE / "variables.json").read_text())
    got = read_tf_checkpoint(PREFIX)
    assert sorted(got) == sorted(listing)
    for name, info in listing.items():
        assert list(got[name].shape) == info["shape"], name
        assert got[name].dtype == np.dtype(info["dtype"]), name
        np.testing.assert_allclose(got[name].sum(dtype=np.float64), info["sum"], rtol=1e-12,
                                   atol=1e-12, err_msg=name)
    assert int(got["global_step"]) == 7


def test_convert_matches_tensorflow(converted, expected):
    out, report = converted
    assert report["model"] == "bert_pretraining" and report["source"] == f"tf:{PREFIX}"
    assert report["missing"] == [] and report["unused"] == []  # Adam slots and step skipped
    model_cfg, model = state.load_model(out)
    assert model_cfg["activation"] == "gelu" and model_cfg["num_layers"] == 2
    heads, encoder = run_ours(model, expected)
    np.testing.assert_allclose(encoder["sequence_output"], expected["sequence_output"], **TOL)
    np.testing.assert_allclose(encoder["pooled_output"], expected["pooled_output"], **TOL)
    np.testing.assert_allclose(heads["mlm_logits"], expected["mlm_logits"], **TOL)
    np.testing.assert_allclose(heads["nsp_logits"], expected["nsp_logits"], **TOL)
    # The release has no tokenizer_config.json; an all-lowercase vocab reads as uncased.
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True


def test_convert_from_prefix_as_bare_encoder(tmp_path, expected):
    report = convert.convert_hf(PREFIX, tmp_path / "out", name="bert")
    assert report["model"] == "bert" and report["missing"] == []
    assert all(name.startswith("cls.") for name in report["unused"]) and report["unused"]
    _, model = state.load_model(tmp_path / "out")
    out = run_ours(model, expected, bare=True)
    np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], **TOL)


def test_tf_names_to_hf():
    x = np.zeros((3, 2), np.float32)
    weights = {"bert/encoder/layer_10/attention/self/query/kernel": x,
               "bert/encoder/layer_10/output/LayerNorm/gamma": x[0],
               "bert/embeddings/word_embeddings": x,
               "cls/squad/output_weights": x, "output_weights": x, "output_bias": x[0],
               "bert/embeddings/word_embeddings/adam_m": x, "bert/pooler/dense/kernel/Adam_1": x,
               "global_step": np.int64(3)}
    got = convert.tf_to_hf(weights)
    assert sorted(got) == sorted([
        "bert.encoder.layer.10.attention.self.query.weight",
        "bert.encoder.layer.10.output.LayerNorm.weight", "bert.embeddings.word_embeddings.weight",
        "qa_outputs.weight", "classifier.weight", "classifier.bias"])
    assert got["bert.encoder.layer.10.attention.self.query.weight"].shape == (2, 3)  # [out, in]
    assert got["classifier.weight"].shape == (3, 2)  # output_weights are [out, in] already


# A minimal writer of the same format, for what the TF fixture does not show: several data
# shards, big-endian bundles, other dtypes, string tensors, slices, compressed tables.
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload) -> bytes:
    if wire == 2:
        payload = _varint(len(payload)) + payload
    elif wire == 0:
        payload = _varint(payload)
    elif wire == 5:
        payload = struct.pack("<I", payload)
    return _varint(number << 3 | wire) + payload


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _table_block(entries: list[tuple[bytes, bytes]], kind: int = 0) -> bytes:
    body, restarts = b"", []
    for key, value in entries:
        restarts.append(len(body))
        body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
    body += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return body + bytes([kind]) + struct.pack("<I", _masked_crc(body + bytes([kind])))


def write_bundle(prefix: Path, tensors: dict, num_shards: int = 1, big: bool = False,
                 kind: int = 0, extra: dict | None = None) -> None:
    """tensors: {name: (array, shard) or (dtype code, raw bytes, shape, shard)}."""
    data = [b""] * num_shards
    entries = [(b"", _field(1, 0, num_shards) + _field(2, 0, int(big)))]
    for name, spec in sorted(tensors.items()):
        if isinstance(spec[0], np.ndarray):
            arr, shard = spec
            code = {np.dtype(v): k for k, v in tf_checkpoint._DTYPES.items()}[arr.dtype]
            raw = arr.astype(arr.dtype.newbyteorder(">" if big else "<")).tobytes() \
                if arr.dtype != ml_dtypes.bfloat16 else (
                    arr.view(np.uint16).byteswap() if big else arr.view(np.uint16)).tobytes()
            shape = arr.shape
        else:
            code, raw, shape, shard = spec
        dims = b"".join(_field(2, 2, _field(1, 0, d)) for d in shape)
        entry = (_field(1, 0, code) + _field(2, 2, dims) + _field(3, 0, shard)
                 + _field(4, 0, len(data[shard])) + _field(5, 0, len(raw))
                 + _field(6, 5, _masked_crc(raw)) + (extra or {}).get(name, b""))
        entries.append((name.encode(), entry))
        data[shard] += raw
    for i, blob in enumerate(data):
        Path(f"{prefix}.data-{i:05d}-of-{num_shards:05d}").write_bytes(blob)
    block = _table_block(entries, kind)
    meta_at = len(block)
    meta = _table_block([])
    index_at = meta_at + len(meta)
    index = _table_block([(entries[-1][0], _varint(0) + _varint(len(block) - 5))])
    handles = _varint(meta_at) + _varint(len(meta) - 5) + _varint(index_at) + _varint(len(index) - 5)
    footer = handles.ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)
    Path(f"{prefix}.index").write_bytes(block + meta + index + footer)


@pytest.mark.parametrize("big", [False, True], ids=["little_endian", "big_endian"])
def test_shards_dtypes_and_byte_order(tmp_path, big):
    rng = np.random.default_rng(0)
    tensors = {"a/f32": (rng.standard_normal((3, 4)).astype(np.float32), 0),
               "b/bf16": (rng.standard_normal(5).astype(ml_dtypes.bfloat16), 1),
               "c/f16": (rng.standard_normal((2, 2)).astype(np.float16), 1),
               "d/i64": (np.arange(-3, 3, dtype=np.int64), 0),
               "e/scalar": (np.array(2.5, np.float64), 1),
               "f/string": (7, b"\x03abc", (), 0)}  # skipped: not a numeric tensor
    write_bundle(tmp_path / "ckpt", tensors, num_shards=2, big=big)
    got = read_tf_checkpoint(tmp_path / "ckpt")
    assert sorted(got) == ["a/f32", "b/bf16", "c/f16", "d/i64", "e/scalar"]
    for name, value in got.items():
        want = tensors[name][0]
        assert value.dtype == want.dtype and value.shape == want.shape
        assert value.tobytes() == want.tobytes(), name
    assert read_tf_checkpoint(tmp_path / "ckpt", keep=lambda n: n.startswith("a/")).keys() == {"a/f32"}


def test_fine_tuned_classifier_checkpoint(tmp_path, expected):
    """run_classifier.py's output: bert/* plus output_weights/output_bias, whose shape gives
    the number of labels (bert_config.json does not say)."""
    rng = np.random.default_rng(1)
    head = {"output_weights": rng.standard_normal((3, 32)).astype(np.float32),
            "output_bias": rng.standard_normal(3).astype(np.float32)}
    tensors = {k: v for k, v in read_tf_checkpoint(PREFIX).items() if k.startswith("bert/")}
    (tmp_path / "mnli").mkdir()
    write_bundle(tmp_path / "mnli" / "model.ckpt-300", {k: (v, 0) for k, v in {**tensors, **head}.items()})
    for name in ("bert_config.json", "vocab.txt"):
        shutil.copy(FIXTURE / name, tmp_path / "mnli" / name)
    report = convert.convert_hf(tmp_path / "mnli", tmp_path / "out")
    assert (report["model"], report["missing"], report["unused"]) == ("bert_classification", [], [])
    model_cfg, model = state.load_model(tmp_path / "out")
    assert model_cfg["num_labels"] == 3
    want = expected["pooled_output"] @ head["output_weights"].T + head["output_bias"]
    np.testing.assert_allclose(run_ours(model, expected, bare=True)["logits"], want, **TOL)


def test_damaged_checkpoints_are_clear_errors(tmp_path):
    src = tmp_path / "model"
    shutil.copytree(FIXTURE, src)
    data = src / "bert_model.ckpt.data-00000-of-00001"
    good = data.read_bytes()
    blob = bytearray(good)
    blob[100] ^= 0xFF
    data.write_bytes(bytes(blob))
    with pytest.raises(TFCheckpointError, match=r"data-00000-of-00001: checksum mismatch for "
                                                r"bert/embeddings/\w+"):
        convert.convert_hf(src, tmp_path / "out")
    data.write_bytes(good[:1000])
    with pytest.raises(TFCheckpointError, match="truncated"):
        read_tf_checkpoint(src / "bert_model.ckpt")
    data.unlink()
    with pytest.raises(FileNotFoundError, match="data-00000-of-00001: not found"):
        read_tf_checkpoint(src / "bert_model.ckpt")
    index = src / "bert_model.ckpt.index"
    index.write_bytes(index.read_bytes()[:-10])
    with pytest.raises(TFCheckpointError, match="bert_model.ckpt.index: not a readable"):
        read_tf_checkpoint(src / "bert_model.ckpt")
    (src / "bert_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="bert_config.json: not found"):
        convert.convert_hf(src / "bert_model.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_layouts_are_clear_errors(tmp_path):
    arr = np.ones(3, np.float32)
    write_bundle(tmp_path / "snappy", {"w": (arr, 0)}, kind=1)
    with pytest.raises(TFCheckpointError, match="compressed table block"):
        read_tf_checkpoint(tmp_path / "snappy")
    write_bundle(tmp_path / "sliced", {"w": (arr, 0)}, extra={"w": _field(7, 2, b"")})
    with pytest.raises(TFCheckpointError, match="w is a partitioned variable"):
        read_tf_checkpoint(tmp_path / "sliced")
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "bert_config.json").write_text("{}")
    for step in (1, 2):
        write_bundle(tmp_path / "two" / f"model.ckpt-{step}", {"w": (arr, 0)})
    with pytest.raises(FileNotFoundError, match="model.ckpt-1.index, model.ckpt-2.index; pass"):
        convert.convert_hf(tmp_path / "two", tmp_path / "out")
    # With tf.train.Saver's `checkpoint` record, the newest one is taken.
    (tmp_path / "two" / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/model.ckpt-2"\n')
    assert convert.tf_checkpoint_prefix(tmp_path / "two") == tmp_path / "two" / "model.ckpt-2"


def test_export_of_tf_checkpoint_loads_in_transformers(converted, expected, tmp_path):
    """TF -> bert-jax -> Hugging Face: the PyTorch model gives TensorFlow's outputs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax.interop import export

    export.export_hf(converted[0], tmp_path / "hf")
    hf, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf",
                                                               output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        ref = hf.eval()(input_ids=torch.from_numpy(expected["input_ids"]).long(),
                        token_type_ids=torch.from_numpy(expected["segment_ids"]).long(),
                        attention_mask=torch.from_numpy(expected["input_mask"]).long(),
                        output_hidden_states=True)
    np.testing.assert_allclose(ref.hidden_states[-1].numpy(), expected["sequence_output"], **TOL)
    np.testing.assert_allclose(ref.prediction_logits.numpy(), expected["mlm_logits"], **TOL)
    np.testing.assert_allclose(ref.seq_relationship_logits.numpy(), expected["nsp_logits"], **TOL)
