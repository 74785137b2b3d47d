"""One engine setup for train, eval, plan and the bench tools: `check` runs every check of a
run spec (config.resolve, at the command boundary) that needs no compile, in one order, and
`build` makes what a run's steps are made of (mesh axes given: the objective, the optimizer
and its schedule, the abstract state and its shardings).

Nothing here reads data or allocates parameters: train restores or initialises the state from
`Engine.train_state()`, eval restores `Engine.params()`, plan compiles against both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from bert_jax import config as config_lib
from bert_jax.models import attention
from bert_jax.specs import RunSpec
from bert_jax.training import input as pipelines
from bert_jax.training import objectives, optim, state


def check(spec: RunSpec, *, platform: str | None, devices: int | None, processes: int,
          training: bool = True, reads_data: bool = True) -> None:
    """Every check of `spec` that needs no compile (its types, ranges and model fields were
    checked by config.resolve), in one order: whether the attention kernel runs on `platform`
    ('cpu', 'gpu', 'tpu'; first: on another platform the kernel's other refusals, e.g.
    cuDNN's of dropout, are beside the point), lengths, mesh and batch divisibility
    (config.validate, attention's refusals included), then (a training run that `reads_data`
    from its data source: plan reads none, nor does an objective that makes its own batches)
    whether its data is named and its TFDS data prepared. A training run's objective and its
    optimizer and schedule choices (optim.check) are checked too. `platform` and `devices`
    None (`bert-jax info`: a config, no run): the kernel's platform and the mesh's sizes are
    not checked, every other check is."""
    spec = config_lib.resolve(spec)  # (a RunSpec as it is; a test may give a config)
    if platform is not None:
        try:
            attention.check_platform(spec.model.attention_kernel, platform)
        except ValueError as e:
            raise config_lib.ConfigError(str(e)) from None
    objective = objectives.for_config(spec) if training else None
    if objective is not None:
        objective.check(spec)
    config_lib.validate(spec, devices, processes, training=training)
    if objective is None:
        return
    optim.check(spec)
    if reads_data and not objectives.makes_own_batches(objective):
        pipelines.check_source(spec)


@dataclasses.dataclass(frozen=True)
class Engine:
    """What a run's compiled steps are made of, for one mesh."""

    mesh: Mesh
    objective: objectives.Objective
    tx: optax.GradientTransformation | None  # None: evaluation (the state is the params only)
    schedule: Callable[[Any], Any] | None
    graphdef: Any  # the model's static structure (nnx.GraphDef)
    abstract: dict  # the state's shapes: {params[, opt_state, step]}
    state_sh: dict  # and their shardings

    def train_state(self) -> dict:
        """The abstract train state carrying its shardings (a compile's or a restore's target)."""
        return state.with_shardings(self.abstract, self.state_sh)

    def params(self) -> dict:
        """The abstract params carrying their shardings."""
        return state.with_shardings(self.abstract["params"], self.state_sh["params"])


def build(spec: RunSpec, mesh: Mesh, *, training: bool = True) -> Engine:
    """The engine of `spec` on `mesh`; `training=False` (evaluation, features) leaves out the
    optimizer, so the state is the params only."""
    spec = config_lib.resolve(spec)
    objective = objectives.for_config(spec)
    tx, schedule = optim.make_optimizer(spec) if training else (None, None)
    graphdef, abstract, state_sh = state.abstract_state(spec, mesh, tx)
    return Engine(mesh, objective, tx, schedule, graphdef, abstract, state_sh)


def platform() -> str:
    """The platform this process computes on."""
    return jax.devices()[0].platform
