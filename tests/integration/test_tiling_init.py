"""`bert-jax train` with init_mode=tile_from_middle: a wider, deeper ModernBERT starts from a
smaller one's checkpoint, tiled (tests/unit/training/test_tiling.py checks every tensor against
the reference and the refusals; the command line's are rows of test_bad_inputs.py), keeps the
config's sizes and trains."""

import jax
import numpy as np
from flax import nnx

from bert_jax import models
from bert_jax.training import checkpoint, metrics, state

SMALL = dict(vocab_size=128, emb_dim=32, num_layers=2, num_heads=2, head_dim=16, mlp_dim=48)
LARGE = dict(emb_dim=48, num_layers=3, num_heads=3, mlp_dim=80)
# The schedule's warmup gives the first update lr 0 (optim.py): checkpoint 1 holds the start.
RUN = ["--config.data.name=synthetic", "--config.data.instances=full_rows",
       "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=5",
       "--config.train.batch_size=8", "--config.train.steps=2", "--config.train.checkpoint_every=1",
       "--config.train.eval_every=0", "--config.train.log_every=1", "--config.schedule.name=constant",
       "--config.schedule.warmup_steps=1", "--config.model.attention_window=4"]


def save_base(directory):
    """A random small ModernBERT saved as a checkpoint in `directory` (norms random too): its params."""
    section = models.model_section("bert_pretraining", {**models.modernbert_model_fields("tiny"), **SMALL},
                                   attention_window=4)
    params = nnx.to_pure_dict(nnx.state(models.create_model(section), nnx.Param))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    checkpoint.save_params(directory, 0, params, {"model": section})
    return params


def middle(x, axis, new):
    """The published tile_weights_from_middle along one axis."""
    old = x.shape[axis]
    return np.take(x, (np.arange(new) - (new - old) // 2) % old, axis=axis)


def train(cli, workdir, base_dir, *extra):
    return cli(["train", "--config", "configs/modernbert.py:tiny", "--workdir", str(workdir), *RUN,
                f"--config.init_from={base_dir}", *extra])


def test_a_larger_model_starts_tiled_and_trains(cli, tmp_path, caplog):
    directory = tmp_path / "base"
    params = save_base(directory)
    sizes = [f"--config.model.{k}={v}" for k, v in LARGE.items()]
    with caplog.at_level("INFO", logger="bert_jax.training.state"):
        code, _, err = train(cli, tmp_path / "large", directory, "--config.init_mode=tile_from_middle",
                             *sizes)
    assert code == 0, err[-3000:]
    assert "tensors tiled from the middle; freshly initialised: bert/encoder/final_norm/scale" in caplog.text
    model_cfg, model = state.load_model(tmp_path / "large", step=1)
    assert {k: model_cfg[k] for k in (*LARGE, "vocab_size")} == {**LARGE, "vocab_size": 128}
    start = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    emb = params["bert"]["embeddings"]["word"]["embedding"]
    np.testing.assert_array_equal(start["bert"]["embeddings"]["word"]["embedding"], middle(emb, 1, 48))
    wo = params["bert"]["encoder"]["layers"]["mlp"]["wo"]["kernel"]  # layers 0, 1, 1 of 2 (round(4/3))
    np.testing.assert_array_equal(start["bert"]["encoder"]["layers"]["mlp"]["wo"]["kernel"],
                                  middle(middle(wo[[0, 1, 1]], 1, 80), 2, 48))
    rows = [r for r in metrics.read_metrics(tmp_path / "large" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
    _, trained = state.load_model(tmp_path / "large", step=2)
    assert not np.array_equal(nnx.state(trained, nnx.Param)["mlm"]["bias"][...], start["mlm"]["bias"])
