"""Checkpoints written before the first layer's unused attention norm was dropped (a pre-norm
stack after an embedding norm held one per layer, layer 0's unused) restore through every path
that reads checkpoints: eval and features (state.load_model, checkpoint.restore_params),
init_from (checkpoint.load_pretrained) and resume (TrainCheckpointer.restore_latest), with the
first row dropped and one log line saying so."""

import json
import logging

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import config as config_lib
from bert_jax import models, trees
from bert_jax.training import checkpoint, setup, sharding, state
from tests.helpers import REPO

SAYS = "held an attention norm it does not use"


def modern_config(num_layers: int):
    return config_lib.load(str(REPO / "configs/modernbert.py:tiny"),
                           [f"model.num_layers={num_layers}", "model.vocab_size=64",
                            "model.vocab_multiple=1"])


def today_params(model_cfg) -> dict:
    """Today's params, away from the init (each row of a stacked leaf its own values)."""
    params = nnx.to_pure_dict(nnx.state(models.create_model(model_cfg), nnx.Param))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(np.float32), params)


def is_first_norm(names) -> bool:
    return "layers" in names and "attention_norm" in names


def written_before(tree, layers_path: tuple, width: int, fill: float = 7.0):
    """`tree` as the code before wrote it: a row (`fill`) in front of every stacked attention norm
    leaf; a one-layer stack's norm (absent today) added under `layers_path` (a D-wide scale)."""
    def add(path, x):
        names = trees.key_names(path)
        return np.concatenate([np.full_like(x[:1], fill), x]) if is_first_norm(names) else x
    tree = jax.tree_util.tree_map_with_path(add, tree)
    if layers_path:
        node = tree
        for k in layers_path:
            node = node[k]
        node["attention_norm"] = {"scale": np.full((1, width), fill, np.float32)}
    return tree


@pytest.mark.parametrize("num_layers", [3, 1])
def test_params_written_with_the_first_norm_restore_for_eval_features_and_init_from(
        tmp_path, caplog, num_layers):
    config = modern_config(num_layers)
    model_cfg = config_lib.model_config(config)
    params = today_params(model_cfg)
    layers = params["bert"]["encoder"]["layers"]
    assert ("attention_norm" in layers) == (num_layers > 1)
    if num_layers > 1:
        assert layers["attention_norm"]["scale"].shape == (num_layers - 1, 128)
    old = written_before(params, () if num_layers > 1 else ("bert", "encoder", "layers"), 128)
    checkpoint.save_params(tmp_path, 0, old, {"model": model_cfg})

    with caplog.at_level(logging.INFO):  # eval, features, export: state.load_model
        _, model = state.load_model(tmp_path)
    assert sum(SAYS in r.getMessage() for r in caplog.records) == 1
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(model, nnx.Param)), params)

    mesh = sharding.make_mesh(config.mesh)  # init_from: the weights onto today's model, sharded
    _, abstract, state_sh = state.abstract_state(config, mesh)
    target = state.with_shardings(abstract["params"], state_sh["params"])
    found, fresh, unused = checkpoint.load_pretrained(tmp_path, model_cfg, target, mesh)
    assert fresh == []
    assert unused == ([] if num_layers > 1 else ["bert/encoder/layers/attention_norm/scale"])
    jax.tree.map(np.testing.assert_array_equal, found, params)


def test_a_train_state_written_with_the_first_norm_resumes(tmp_path, caplog):
    """Resume: the params and the optimizer's moments of the norm lose their first row."""
    config = modern_config(3)
    mesh = sharding.make_mesh(config.mesh)
    engine = setup.build(config, mesh)
    params = today_params(config_lib.model_config(config))
    rng = np.random.default_rng(1)
    opt_state = jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(x.dtype)
                             if np.issubdtype(x.dtype, np.floating) else np.zeros(x.shape, x.dtype),
                             engine.abstract["opt_state"])
    moments = [p for p, _ in jax.tree_util.tree_flatten_with_path(opt_state)[0]
               if is_first_norm(trees.key_names(p))]
    assert len(moments) >= 2  # StableAdamW's two moments of the norm's scale
    config_json = json.loads(config.to_json())
    with checkpoint.TrainCheckpointer(tmp_path, keep=2) as ckpt:
        ckpt.save(4, written_before(params, (), 128), written_before(opt_state, (), 128),
                  {"position": 4}, config_json)
    target = engine.train_state()
    with caplog.at_level(logging.INFO), checkpoint.TrainCheckpointer(tmp_path, keep=2) as ckpt:
        step, got_params, got_opt, data = ckpt.restore_latest(target["params"], target["opt_state"],
                                                               config_json)
    assert (step, data) == (4, {"position": 4})
    assert sum(SAYS in r.getMessage() for r in caplog.records) == 1
    jax.tree.map(np.testing.assert_array_equal, got_params, params)
    jax.tree.map(np.testing.assert_array_equal, got_opt, opt_state)
    # placed as a fresh state would be (the train step's shardings)
    assert jax.tree.map(lambda x: x.sharding, got_opt) == engine.state_sh["opt_state"]
