"""Checkpoints written before a parameter's layout changed, restored into today's models.

One change so far: a pre-norm stack after an embedding norm (ModernBERT) held an attention norm
for every layer, the first layer's unused (it reads the normalised embeddings); it now holds
those of layers 1.. (models/transformer.py Stack), none in a one-layer stack. Such a
checkpoint's `layers/attention_norm` leaves, the parameters' and their optimizer moments',
have one row more than today's (or exist where today's model has none): they are restored at
their saved shape and the first row dropped. `target` makes the restore target from the
checkpoint's shapes, `today` the restored tree in today's layout.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

log = logging.getLogger(__name__)

STACK, NORM = "layers", "attention_norm"  # the stacked layers, the norm the first layer lacks


def _rebuild(tree, fn, names: tuple[str, ...] = ()):
    """`tree` with its containers copied (dicts, tuples, namedtuples, lists) and each dict
    passed through fn(path names, dict); path names as trees.key_names spells them."""
    if isinstance(tree, dict):
        return fn(names, {k: _rebuild(v, fn, (*names, str(k))) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # optax's states
        return type(tree)(*(_rebuild(getattr(tree, f), fn, (*names, f)) for f in tree._fields))
    if isinstance(tree, tuple | list):
        return type(tree)(_rebuild(v, fn, (*names, str(i))) for i, v in enumerate(tree))
    return tree


def _whole(sharding):
    """The leaf's sharding without splitting it (the saved rows need not divide as today's)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return sharding


def has_first_row(names: tuple[str, ...], saved: tuple, shape: tuple) -> bool:
    """Whether a checkpoint's leaf at path `names` of shape `saved` is today's leaf of `shape`
    with the first layer's attention norm row."""
    return names[-3:-1] == (STACK, NORM) and tuple(saved) == (shape[0] + 1, *shape[1:])


def target(saved: dict[str, tuple], abstract) -> tuple[Any, dict[str, Any]]:
    """(`abstract` with the checkpoint's old-layout leaves at their saved shapes, {their path:
    today's sharding of the rows kept, or None where today's model holds none}); `saved`:
    {path: shape} of the checkpoint (checkpoint._shapes)."""
    changed: dict[str, Any] = {}

    def fix(names: tuple[str, ...], d: dict) -> dict:
        at = "/".join(names)
        if names[-2:] == (STACK, NORM):  # one row more in the checkpoint
            for leaf, x in d.items():
                shape = saved.get(f"{at}/{leaf}")
                if shape is not None and has_first_row((*names, leaf), shape, x.shape):
                    changed[f"{at}/{leaf}"] = x.sharding
                    d[leaf] = jax.ShapeDtypeStruct(shape, x.dtype, sharding=_whole(x.sharding))
        elif names[-1:] == (STACK,) and NORM not in d and d:  # a one-layer stack's
            like = jax.tree.leaves(d)[0]
            old = {k.removeprefix(f"{at}/{NORM}/"): s for k, s in saved.items()
                   if k.startswith(f"{at}/{NORM}/") and len(s) and s[0] == 1}
            if old:
                changed.update({f"{at}/{NORM}/{leaf}": None for leaf in old})
                d[NORM] = {leaf: jax.ShapeDtypeStruct(tuple(s), like.dtype, sharding=_whole(like.sharding))
                           for leaf, s in old.items()}
        return d

    return _rebuild(abstract, fix), changed


def today(restored, changed: dict[str, Any]):
    """The `restored` tree (restored onto `target`'s) in today's layout: the first rows of the
    changed leaves dropped, placed as today's."""
    if not changed:
        return restored

    def fix(names: tuple[str, ...], d: dict) -> dict:
        at = "/".join(names)
        for leaf in list(d):
            if f"{at}/{leaf}" not in changed:
                continue
            if changed[f"{at}/{leaf}"] is None:
                del d[leaf]
            else:
                d[leaf] = jax.device_put(d[leaf][1:], changed[f"{at}/{leaf}"])
        # a one-layer stack, its norm dropped
        if names[-1:] == (STACK,) and isinstance(d.get(NORM), dict) and not d[NORM]:
            del d[NORM]
        return d

    return _rebuild(restored, fix)


def say(where: str, *changed: dict[str, Any]) -> None:
    """One log line for a restore of checkpoint `where` that changed layouts (target's)."""
    paths = sorted(p for c in changed for p in c)
    if paths:
        log.info(f"checkpoint {where} was written when the first layer of a pre-norm stack held "
                 f"an attention norm it does not use; that row is dropped ({len(paths)} arrays: "
                 f"{', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})")

