"""Checkpoint averaging on a tiny Transformer workdir (3 checkpoints, trained in-process)."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.training import average, checkpoint, train
from bert_jax.training import state as state_lib


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A 6-step run of a 1-layer Transformer with checkpoints at steps 2, 4 and 6."""
    workdir = tmp_path_factory.mktemp("run")
    config = config_lib.load(str(REPO / "configs/wmt.py:base"), [
        "data.name=synthetic_translation", "data.max_seq_length=8", "model.vocab_size=32",
        "model.emb_dim=16", "model.num_heads=2", "model.head_dim=8", "model.mlp_dim=32",
        "model.num_layers=1", "model.num_decoder_layers=1", "train.batch_size=8", "train.steps=6",
        "train.log_every=6", "train.eval_steps=1", "train.checkpoint_every=2",
        "train.keep_checkpoints=5", "schedule.warmup_steps=2"])
    if "bleu_sentences" in config.data:  # no decoding at the final evaluation: only params matter
        config.data.bleu_sentences = -1
    train.train_and_evaluate(config, str(workdir))
    (workdir / "vocab.txt").write_text("[PAD]\n[UNK]\nhallo\n")  # stands in for the run's tokenizer
    return workdir


def _restored(directory, step: int) -> dict:
    """Checkpoint `step`'s params as numpy arrays, onto the stored model's shapes."""
    model = models.abstract_model(checkpoint.read_config(directory, step)["model"])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return jax.tree.map(np.asarray, checkpoint.restore_params(directory, abstract, step))


def test_average_is_the_mean_of_the_last_checkpoints(workdir, tmp_path):
    out = tmp_path / "avg"
    report = average.average_checkpoints(workdir, 3, out)
    assert report == {"out": str(out), "steps": [2, 4, 6], "step": 6}
    want = jax.tree.map(lambda *xs: np.mean(xs, axis=0),
                        *[_restored(workdir, s) for s in (2, 4, 6)])
    model_cfg, model = state_lib.load_model(out)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-7),
                 got, want)
    assert all(np.asarray(g).dtype == np.float32 for g in jax.tree.leaves(got))
    # Averaging changed something: the result is not simply the newest checkpoint.
    newest = _restored(workdir, 6)
    assert any(not np.array_equal(np.asarray(g), np.asarray(n))
               for g, n in zip(jax.tree.leaves(got), jax.tree.leaves(newest)))
    assert checkpoint.read_config(out) == checkpoint.read_config(workdir, 6)
    assert model_cfg == checkpoint.read_config(workdir, 6)["model"]
    assert (out / "vocab.txt").read_text() == (workdir / "vocab.txt").read_text()


def test_too_few_checkpoints_lists_the_steps(workdir, tmp_path):
    with pytest.raises(ValueError, match=r"only 3 checkpoint\(s\) \(steps 2, 4, 6\), fewer than "
                                         r"--last 5; use --last 3"):
        average.average_checkpoints(workdir, 5, tmp_path / "avg")
    with pytest.raises(ValueError, match="--last 0"):
        average.average_checkpoints(workdir, 0, tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_existing_output_is_never_overwritten(workdir, tmp_path):
    out = tmp_path / "avg"
    average.average_checkpoints(workdir, 1, out)
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="already holds a checkpoint.*another --out or delete"):
        average.average_checkpoints(workdir, 2, out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    with pytest.raises(ValueError, match="is the workdir"):
        average.average_checkpoints(workdir, 2, workdir)


def test_workdir_without_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="no checkpoints/ folder"):
        average.average_checkpoints(tmp_path, 1, tmp_path / "avg")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        average.average_checkpoints(tmp_path, 1, tmp_path / "avg")
    (tmp_path / "checkpoints" / "4.unreadable").mkdir()  # set aside by a resume: named
    with pytest.raises(ValueError, match=r"no complete checkpoint to average, only 4\.unreadable "
                                         r"\(set aside by a train resume.*rename it back to 4"):
        average.average_checkpoints(tmp_path, 1, tmp_path / "avg")


def test_checkpoints_of_different_shapes(tmp_path):
    run = tmp_path / "run"
    config = {"model": {"name": "transformer"}}
    checkpoint.save_params(run, 1, {"w": np.zeros((2, 3), np.float32)}, config)
    checkpoint.save_params(run, 2, {"w": np.zeros((2, 4), np.float32)}, config)
    with pytest.raises(ValueError, match=r"checkpoints 1 and 2 hold different params.*w: "
                                         r"\(\(2, 3\), 'float32'\) vs \(\(2, 4\)"):
        average.average_checkpoints(run, 2, tmp_path / "avg")


def _copy(workdir: Path, tmp_path: Path) -> Path:
    shutil.copytree(workdir, tmp_path / "run")
    return tmp_path / "run"


def test_a_step_linked_or_copied_from_another_is_refused(workdir, tmp_path):
    run = _copy(workdir, tmp_path)
    (run / "checkpoints" / "8").symlink_to(run / "checkpoints" / "6")
    with pytest.raises(ValueError, match=r"steps 6 and 8 are the same folder"):
        average.average_checkpoints(run, 2, tmp_path / "avg")
    (run / "checkpoints" / "8").unlink()
    shutil.copytree(run / "checkpoints" / "4", run / "checkpoints" / "8")
    with pytest.raises(ValueError, match=r"steps 4 and 8 hold the same params files"):
        average.average_checkpoints(run, 3, tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_checkpoints_of_different_model_configs_are_refused(workdir, tmp_path):
    run = _copy(workdir, tmp_path)
    step = run / "checkpoints" / "4"
    stored = json.loads((step / "config" / "metadata").read_text())
    stored["model"]["share_embeddings"] = not stored["model"]["share_embeddings"]
    (step / "config" / "metadata").write_text(json.dumps(stored))
    (step / "checksums.json").unlink()  # (an edit whose checksum was updated: read unverified)
    with pytest.raises(ValueError, match=r"checkpoints 4 and 6 hold different models \(model\."
                                         r"share_embeddings: (True|False) in 4, (True|False) in 6\)"):
        average.average_checkpoints(run, 2, tmp_path / "avg")
    assert average.average_checkpoints(run, 1, tmp_path / "avg")["steps"] == [6]
