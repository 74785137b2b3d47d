"""Nested-dict (pytree) helpers shared by the state, sharding, checkpoint and model code."""

from __future__ import annotations

from typing import Any


def key_names(path) -> tuple[str, ...]:
    """A jax tree path (DictKey, GetAttrKey, SequenceKey, ...) as plain strings."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def overlay(tree: dict, new: dict) -> dict:
    """`tree` with the leaves present in `new` (a subtree of it) replaced."""
    return {k: (overlay(v, new[k]) if isinstance(v, dict) else new[k]) if k in new else v
            for k, v in tree.items()}


def nest(items: list[tuple[tuple[str, ...], Any]]) -> dict:
    """{(a, b): x, ...} items -> {a: {b: x}}."""
    out: dict = {}
    for keys, value in items:
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out


def dotted(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested dict such as a run config as JSON (an empty section
    is a value itself)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix.rstrip("."): tree}
    return {k: v for name, sub in tree.items() for k, v in dotted(sub, f"{prefix}{name}.").items()}
