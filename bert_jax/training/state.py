"""The train state {params, opt_state, step}: abstract shapes with their shardings, fresh
initialisation, pretrained weights, restore. Train, eval, plan and features share these.

`params` is a plain nested dict of float32 arrays (the model is rebuilt from it with
`nnx.merge`), sharded by the config's logical axis rules; `opt_state` follows the params'
shardings; `step` is a replicated int32.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, traverse_util

from bert_jax import models, tasks, trees
from bert_jax.config import ConfigError, init_mode, model_config
from bert_jax.specs import RunSpec
from bert_jax.training import checkpoint, sharding, tiling

log = logging.getLogger(__name__)


def with_shardings(tree, shardings):
    """ShapeDtypeStructs of `tree`'s leaves carrying the matching `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def graphdef_of(config: RunSpec):
    """The model's graph (its static structure: sizes, rope bases, kernels) for `config`; a
    length phase with its own rope base (config.phase_config) has its own."""
    with jax.set_mesh(None):  # (see abstract_state; a train step asks under its mesh)
        return nnx.split(models.abstract_model(model_config(config)), nnx.Param)[0]


def abstract_state(config: RunSpec, mesh, tx: optax.GradientTransformation | None = None):
    """(graphdef, abstract state, state shardings) without allocating anything. Without `tx`
    (evaluation, features) the state holds only `params`."""
    # Outside set_mesh: under a mesh, nnx.eval_shape takes logical names for mesh axes.
    model = models.abstract_model(model_config(config))
    graphdef, params_state = nnx.split(model, nnx.Param)
    param_sh = sharding.param_shardings(params_state, mesh, config.logical_axis_rules)
    params = nnx.to_pure_dict(params_state)
    if tx is None:
        return graphdef, {"params": params}, {"params": param_sh}
    opt_state = jax.eval_shape(tx.init, params)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_state, param_sh,
                                   transform_non_params=lambda _: sharding.replicated(mesh))
    state = {"params": params, "opt_state": opt_state,
             "step": jax.ShapeDtypeStruct((), jnp.int32)}
    state_sh = {"params": param_sh, "opt_state": opt_sh, "step": sharding.replicated(mesh)}
    return graphdef, state, state_sh


def init_state(config: RunSpec, tx, state_sh, pretrained: dict | None = None) -> dict:
    """Fresh parameters (from config.seed), with those in `pretrained` (a subtree of the
    params) taking their place, and a fresh optimizer state; created already sharded."""
    def init(pretrained):
        model = models.create_model(model_config(config), seed=config.seed)
        params = trees.overlay(nnx.to_pure_dict(nnx.state(model, nnx.Param)), pretrained)
        return {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
    return jax.jit(init, out_shardings=state_sh)(pretrained or {})


def sizes_from_init(config, set_by_user: Collection[str] = ()):
    """`config` with the model's architecture fields (layers, width, heads, vocabulary, ...)
    taken from the config.init_from checkpoint, except those the user set (dotted keys such
    as "model.num_layers"); a user-set field that differs is reported by `pretrained`. With
    init_mode=tile_from_middle the sizes (tiling.SIZE_FIELDS) are the config's, checked here;
    with init_mode=transplant the whole model is the config's."""
    tile = init_mode(config) == "tile_from_middle"
    if not config.get("init_from"):
        if tile:
            raise ConfigError("init_mode=tile_from_middle grows the init_from checkpoint's weights, "
                              "but init_from is empty: set --config.init_from=<a smaller run's "
                              "workdir> (ModernBERT-large: a base run), or init_mode=exact")
        if init_mode(config) == "transplant":
            raise ConfigError("init_mode=transplant takes the init_from checkpoint's tensors that "
                              "fit, but init_from is empty: set --config.init_from=<checkpoint>, or "
                              "init_mode=exact")
        return config
    if init_mode(config) == "transplant":  # the config's model as written: nothing taken
        return config
    theirs = checkpoint.read_config(config.init_from)["model"]
    if theirs.get("name") in models.CONFIGS and config.model.name in models.CONFIGS:
        checkpoint.check_same_family(config.init_from, theirs, config.model)
    taken = {k: theirs[k] for k in checkpoint.ARCHITECTURE_FIELDS  # those both models read
             if k in theirs and k in config.model and f"model.{k}" not in set_by_user
             and config.model[k] != theirs[k] and not (tile and k in tiling.SIZE_FIELDS)}
    if tile:  # refused before anything is built
        tiling.check(config.init_from, models.complete_model_config(theirs),
                     models.complete_model_config({**config.model.to_dict(), **taken}))
    if not taken:
        return config
    config = config.copy_and_resolve_references()
    config.model.update(taken)
    log.info(f"init_from {config.init_from}: model sizes from the checkpoint: "
             + ", ".join(f"model.{k}={v}" for k, v in taken.items()))
    return config


def check_set_sizes(config, set_by_user: Collection[str]) -> None:
    """A model key the user set (`set_by_user`: dotted keys) to another value than the
    config.init_from checkpoint's, where that checkpoint decides it, is a ConfigError naming
    the key and both values. Training refuses it only when it loads the weights (`pretrained`),
    after compiling; plan and launch, which load none, ask here first."""
    if not config.get("init_from") or init_mode(config) == "transplant":
        return
    tile = init_mode(config) == "tile_from_middle"
    theirs = models.complete_model_config(checkpoint.read_config(config.init_from)["model"])
    ours = models.complete_model_config(model_config(config))
    differ = [k for k in checkpoint.ARCHITECTURE_FIELDS
              if f"model.{k}" in set_by_user and k in theirs and k in ours and ours[k] != theirs[k]
              and not (tile and k in tiling.SIZE_FIELDS)]
    if differ:
        key = differ[0]
        raise ConfigError(
            f"--config.model.{key}={ours[key]}: the init_from checkpoint in {config.init_from} "
            f"decides model.{key} ({theirs[key]!r}), so training would refuse the flag when it loads "
            "the weights; drop it (or --config.init_mode=transplant to take only the tensors that fit)")


def pretrained(config: RunSpec, abstract_params, mesh) -> dict:
    """The config.init_from weights that fit this model (task heads stay fresh), or with
    init_mode=tile_from_middle tiled to its sizes (tiling.py); `abstract_params` carry the
    target shardings."""
    if init_mode(config) == "tile_from_middle":
        with jax.set_mesh(None):  # (see abstract_state) the source whole, on one device
            source_cfg, source = load_model(config.init_from)
        found, fresh, unused = tiling.tiled(config.init_from, source_cfg, nnx.to_pure_dict(
            nnx.state(source, nnx.Param)), model_config(config), abstract_params)
        how = "tiled from the middle"
    else:
        transplant = init_mode(config) == "transplant"
        found, fresh, unused = checkpoint.load_pretrained(
            config.init_from, model_config(config), abstract_params, mesh, transplant)
        how = "transplanted (init_mode=transplant)" if transplant else "loaded"
    log.info(f"init_from {config.init_from}: {len(jax.tree.leaves(found))} tensors {how}"
             + (f"; freshly initialised: {', '.join(fresh)}" if fresh else "")
             + (f"; not used: {', '.join(unused)}" if unused else ""))
    data = json.loads(config.saved)["data"] if isinstance(config, RunSpec) else config.data
    say_other_task_head(config.init_from, data, model_config(config)["name"], found)
    return found


def say_other_task_head(init_from: str, data, model_name: str, found: dict) -> None:
    """A warning when `init_from` was fine-tuned on another task than the one of data section
    `data` and its task head (the tensors of `found` outside model `model_name`'s encoder) is
    taken: that head was trained for the other task's labels (taken all the same: an
    intermediate fine-tuning may mean it)."""
    ran = tasks.run_name(checkpoint.read_config(init_from).get("data") or {})
    runs = tasks.run_name(data)
    if ran is None or ran == runs:
        return
    encoder = models.encoder_path(model_name)
    head = sorted("/".join(k) for k in traverse_util.flatten_dict(found) if k[:len(encoder)] != encoder)
    if head:
        log.warning(f"warning: init_from {init_from} was fine-tuned on {ran}: its task head "
                    f"({', '.join(head)}) is taken as this run's starting point for "
                    f"{runs or 'this config'}")


def restore_params(config: RunSpec, workdir: str, mesh, step: int | None = None):
    """(graphdef, params of checkpoint `step` (latest if None) sharded for `mesh`)."""
    graphdef, abstract, state_sh = abstract_state(config, mesh)
    target = with_shardings(abstract["params"], state_sh["params"])
    return graphdef, checkpoint.restore_params(workdir, target, step)


def load_model(directory: str | os.PathLike, step: int | None = None,
               model_cfg: dict[str, Any] | None = None) -> tuple[dict[str, Any], nnx.Module]:
    """(model config, model with restored parameters); `model_cfg` overrides the stored one
    (e.g. to run with a different dtype or scan setting)."""
    if model_cfg is None:
        model_cfg = checkpoint.read_config(directory, step)["model"]
    model = models.abstract_model(model_cfg)
    abstract = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    # On this process's first device, whatever mesh saved it (a pod's checkpoint on a laptop).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            abstract)
    params = checkpoint.restore_params(directory, abstract, step)
    graphdef, variables = nnx.split(model)
    nnx.replace_by_pure_dict(variables, params)
    return model_cfg, nnx.merge(graphdef, variables)
