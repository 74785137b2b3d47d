"""Orbax checkpoints: `<dir>/checkpoints/<step>/` holds Composite items `params` (the model
parameters as a plain nested dict) and `config` (the run config as JSON). A converted
public checkpoint and a training workdir share this layout, so any command that takes a
checkpoint takes either; tokenizer files (vocab.txt, ...) sit in `<dir>` itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from bert_jax import models


def checkpoint_dir(directory: str | os.PathLike) -> Path:
    return Path(directory).absolute() / "checkpoints"


def _manager(directory: str | os.PathLike, create: bool = False) -> ocp.CheckpointManager:
    path = checkpoint_dir(directory)
    if not create and not path.is_dir():
        raise FileNotFoundError(
            f"{directory}: no checkpoints/ folder; expected a workdir or a `bert-jax convert` output")
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=create))


def save_params(directory: str | os.PathLike, step: int, params: dict, config: dict) -> None:
    """Writes params + config as checkpoint `step` (blocking until it is complete)."""
    with _manager(directory, create=True) as mngr:
        mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                config=ocp.args.JsonSave(config)))
        mngr.wait_until_finished()


def _resolve_step(mngr: ocp.CheckpointManager, directory, step: int | None) -> int:
    steps = mngr.all_steps()
    if not steps:
        raise FileNotFoundError(f"{checkpoint_dir(directory)}: no complete checkpoint")
    if step is None:
        return max(steps)
    if step not in steps:
        raise FileNotFoundError(f"{checkpoint_dir(directory)}: no step {step}; have {sorted(steps)}")
    return step


def read_config(directory: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
    """The run config stored with a checkpoint (latest step by default)."""
    with _manager(directory) as mngr:
        step = _resolve_step(mngr, directory, step)
        return mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def restore_params(directory: str | os.PathLike, abstract_params: dict,
                   step: int | None = None) -> dict:
    """Params restored onto the shapes, dtypes and shardings of `abstract_params`."""
    with _manager(directory) as mngr:
        step = _resolve_step(mngr, directory, step)
        args = ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
        return mngr.restore(step, args=args)["params"]


def load_model(directory: str | os.PathLike, step: int | None = None,
               model_cfg: dict[str, Any] | None = None) -> tuple[dict[str, Any], nnx.Module]:
    """(model config, model with restored parameters); `model_cfg` overrides the stored one
    (e.g. to run with a different dtype or scan setting)."""
    if model_cfg is None:
        model_cfg = read_config(directory, step)["model"]
    model = models.abstract_model(model_cfg)
    abstract = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract)
    params = restore_params(directory, abstract, step)
    graphdef, state = nnx.split(model)
    nnx.replace_by_pure_dict(state, params)
    return model_cfg, nnx.merge(graphdef, state)
