"""Device mesh, logical-axis rules and the shardings of train state and batches.

Model parameters carry logical axis names (`out_sharding` metadata, e.g. ('embed', 'mlp'));
the config's `logical_axis_rules` map each name to mesh axes ('data', 'fsdp', 'tensor').
Nothing else in the codebase names a mesh axis except the batch sharding here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bert_jax import trees
from bert_jax.config import BATCH_AXES, MESH_AXES, ConfigError, mesh_shape
from bert_jax.models import layers


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh with Auto axes (so logical rules and XLA's sharding
    propagation apply; jax.make_mesh defaults to Explicit)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = mesh_shape(mesh_cfg, len(devices))
    auto = (AxisType.Auto,) * len(MESH_AXES)
    num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    if num_slices == 1:
        return jax.make_mesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES, axis_types=auto,
                             devices=devices)
    # Several TPU slices joined by the data-center network: only the data axis crosses it
    # (one gradient all-reduce per step); fsdp and tensor stay inside a slice.
    if sizes["data"] % num_slices:
        raise ConfigError(f"mesh {sizes}: mesh.data must be a multiple of the {num_slices} "
                          f"slices (only data parallelism crosses slices)")
    per_slice = (sizes["data"] // num_slices, sizes["fsdp"], sizes["tensor"])
    grid = mesh_utils.create_hybrid_device_mesh(per_slice, (num_slices, 1, 1), devices)
    return Mesh(grid, MESH_AXES, axis_types=auto)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], rules, mesh: Mesh
                    ) -> PartitionSpec:
    """PartitionSpec of an array with logical `axes`. A mesh axis is used once per array;
    a dimension not divisible by its mesh axes stays replicated (e.g. a 2-way segment table
    on an 8-way fsdp axis)."""
    table = dict((name, target) for name, target in rules)
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape, strict=True):
        target = table.get(name) if name is not None else None
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        targets = tuple(t for t in targets if t not in used and mesh.shape[t] > 1)
        if targets and dim % math.prod(mesh.shape[t] for t in targets) == 0:
            used.update(targets)
            spec.append(targets[0] if len(targets) == 1 else targets)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def param_shardings(params_state: nnx.State, mesh: Mesh, rules) -> dict:
    """Pure-dict tree of NamedShardings for an nnx.Param State (abstract or concrete)."""
    items = []
    leaves = jax.tree_util.tree_leaves_with_path(
        params_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for path, var in leaves:
        keys = trees.key_names(path)
        axes = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        items.append((keys, NamedSharding(mesh, logical_to_spec(axes, var.shape, rules, mesh))))
    return trees.nest(items)


def activation_sharding(fn, mesh: Mesh, rules):
    """`fn` that, while traced, pins the models' activations (layers.constrain) to the layout
    the logical axis `rules` give on `mesh`: batch over data and fsdp, heads and mlp over
    tensor, the rest replicated, instead of the layout XLA would guess from the parameters.
    Kernels that run per shard (splash attention) take the mesh and specs from it too."""
    context = layers.ShardingContext(mesh, lambda axes, shape: logical_to_spec(axes, shape, rules, mesh))

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with layers.sharded(context):
            return fn(*args, **kwargs)
    return wrapped


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Leading (example) axis split over data and fsdp; the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local: dict[str, np.ndarray], mesh: Mesh, num_processes: int
                 ) -> dict[str, jax.Array]:
    """Global arrays from this host's share of the batch (every host passes its own rows)."""
    out = {}
    for name, x in local.items():
        shape = (x.shape[0] * num_processes, *x.shape[1:])
        out[name] = jax.make_array_from_process_local_data(
            batch_sharding(mesh, x.ndim), x, shape)
    return out


def bytes_per_device(abstract_tree, shardings_tree) -> int:
    """Bytes one device holds of a tree (from shapes and shardings; nothing allocated)."""
    total = 0
    for x, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings_tree), strict=True):
        total += math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
    return total
