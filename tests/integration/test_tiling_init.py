"""`bert-jax train` with init_mode=tile_from_middle: a wider, deeper ModernBERT starts from a
smaller one's checkpoint, tiled (tests/unit/training/test_tiling.py checks every tensor against
the reference), keeps the config's sizes and trains; what it cannot start from is refused
before anything is built."""

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import config as config_lib
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


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random small ModernBERT saved as a checkpoint (norms random too): (dir, its params)."""
    section = models.model_section("bert_pretraining", {**models.modernbert_model_fields("tiny"), **SMALL},
                                   attention_window=4)
    params = nnx.to_pure_dict(nnx.state(models.create_model(section), nnx.Param))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    directory = tmp_path_factory.mktemp("base")
    checkpoint.save_params(directory, 0, params, {"model": section})
    return directory, params


def middle(x, axis, new):
    """The published tile_weights_from_middle along one axis."""
    old = x.shape[axis]
    return np.take(x, (np.arange(new) - (new - old) // 2) % old, axis=axis)


def train(cli, workdir, base_dir, *extra):
    return cli(["train", "--config", "configs/modernbert.py:tiny", "--workdir", str(workdir), *RUN,
                f"--config.init_from={base_dir}", *extra])


def test_a_larger_model_starts_tiled_and_trains(cli, tmp_path, base, caplog):
    directory, params = base
    sizes = [f"--config.model.{k}={v}" for k, v in LARGE.items()]
    with caplog.at_level("INFO", logger="bert_jax.training.state"):
        code, _, err = train(cli, tmp_path, directory, "--config.init_mode=tile_from_middle", *sizes)
    assert code == 0, err[-3000:]
    assert "tensors tiled from the middle; freshly initialised: bert/encoder/final_norm/scale" in caplog.text
    model_cfg, model = state.load_model(tmp_path, step=1)
    assert {k: model_cfg[k] for k in (*LARGE, "vocab_size")} == {**LARGE, "vocab_size": 128}
    start = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    emb = params["bert"]["embeddings"]["word"]["embedding"]
    np.testing.assert_array_equal(start["bert"]["embeddings"]["word"]["embedding"], middle(emb, 1, 48))
    wo = params["bert"]["encoder"]["layers"]["mlp"]["wo"]["kernel"]  # layers 0, 1, 1 of 2 (round(4/3))
    np.testing.assert_array_equal(start["bert"]["encoder"]["layers"]["mlp"]["wo"]["kernel"],
                                  middle(middle(wo[[0, 1, 1]], 1, 80), 2, 48))
    rows = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
    _, trained = state.load_model(tmp_path, step=2)
    assert not np.array_equal(nnx.state(trained, nnx.Param)["mlm"]["bias"][...], start["mlm"]["bias"])


def test_a_smaller_model_is_refused_before_anything_is_built(cli, tmp_path, base):
    code, _, err = train(cli, tmp_path, base[0], "--config.init_mode=tile_from_middle",
                         "--config.model.emb_dim=16")
    assert code == 1
    assert "model.emb_dim=16 is smaller than the checkpoint's 32" in err, err[-3000:]
    assert not (tmp_path / "checkpoints").exists()


def test_tiling_needs_an_init_from_and_a_known_mode():
    config = config_lib.load("configs/modernbert.py:tiny", ["init_mode=tile_from_middle"])
    with pytest.raises(config_lib.ConfigError, match=r"init_from is empty: set --config\.init_from="):
        state.sizes_from_init(config)
    config.init_mode = "tile"
    with pytest.raises(config_lib.ConfigError, match=r"init_mode='tile'; choose one of \['exact', "
                                                     r"'tile_from_middle'\]"):
        config_lib.validate(config, 8)
