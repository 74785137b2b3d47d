"""Batch fields under their old names (Google BERT's input_mask / segment_ids as the A/B token
type, and <x>_segmentation / <x>_position) are still read: examples written to disk with them
train exactly as under the current names (data/packing.py)."""

import io
import itertools

import grain
import jax.numpy as jnp
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from flax import nnx

from bert_jax import models
from bert_jax.data import finetune, packing
from bert_jax.training import input as pipelines
from bert_jax.training import objectives

TINY = dict(vocab_size=97, emb_dim=32, num_layers=2, num_heads=4, head_dim=8, mlp_dim=64, max_len=64)
OLD = {"input_mask": "attention_mask", "segment_ids": "token_type_ids"}


def _examples(n=8, T=24, P=4, seed=0):
    """Pretraining examples under the current names (unpacked rows)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(6, T + 1))
        mask = (np.arange(T) < length).astype(np.int32)
        out.append({"input_ids": (rng.integers(5, 97, T) * mask).astype(np.int32),
                    "attention_mask": mask,
                    "token_type_ids": ((np.arange(T) >= length // 2) * mask).astype(np.int32),
                    "masked_lm_positions": np.sort(rng.choice(np.arange(1, length), P, replace=False)
                                                   ).astype(np.int32),
                    "masked_lm_ids": rng.integers(5, 97, P).astype(np.int32),
                    "masked_lm_weights": np.ones(P, np.float32),
                    "next_sentence_labels": np.int32(rng.integers(0, 2))})
    return out


def _old(example: dict) -> dict:
    return {next((o for o, n in OLD.items() if n == k), k): v for k, v in example.items()}


def _npz(example: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **example)
    return buf.getvalue()


def _read(record: bytes) -> dict:
    with np.load(io.BytesIO(record)) as f:
        return {k: f[k] for k in f.files}


def test_array_record_examples_with_the_old_names_train_as_the_new(tmp_path):
    examples = _examples()
    path = tmp_path / "old-00000.array_record"
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for ex in examples:
        writer.write(_npz(_old(ex)))
    writer.close()
    ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource([str(path)])).map(_read)
    old = next(pipelines.GrainBatches(ds.to_iter_dataset(), batch_size=8, train=True))
    new = {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}
    assert "input_mask" in _read(grain.sources.ArrayRecordDataSource([str(path)])[0])
    assert sorted(old) == sorted(new)
    for k in new:
        np.testing.assert_array_equal(old[k], new[k])
    model_cfg = models.model_section("bert_pretraining", models.bert_model_fields("tiny"), **TINY)
    model, objective = models.create_model(model_cfg), objectives.for_model(model_cfg)
    # jitted: one program for both batches (eager mode would compile every operation apart)
    loss_terms = nnx.jit(lambda model, batch: objective(model, batch, None)[0])
    terms = [loss_terms(model, {k: jnp.asarray(v) for k, v in b.items()}) for b in (old, new)]
    assert {k: float(v) for k, v in terms[0].items()} == {k: float(v) for k, v in terms[1].items()}


@pytest.mark.parametrize("pack", [None, {"row_multiple": 1}])
def test_task_features_saved_with_the_old_names_give_the_same_batches(tmp_path, pack):
    rng = np.random.default_rng(1)
    new = {k: np.stack([ex[k] for ex in _examples(16, seed=2)]) for k in ("input_ids", "attention_mask",
                                                                         "token_type_ids")}
    new["label_ids"] = rng.integers(0, 2, 16).astype(np.int32)
    np.savez(tmp_path / "features.npz", **_old(new))  # as encode_pairs wrote them before
    with np.load(tmp_path / "features.npz") as f:
        saved = {k: f[k] for k in f.files}
    assert {"input_mask", "segment_ids"} <= set(saved)
    kw = dict(batch_size=8, train=True, seed=0, pack=pack)
    for a, b in itertools.islice(zip(finetune.FeaturePipeline(saved, **kw),
                                     finetune.FeaturePipeline(new, **kw)), 3):
        assert sorted(a) == sorted(b)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])
        assert ("segment_ids" in a) == bool(pack) and ("attention_mask" in a) == (not pack)
    np.testing.assert_array_equal(packing.pack_batch(_old(new), row_multiple=1)["segment_ids"],
                                  packing.pack_batch(new, row_multiple=1)["segment_ids"])


def test_renaming_rules():
    ids = np.ones((2, 4), np.int32)
    assert sorted(packing.rename_old({"input_ids": ids, "input_mask": ids, "segment_ids": 0 * ids})) == [
        "attention_mask", "input_ids", "token_type_ids"]
    # Packed rows of the old layout: input_mask held the packed-sequence ids.
    packed = packing.rename_old({"input_ids": ids, "input_mask": 2 * ids, "segment_ids": 0 * ids,
                                 "positions": ids})
    np.testing.assert_array_equal(packed["segment_ids"], 2 * ids)
    np.testing.assert_array_equal(packed["token_type_ids"], 0 * ids)
    pairs = packing.rename_old({"inputs": ids, "inputs_segmentation": ids, "inputs_position": ids,
                                "targets": ids, "targets_segmentation": ids, "targets_position": ids})
    assert sorted(pairs) == ["inputs", "inputs_positions", "inputs_segment_ids", "targets",
                             "targets_positions", "targets_segment_ids"]
    current = {"input_ids": ids, "token_type_ids": ids, "segment_ids": ids, "positions": ids}
    assert packing.rename_old(current) == current  # the current names stay as they are
    with pytest.raises(ValueError, match="both old and new"):
        packing.rename_old({"input_ids": ids, "input_mask": ids, "attention_mask": ids})
