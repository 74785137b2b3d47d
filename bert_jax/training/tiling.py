"""init_mode=tile_from_middle: a larger BERT-family model started from a smaller checkpoint's
weights, each tensor tiled from the middle, as ModernBERT-large was started from base.
Transcribed from AnswerDotAI/ModernBERT, branch pretraining_documentation:
src/bert_layers/initialization.py (`tile_weight` with `tile_weights_from_middle`,
`tile_fused_qkv`, `tile_fused_glu`, `tile_norm`, `tile_embedding`) and src/bert_layers/model.py
(`init_model_from_pretrained`, `init_mlm_model_from_pretrained`).

- Along an axis that grows from n to m, index j of the new tensor reads index
  (j - (m - n) // 2) mod n of the old one: the old tensor in the middle, copies of it cut at
  both ends (what the reference's loops compute); an axis of equal size is copied.
- The reference tiles each of its fused Wqkv's q, k and v [heads x head_dim, hidden], and each
  of Wi's two GLU halves, on its own: our separate kernels tiled one by one give its numbers.
  heads x head_dim is one axis there, so it is one axis (flattened) here too.
- Layer i of the new model is layer round(i x old / new) of the old (Python's round: a half to
  even), as the reference maps them; a map that would reach past the last layer is refused
  (the reference fails there with an IndexError).
- Not tiled, as in the reference (the new model's fresh values stay): the final norm, and the
  attention norm of a layer read from the old layer 0 of a model whose first layer reads the
  embedding norm (ModernBERT's layer 0 has none there, an identity the reference skips; a
  stacked leaf may hold that norm's row, unused, or leave it out: stacked_rows).
- The vocabulary and every other architecture field stay the same (the reference refuses a
  different vocabulary size); the model sizes (SIZE_FIELDS) may only grow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx, traverse_util

from bert_jax import models, trees
from bert_jax.config import ConfigError
from bert_jax.models.config import BertConfig
from bert_jax.training import checkpoint

SIZE_FIELDS = checkpoint.SIZE_FIELDS  # the fields tiling grows; the other architecture fields agree
GROWS = ("embed", "mlp", "kv", "layers")  # the logical axes of the sizes (heads x kv as one)
NOT_TILED = ("final_norm",)  # the reference leaves the new model's own (fresh) values


def middle(new: int, old: int) -> np.ndarray:
    """The old index each of `new` positions reads, the old tensor in the middle."""
    return (np.arange(new) - (new - old) // 2) % old


def layer_map(new: int, old: int) -> list[int]:
    """The old layer each new layer starts from (the reference's round(i * old / new))."""
    return [round(i * old / new) for i in range(new)]


def stacked_rows(new_rows: int, old_rows: int, layers: Sequence[int], old_layers: int,
                 first: int = 0) -> np.ndarray:
    """The row of an old stacked leaf each row of the new one reads (-1: none, the old layer
    has no such tensor). A leaf of n rows holds the last n layers (a pre-norm stack after an
    embedding norm may leave out layer 0's attention norm); `first`: the old leaf's first
    layer that has the tensor (1: its layer 0's row is there but unused)."""
    new_first, old_first = len(layers) - new_rows, old_layers - old_rows
    read = np.asarray(layers)[new_first:]
    return np.where(read >= max(old_first, first), read - old_first, -1)


def tile(x: np.ndarray, axes: Sequence[str | None], shape: tuple[int, ...],
         layers: Sequence[int]) -> np.ndarray:
    """`x` (logical `axes`) tiled from the middle to `shape`, its `layers` axis through
    `layers` (layer_map)."""
    axes = list(axes)
    if "heads" in axes:  # heads x head_dim as one axis, as the reference's fused projections
        h = axes.index("heads")
        assert axes[h + 1] == "kv", axes
        flat = x.reshape(x.shape[:h] + (-1,) + x.shape[h + 2:])
        flat_shape = shape[:h] + (shape[h] * shape[h + 1],) + shape[h + 2:]
        return tile(flat, axes[:h] + ["heads*kv"] + axes[h + 2:], flat_shape, layers).reshape(shape)
    for i, name in enumerate(axes):
        x = np.take(x, np.asarray(layers) if name == "layers" else middle(shape[i], x.shape[i]),
                    axis=i)
    return x


def check(directory: str | os.PathLike, theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    """A ConfigError unless the model `ours` can be tiled from checkpoint `directory`'s model
    `theirs` (complete model sections): the same BERT-family architecture, no size smaller,
    and a layer map within the checkpoint's layers."""
    checkpoint.check_same_family(directory, theirs, ours)
    where = f"init_from={directory} with init_mode=tile_from_middle"
    if models.CONFIGS[ours["name"]] is not BertConfig:
        raise ConfigError(f"{where}: tiling grows BERT-family encoders (ModernBERT-large from base); "
                          f"model {ours['name']!r} is not one: use init_mode=exact")
    diff = [k for k in checkpoint.ARCHITECTURE_FIELDS if k not in SIZE_FIELDS
            and k in ours and k in theirs and ours[k] != theirs[k]]
    if diff:
        found = "; ".join(f"model.{k}: config {ours[k]!r}, checkpoint {theirs[k]!r}" for k in diff)
        raise ConfigError(f"{where}: tiling grows only the sizes ({', '.join(SIZE_FIELDS)}), but "
                          f"{found}; set " + " ".join(f"--config.model.{k}={theirs[k]}" for k in diff))
    width = {k: c["num_heads"] * c["head_dim"] for k, c in (("ours", ours), ("theirs", theirs))}
    smaller = [(f"model.{k}={ours[k]}", theirs[k]) for k in ("emb_dim", "num_layers", "mlp_dim")
               if ours[k] < theirs[k]]
    if width["ours"] < width["theirs"]:
        smaller.append((f"model.num_heads x model.head_dim={width['ours']}", width["theirs"]))
    if smaller:
        what, least = smaller[0]
        raise ConfigError(f"{where}: {what} is smaller than the checkpoint's {least}; tiling starts a "
                          f"model at least as large as the checkpoint's (set it >= {least}), "
                          f"init_mode=exact loads a model of the checkpoint's sizes")
    if max(layer_map(ours["num_layers"], theirs["num_layers"])) >= theirs["num_layers"]:
        most = max(n for n in range(theirs["num_layers"], 2 * theirs["num_layers"] + 2)
                   if max(layer_map(n, theirs["num_layers"])) < theirs["num_layers"])
        raise ConfigError(f"{where}: model.num_layers={ours['num_layers']} maps its last layers past "
                          f"the checkpoint's {theirs['num_layers']} (layer i reads round(i * "
                          f"{theirs['num_layers']} / {ours['num_layers']})); use at most {most} layers")


def tiled(directory: str | os.PathLike, source_cfg: dict[str, Any], source: dict,
          model_cfg: dict[str, Any], abstract_params: dict) -> tuple[dict, list[str], list[str]]:
    """(our parameters tiled from `source`, the params of the checkpoint in `directory` with
    model section `source_cfg`, placed with the shardings of `abstract_params`; our parameters
    left fresh; the checkpoint's not used), as load_pretrained returns them."""
    source_cfg, model_cfg = (models.complete_model_config(c) for c in (source_cfg, model_cfg))
    check(directory, source_cfg, model_cfg)
    layers = layer_map(model_cfg["num_layers"], source_cfg["num_layers"])
    skips_first_norm = source_cfg["norm"] == "pre" and source_cfg["embedding_norm"]
    theirs_at, ours_at = (models.encoder_path(c["name"]) for c in (source_cfg, model_cfg))
    theirs = {ours_at + k[len(theirs_at):] if k[:len(theirs_at)] == theirs_at else k: v
              for k, v in traverse_util.flatten_dict(source).items()}
    with jax.set_mesh(None):  # (under a mesh, eval_shape would take logical names for mesh axes)
        abstract_model = models.abstract_model(model_cfg)
    axes = {trees.key_names(path): v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
            for path, v in jax.tree_util.tree_leaves_with_path(
                nnx.state(abstract_model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))}
    found = {}
    for k, target in traverse_util.flatten_dict(abstract_params).items():
        if k not in theirs or any(name in k for name in NOT_TILED):
            continue
        old = np.asarray(theirs[k])
        fixed = [i for i, name in enumerate(axes[k]) if name not in GROWS and name != "heads"
                 and old.shape[i] != target.shape[i]]
        if fixed:  # e.g. a classifier's labels: nothing to tile them from
            raise ConfigError(f"init_from={directory} with init_mode=tile_from_middle: parameter "
                              f"{'/'.join(k)} has shape {old.shape} in the checkpoint but "
                              f"{target.shape} here; tiling grows only the {', '.join(GROWS)} axes")
        rows = (stacked_rows(target.shape[0], old.shape[0], layers, source_cfg["num_layers"],
                             first=int(skips_first_norm and "attention_norm" in k))
                if axes[k][0] == "layers" else np.zeros(0, int))
        x = tile(old, axes[k], target.shape, np.maximum(rows, 0)).astype(target.dtype)
        if (rows < 0).any():  # a norm with no old tensor (layer 0's attention norm): fresh values
            assert "norm" in "/".join(k), k
            x[rows < 0] = 1.0 if k[-1] == "scale" else 0.0
        found[k] = jax.make_array_from_callback(target.shape, target.sharding,
                                                lambda index, x=x: x[index])
    fresh = sorted("/".join(k) for k in traverse_util.flatten_dict(abstract_params) if k not in found)
    unused = sorted("/".join(k) for k in theirs if k not in found)
    return traverse_util.unflatten_dict(found), fresh, unused
