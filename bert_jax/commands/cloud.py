"""`bert-jax info`, `plan` and `launch`: a model's size, a run compiled for a Cloud TPU slice,
and the run on the slice."""

from __future__ import annotations

import json
import sys

from absl import app

from bert_jax.commands.options import (
    ANY_ZONE,
    COMMIT,
    CONFIG,
    DRY_RUN,
    JSON,
    KEEP,
    MAX_RESTARTS,
    MFU,
    NAME,
    POLL,
    PROJECT,
    PYTHON,
    REPO,
    RUNTIME,
    SEQ_LEN,
    SKIP_PLAN,
    SLICES,
    SPOT,
    TOPOLOGY,
    WORKDIR,
    ZONE,
    LoadedConfig,
    require,
)
from bert_jax.paths import REPO as ROOT  # the checkout launch runs from (tests point it elsewhere)


def cmd_info(args: list[str]) -> None:
    """Prints the model, its parameter count per module and total, and FLOPs per token."""
    from bert_jax import models
    from bert_jax.config import check_overrides_read, model_config, resolve
    from bert_jax.training import setup

    config = require(CONFIG, "info")
    # The config checks train and plan run (not the platform's or the devices': no run here)
    spec = resolve(config)
    check_overrides_read(spec, LoadedConfig.set_by_user())
    setup.check(spec, platform=None, devices=None, processes=1, reads_data=False)
    if SEQ_LEN.value is not None and SEQ_LEN.value < 1:
        raise app.UsageError(f"--seq_len={SEQ_LEN.value}: tokens per sequence, >= 1 (leave it "
                             "out for the config's data.max_seq_length)")
    model_cfg = model_config(config)
    seq_len = SEQ_LEN.value or config.get("data", {}).get("max_seq_length", model_cfg.get(
        "max_len", 512))
    model = models.abstract_model(model_cfg)
    counts = models.param_counts(model)
    total = counts.pop("total")
    print(f"model: {model_cfg['name']} ({type(model).__name__})")
    print("config: " + ", ".join(f"{k}={v}" for k, v in sorted(model_cfg.items()) if k != "name"))
    width = max(len(k) for k in counts)
    print(f"\n{'module':<{width}}  {'parameters':>13}  {'share':>6}")
    for name, n in counts.items():
        print(f"{name:<{width}}  {n:>13,}  {100 * n / total:>5.1f}%")
    print(f"{'total':<{width}}  {total:>13,}  ({total / 1e6:.1f}M)")
    if at := models.encoder_path(model_cfg["name"]):  # a task model: the count papers publish
        encoder = sum(n for k, n in counts.items() if tuple(k.split("/")[:len(at)]) == at)
        print(f"{'encoder':<{width}}  {encoder:>13,}  ({encoder / 1e6:.1f}M, {'/'.join(at)}/: "
              "without the task head)")
    print(f"\nforward FLOPs per token at sequence length {seq_len} (training ~3x):")
    for name, value in models.flops_per_token(model_cfg, seq_len).items():
        print(f"  {name}: {value / 1e6:,.1f} MFLOPs")


def cmd_plan(args: list[str]) -> None:
    """Compiles the train step of each sequence-length phase and the eval step for a Cloud TPU
    slice (no TPU needed; libtpu: pip install 'bert_jax[tpu]') and prints memory per device
    against its HBM, whether it fits, model FLOPs per step and the projected run time."""
    from bert_jax.cloud import plan

    result = plan.plan(require(CONFIG, "plan"), require(TOPOLOGY, "plan"), SLICES.value, MFU.value,
                       set_by_user=LoadedConfig.set_by_user())
    print(json.dumps(result, indent=1) if JSON.value else plan.format_plan(result))
    if not result["fits"]:
        sys.exit(1)


def cmd_launch(args: list[str]) -> None:
    """Plans the config for the slice (refusing one that does not fit), queues the capacity,
    sets up every worker at a pinned commit, trains with one log per worker under
    <workdir>/logs, re-queues and resumes after preemption, and deletes the capacity at the
    end (see launch/README.md)."""
    from bert_jax import config as config_lib
    from bert_jax import paths
    from bert_jax.cloud import bringup, launch, plan
    from bert_jax.training import state

    config = require(CONFIG, "launch")
    topology, workdir = require(TOPOLOGY, "launch"), require(WORKDIR, "launch")
    name, zone = require(NAME, "launch"), require(ZONE, "launch")
    launch.check_flags(name, zone, topology, MAX_RESTARTS.value, POLL.value, ANY_ZONE.value,
                       RUNTIME.value)
    if not workdir.startswith("gs://"):
        raise ValueError(f"--workdir={workdir}: the workers of a slice share a gs:// workdir "
                         "(checkpoints, logs); a local path would be one per worker")
    try:
        src = launch.source(ROOT, CONFIG.value, REPO.value, COMMIT.value, DRY_RUN.value)
    except launch.NoSource as e:
        raise app.UsageError(str(e)) from None
    # Before compiling or renting anything: what would make the workers fail.
    launch.check_worker_paths(config, ROOT)
    planned = launch.as_on_workers(config, ROOT)  # (init_from inside the repository: from here)
    # A dry run touches no network: a gs:// init_from is not read (the plan: the config's sizes).
    read_init = not (DRY_RUN.value and paths.is_remote(planned.init_from))
    if read_init:
        state.check_set_sizes(planned, LoadedConfig.set_by_user())
    else:
        print(f"warning: dry run: init_from={planned.init_from} is not read (no network): the "
              "plan has the config's sizes; a launch reads it and refuses sizes that differ",
              file=sys.stderr)
    python = bringup.check_python(PYTHON.value or bringup.default_python())
    src = launch.check_source(ROOT, src, DRY_RUN.value)
    # The config the workers train with (init_from's sizes where none are set), as a resume
    # compares it with a checkpoint already in the workdir (not in a dry run: no network).
    trained = None if DRY_RUN.value else json.loads(state.sizes_from_init(
        config_lib.complete(planned), LoadedConfig.set_by_user()).to_json())
    bringup.check_workdir(workdir, DRY_RUN.value, trained)
    pins, notes = bringup.lock(ROOT / "pyproject.toml")
    print(bringup.describe(python, pins))
    for note in notes:
        print(f"warning: not pinned for the workers: {note}", file=sys.stderr)
    if SKIP_PLAN.value:  # train's checks still run (plan runs them too): nothing compiles
        from bert_jax.cloud import tpu
        from bert_jax.training import setup

        spec = config_lib.resolve(planned)
        config_lib.check_overrides_read(spec, LoadedConfig.set_by_user())
        sl = tpu.parse(topology)
        setup.check(spec, platform="tpu", devices=sl.devices, processes=sl.hosts,
                    reads_data=False)
        print("warning: --skip_plan: the config was not compiled for the slice", file=sys.stderr)
    else:
        result = plan.plan(planned, topology, set_by_user=LoadedConfig.set_by_user(),
                           read_init=read_init)
        print(plan.format_plan(result))
        if not result["fits"]:
            raise ValueError(f"the config does not fit {topology} (plan above); refusing to launch")
    run = launch.Launch(
        name=name, zone=zone, topology=topology, workdir=workdir, repo=src.repo, commit=src.commit,
        train_args=["--config", src.config, *(f"--config.{o}" for o in LoadedConfig.overrides)],
        project=PROJECT.value, runtime_version=RUNTIME.value, spot=SPOT.value, keep=KEEP.value,
        dry_run=DRY_RUN.value, max_restarts=MAX_RESTARTS.value, poll_seconds=POLL.value,
        python=python, lock=tuple(pins))
    print(json.dumps(launch.run(run)))
