"""Orbax checkpoints: `<dir>/checkpoints/<step>/` holds Composite items `params` (the model
parameters as a plain nested dict) and `config` (the run config as JSON), and
`checksums.json`, the sizes and CRC32s of its files (integrity.py). A converted
public checkpoint and a training workdir share this layout, so any command that takes a
checkpoint takes either; tokenizer files (vocab.txt, ...) sit in `<dir>` itself."""

from __future__ import annotations

import collections
import gc
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from bert_jax import log as log_lib
from bert_jax import models, paths, tasks, trees
from bert_jax.config import ConfigError
from bert_jax.models.config import fields_of_kind
from bert_jax.paths import check_output, workdir_path
from bert_jax.training import integrity, old_layouts, sharding

log = logging.getLogger(__name__)


# From each model config field's `kind` (models/config.py). Model fields that must agree for
# pretrained weights to fit (dropout, dtype, scan, heads may differ):
ARCHITECTURE_FIELDS = fields_of_kind("architecture")
# Those init_mode=tile_from_middle may grow (training/tiling.py); the others must agree there too.
SIZE_FIELDS = ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim")
# Fields that must agree for a training run to resume from a checkpoint: the model's
# parameters (their shapes and tree) and what they compute.
STATE_FIELDS = ("name", *ARCHITECTURE_FIELDS, *fields_of_kind("state"))


def changed_fields(before: dict, now: dict, fields, prefix: str) -> str:
    """'<prefix>x: A in the checkpoint, B here; ...' for the `fields` that differ ('' if
    none); a field absent from either side is not compared."""
    return "; ".join(f"{prefix}{k}: {before[k]!r} in the checkpoint, {now[k]!r} here"
                     for k in fields if k in before and k in now and before[k] != now[k])


def checkpoint_dir(directory: str | os.PathLike) -> epath.Path:
    return workdir_path(directory) / "checkpoints"


def check_writable(workdir: str | os.PathLike) -> None:
    """Before a run starts: a gs:// workdir's storage is reachable, and this process can write
    in the workdir and in its checkpoints/ (a read-only checkpoints/ would otherwise be found
    at the first save, after the compile and the first steps). One line if not."""
    check_output(workdir, "--workdir", "folder")  # a file where it must be: no permission would help
    root = workdir_path(workdir)
    for folder, name in ((root, "the workdir"), (root / "checkpoints", "the checkpoints folder")):
        probe = folder / f".write-check.{jax.process_index()}.{os.getpid()}"
        try:
            if folder == root:
                folder.mkdir(parents=True, exist_ok=True)
            elif not folder.exists():  # made at the first save, in a workdir that is writable
                continue
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            reason = e.strerror or (str(e).splitlines() or [type(e).__name__])[0]
            raise OSError(f"cannot write to {name} {folder} ({reason}); "
                          f"check its permissions and free space, then rerun") from None


def manager(directory: str | os.PathLike, *, create: bool = False, read_only: bool = False,
            options: ocp.CheckpointManagerOptions | None = None,
            item_handlers: dict | None = None) -> ocp.CheckpointManager:
    """The Orbax manager of `<directory>/checkpoints` (every command builds its manager here).
    Without `create`, a directory with no checkpoints/ folder is an error naming it."""
    path = checkpoint_dir(directory)
    if not create and not path.is_dir():  # a step's, a sweep's or a Hugging Face folder: said so
        raise FileNotFoundError(paths.wrong_kind(directory, "", ("run", "folder"), "a checkpoint") or
            f"{directory}: no checkpoints/ folder; expected a workdir or a `bert-jax convert` output")
    options = options or ocp.CheckpointManagerOptions(create=create, read_only=read_only,
                                                      async_options=async_options())
    _use_retry_policy()
    _gate_replica_parallel_writes()
    try:
        return ocp.CheckpointManager(path, options=options, item_handlers=item_handlers or _handlers())
    except ValueError as e:  # Orbax reads every step's metrics when it lists the steps
        bad = _unreadable_metrics(path)
        if bad is None:
            raise
        raise ValueError(f"{bad}: not valid JSON ({e}); a step's metrics file is damaged: restore "
                         f"it from a copy, or move the step folder {bad.parent.parent} out of "
                         f"{path}") from None


def _unreadable_metrics(path: epath.Path) -> epath.Path | None:
    """The first `<step>/metrics/metrics` file under `path` that is not JSON, or None."""
    for step_dir in sorted(path.iterdir(), key=lambda p: p.name):
        metrics = step_dir / "metrics" / "metrics"
        try:
            json.loads(metrics.read_text())
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (ValueError, UnicodeDecodeError):
            return metrics
    return None


# In a one-process run, an array replicated over devices is written by its replicas together,
# each a slice of it (Orbax's replica-parallel saving), only where a slice holds at least this
# much: each slice is an op dispatched (and at its first shape compiled) on the device, which
# for a small array costs more than the whole write (a tiny BERT on 8 CPU devices: 700 slices,
# 4.4 s a save), and one process writes every slice anyway. Runs of several processes keep
# Orbax's default: there the slices spread the writing over the hosts (BERT-base on 16 data
# replicas: every matrix under 1 MiB a slice, which would leave host 0 writing them all).
MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL = 1 << 20


def _gate_replica_parallel_writes() -> None:
    """Orbax's handler of jax.Arrays (its global registry, which StandardCheckpointHandler
    reads) with MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL, in a one-process run; once."""
    if jax.process_count() > 1:
        return
    handlers = ocp.type_handlers
    current = handlers.get_type_handler(jax.Array)
    gate = MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL
    if getattr(current, "_min_slice_bytes_for_replica_parallel", None) == gate:
        return
    from orbax.checkpoint._src.metadata import array_metadata_store

    store = getattr(current, "_array_metadata_store", None) or array_metadata_store.Store()
    quiet = logging.getLogger("absl")  # Orbax warns of every override, in each process
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        handlers.register_type_handler(jax.Array, handlers.ArrayHandler(
            array_metadata_store=store, min_slice_bytes_for_replica_parallel=gate), override=True)
    finally:
        quiet.setLevel(level)


def _use_retry_policy() -> None:
    """paths.retry_policy() for tensorstore's GCS requests (Orbax's arrays). Orbax 0.12 takes no
    tensorstore context from its caller: each save and restore builds one from these module
    defaults (tensorstore_utils.get_ts_context), so the policy goes there, at every manager
    (a changed $BERT_JAX_GCS_RETRY is read again)."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    retries = paths.tensorstore_retries(paths.retry_policy())
    for defaults in (tensorstore_utils._BASE_TS_CONTEXT, tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT):
        defaults["gcs_request_retries"] = retries


def storage_failure(error: BaseException, where, operation: str) -> paths.StorageFailing | None:
    """The one line of a store that kept failing while `operation` read or wrote `where` (the
    policy's tries spent, by gcsfs or by tensorstore), wherever Orbax wrapped it; None when
    `error` is something else (then the files themselves may be at fault)."""
    seen = error
    while seen is not None:
        if isinstance(seen, paths.StorageFailing):
            return seen
        seen = seen.__cause__ or seen.__context__
    said = re.search(r"Google Cloud Storage kept failing: [^\n]*", str(error))
    if said:
        return paths.StorageFailing(said[0])
    return paths.tensorstore_gave_up(error, str(where), operation)


def async_options(**kwargs) -> ocp.AsyncOptions:
    """Orbax's async options for every manager: a step's directories are made in save()
    itself (create_directories_asynchronously=False), so that a checkpoints/ folder that
    cannot take them (read-only, full, gone, permission revoked) fails that call at once.
    Made in the background (Orbax's default), a failed mkdir leaves the save's writer
    threads (not daemons) waiting for a "directories made" signal that never comes, for
    Orbax's 300 s coordination timeout, and the process cannot exit until they give up."""
    return ocp.AsyncOptions(create_directories_asynchronously=False, **kwargs)


def _handlers() -> dict:
    """Every item a checkpoint may hold (Orbax warns about items it has no handler for)."""
    return {"params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(), "config": ocp.JsonCheckpointHandler()}


def rank_value(score: float) -> float:
    """A score as checkpoints are ranked by it (higher is better): nan (an undefined metric,
    e.g. the correlation of constant predictions) below every number, never beside them (a
    comparison with nan is always False, which would leave the order to chance)."""
    return -math.inf if math.isnan(score) else score


def metric_rank(metrics: dict, name: str) -> float:
    """A checkpoint's rank by metric `name` (rank_value); one saved without it (by a run that
    measured other metrics) below every number, never a KeyError inside Orbax's save."""
    return rank_value(metrics[name]) if name in metrics else -math.inf


def best_step(scores: dict[int, float | None]) -> int | None:
    """The step with the highest score (None scores ignored, nan below every number); ties go
    to the later step, as Orbax's BestN keeps (TrainCheckpointer's policy) do."""
    scored = {s: rank_value(v) for s, v in scores.items() if v is not None}
    return max(scored, key=lambda s: (scored[s], s)) if scored else None


def _preservation_policy(keep: int, best_metric: str | None, kept: Sequence[int]):
    """Keep the newest `keep` checkpoints, the `kept` steps, and the best one by
    `best_metric` (higher is better) if given."""
    policy = ocp.checkpoint_managers
    policies = [policy.LatestN(n=keep)]
    if kept:
        policies.append(policy.CustomSteps(steps=list(kept)))
    if best_metric:
        policies.append(policy.BestN(get_metric_fn=lambda m: metric_rank(m, best_metric), n=1,
                                     keep_checkpoints_without_metrics=False))
    return policy.AnyPreservationPolicy(policies)


def save_params(directory: str | os.PathLike, step: int, params: dict, config: dict) -> None:
    """Writes params + config as checkpoint `step` (blocking until it is complete)."""
    with manager(directory, create=True) as mngr:
        mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                config=ocp.args.JsonSave(config)))
        mngr.wait_until_finished()
    if jax.process_index() == 0:
        integrity.write(checkpoint_dir(directory) / str(step))


def resolve_step(directory: str | os.PathLike, step: int | None = None) -> int:
    """`step` if the directory has that checkpoint, else its latest (an error names what
    steps there are)."""
    with manager(directory) as mngr:
        return _resolve_step(mngr, directory, step)


def no_checkpoint(directory, what: str = "no complete checkpoint",
                  advice: str = "give the workdir of a run that saved one, or a `bert-jax convert` "
                                "output") -> FileNotFoundError:
    """The error for a workdir without a complete checkpoint, naming the steps a train resume
    set aside as `<step>.unreadable` where there are some (and how to read them again)."""
    where = checkpoint_dir(directory)
    aside = sorted(p.name for p in where.glob("*.unreadable")) if where.is_dir() else []
    if aside:  # a resume that could not restore them renamed them
        return FileNotFoundError(
            f"{where}: {what}, only {', '.join(aside)} (set aside by a train resume that could "
            f"not restore it: its log says why); if its params are intact, rename it back to "
            f"{aside[-1].removesuffix('.unreadable')} to read them, else {advice}")
    return FileNotFoundError(f"{where}: {what}; {advice}")


def _resolve_step(mngr: ocp.CheckpointManager, directory, step: int | None) -> int:
    steps = mngr.all_steps()
    if not steps:
        raise no_checkpoint(directory)
    if step is None:
        return max(steps)
    if step not in steps:
        raise FileNotFoundError(f"{checkpoint_dir(directory)}: no step {step}; have {sorted(steps)}")
    return step


def _first_line(error: Exception) -> str:
    """The start of an error's message (TensorStore's run to pages of spec)."""
    first = (str(error).strip().splitlines() or [""])[0]
    return first.split(" See full TensorStore details")[0][:300]


REREAD_ADVICE = "use another --step, or restore the folder from a copy"  # eval, export, attention


def _unreadable(directory, step: int, item: str, error: Exception,
                advice: str = REREAD_ADVICE) -> ValueError:
    """A checkpoint item whose files cannot be read, in one line (storage that kept failing says
    so: the files are not at fault)."""
    failing = storage_failure(error, f"{checkpoint_dir(directory)}/{step}", f"reading the {item} of")
    if failing is not None:
        return failing
    return ValueError(f"{checkpoint_dir(directory)}/{step}: its {item} cannot be read "
                      f"({type(error).__name__}: {_first_line(error)}); the checkpoint is damaged: "
                      f"{advice}")


def verify(step_dir: epath.Path, items: tuple[str, ...] | None = None, collective: bool = True) -> bool:
    """Checks the files of `items` (all when None) of the checkpoint in `step_dir` against the
    checksums written when it was saved (integrity.py): a damaged checkpoint is a
    DamagedCheckpoint (a ValueError) naming it and its files; True when verified, False for a
    checkpoint saved before checksums were written. `collective` (every process calls it, as
    for a restore): in a multi-process run process 0 reads the files and tells the others
    what it found; otherwise each process reads them."""
    damaged, verified = None, False
    collective = collective and jax.process_count() > 1
    if jax.process_index() == 0 or not collective:
        try:
            verified = integrity.verify(step_dir, items)
        except integrity.DamagedCheckpoint as e:
            damaged = e
    if collective:
        from jax.experimental import multihost_utils
        found = int(multihost_utils.broadcast_one_to_all(np.int32(2 if damaged else verified)))
        verified = found == 1
        if found == 2 and damaged is None:
            damaged = integrity.DamagedCheckpoint(
                step_dir, "its files differ from their checksums (process 0 names them)")
    if damaged is not None:
        raise damaged
    if not verified:
        log.debug(f"checkpoint {step_dir}: no {integrity.MANIFEST} (saved before checksums were "
                  f"written); read unverified")
    return verified


def _say_unfinished(step_dir: epath.Path, verified: bool) -> None:
    """Before a step's params are restored: one warning line for
    a step that lacks the marks of a finished Orbax save (copied in part, renamed from a
    temporary folder, written by another tool). It is read, as Orbax reads it (Orbax only
    logs the missing file): a missing or truncated array file is still an error when read,
    and refusing would leave a whole checkpoint of an older Orbax unusable."""
    sign = integrity.unfinished(step_dir)
    if sign is None or jax.process_index() != 0:
        return
    proof = (f"its files match its {integrity.MANIFEST}" if verified else
             f"nothing shows that its save finished (it has no {integrity.MANIFEST} either)")
    log.warning(f"warning: checkpoint {step_dir} {sign}: it was copied in part, saved by another "
                f"tool or an older Orbax, or its save did not finish; {proof}. Using it; if it is "
                f"not the checkpoint you meant, use another step or a complete copy of it")


def _refuse_damaged(directory, step: int, items: tuple[str, ...], collective: bool = True,
                    advice: str | None = None) -> None:
    """verify() for a command that reads a checkpoint (eval, average, export...): a damaged one
    is an error that says what to do (`advice`, the command's own, else the usual flags);
    before its params are read, an unfinished-looking one is a warning line."""
    step_dir = checkpoint_dir(directory) / str(step)
    try:
        verified = verify(step_dir, items, collective)
        if "params" in items:
            _say_unfinished(step_dir, verified)
    except integrity.DamagedCheckpoint as e:
        raise integrity.DamagedCheckpoint(step_dir, f"{e.details}; not used: " + (
            advice or "restore the folder from a copy, or use other checkpoints (eval --step, "
            "average --last)")) from None


def read_config(directory: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
    """The run config stored with a checkpoint (latest step by default); its model section
    holds the fields its model reads (models.stored_model_config)."""
    with manager(directory) as mngr:
        step = _resolve_step(mngr, directory, step)
        _refuse_damaged(directory, step, ("config",), collective=False)  # a few kB; any process
        try:
            config = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
        except Exception as e:  # noqa: BLE001 (whatever Orbax raises, the files are not usable)
            raise _unreadable(directory, step, "config", e) from None
        if not isinstance(config, dict) or "model" not in config:
            raise ValueError(f"{checkpoint_dir(directory)}/{step}: its stored config has no model "
                             "section; the checkpoint is damaged or not one of ours")
        # Checkpoints saved before the per-family model configs store every model's fields.
        model = models.stored_model_config(config["model"])
        try:  # (a value edited by hand there is the file's, not a flag the user gave)
            models.split_model_config(model)
        except ValueError as e:
            raise ConfigError(f"{checkpoint_dir(directory)}/{step}/config/metadata (the config stored "
                              f"with the checkpoint, not a flag): {e}; restore the file") from None
        return {**config, "model": model}


def restore_params(directory: str | os.PathLike, abstract_params: dict,
                   step: int | None = None, *, advice: str | None = None) -> dict:
    """Params restored onto the shapes, dtypes and shardings of `abstract_params`; parameters
    that differ in name or shape are a ConfigError listing them, before anything is read. A
    damaged checkpoint's error ends with `advice` (what the calling command can do instead)."""
    with manager(directory) as mngr:
        step = _resolve_step(mngr, directory, step)
        try:
            saved = mngr.item_metadata(step)["params"]
        except Exception:  # noqa: BLE001 (no metadata: the restore below reports the problem)
            saved = None
        target, changed = abstract_params, {}
        if saved is not None:
            target, changed = old_layouts.target(_shapes(saved), abstract_params)
            diff = _shape_diff(_shapes(saved), _shapes(target))
            if diff:
                raise ConfigError(f"{checkpoint_dir(directory)}/{step} holds a different model than "
                                  f"the config (param: checkpoint shape vs config shape: {diff}); "
                                  f"evaluate with the config stored with the checkpoint")
        _refuse_damaged(directory, step, ("params",), advice=advice)
        args = ocp.args.Composite(params=ocp.args.StandardRestore(target))
        try:
            restored = mngr.restore(step, args=args)["params"]
        except Exception as e:  # noqa: BLE001 (whatever Orbax raises, the files are not usable)
            error = _unreadable(directory, step, "params", e, advice or REREAD_ADVICE)
        else:
            old_layouts.say(f"{checkpoint_dir(directory)}/{step}", changed)
            return old_layouts.today(restored, changed)
    _quiet_abandoned_reads()  # out of the except block, so the failed restore can be collected
    raise error


def _quiet_abandoned_reads() -> None:
    """The reads a failed restore abandoned report into Orbax's closed event loop when
    collected: log.divert_library_errors sends that to the details file, not under the
    one-line error; collected now, out of the except block that held them."""
    log_lib.divert_library_errors()
    gc.collect()


def _shapes(tree) -> dict[str, tuple]:
    """{'a/b/kernel': shape} of a params (or metadata) tree."""
    return {"/".join(trees.key_names(path)): tuple(x.shape)
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _shape_diff(saved: dict[str, tuple], wanted: dict[str, tuple], limit: int = 6) -> str:
    """'name: saved vs wanted' for the first `limit` parameters that differ ('' if none)."""
    names = sorted(k for k in saved.keys() | wanted.keys() if saved.get(k) != wanted.get(k))
    return "; ".join(f"{k}: {saved.get(k, 'absent')} vs {wanted.get(k, 'absent')}" for k in names[:limit])


# Errors that no store raises (Orbax wraps storage faults as OSError or ValueError): a bug or a
# bad input of this program, never reported as "fix the storage".
NOT_STORAGE = (LookupError, TypeError, AttributeError, AssertionError, NameError)


class TrainCheckpointer:
    """A training run's checkpoints: Composite items `params`, `opt_state` (StandardSave),
    `data` (iterator position) and `config` (JsonSave) under `<workdir>/checkpoints/<step>`.
    Saves are async (the call returns once arrays are copied to host); the newest
    `keep` are kept, and older ones are deleted only after a newer save is complete."""

    def __init__(self, workdir: str | os.PathLike, keep: int, best_metric: str | None = None,
                 kept: Sequence[int] = ()):
        self.path = checkpoint_dir(workdir)
        self.kept = frozenset(kept)  # steps kept beside the newest (where schedule stages end)
        self.data_changes = ""  # the data keys changed since the restored checkpoint was saved
        # Steps saved and not yet committed, oldest first (Orbax finalizes them in order).
        self._finalizing: collections.deque[int] = collections.deque()
        common = dict(create=True, enable_async_checkpointing=True,
                      async_options=async_options(post_finalization_callback=self._write_checksums))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, **common)
        if best_metric or kept:
            best = (dict(best_fn=lambda m: metric_rank(m, best_metric), best_mode="max")
                    if best_metric else {})
            options = ocp.CheckpointManagerOptions(
                preservation_policy=_preservation_policy(keep, best_metric, kept), **best,
                **common)
        self.manager = manager(workdir, create=True, options=options)

    def save(self, step: int, params, opt_state, data_state: dict, config: dict,
             metrics: dict | None = None) -> None:
        if jax.process_index() == 0:  # the process that finalizes (Orbax's primary host)
            self._finalizing.append(step)
        try:  # an earlier async save's failure surfaces here too
            self.manager.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
                data=ocp.args.JsonSave(data_state), config=ocp.args.JsonSave(config)),
                metrics=metrics, force=True)
        except Exception as e:  # noqa: BLE001 (storage errors come as ValueError, OSError...)
            if self._finalizing and self._finalizing[-1] == step and not self._dispatched(step):
                self._finalizing.pop()  # (a dispatched save finalizes, and pops it, all the same)
            raise self._write_error(e) from None

    def _dispatched(self, step: int) -> bool:
        """Whether a save that raised had made the folder of `step` (its directories are made
        before the write is dispatched: async_options), so that it goes on in the background."""
        tmp = self.path / f"{step}{ocp.path.atomicity.TMP_DIR_SUFFIX}"
        try:
            return tmp.exists() or (self.path / str(step)).exists()
        except OSError:  # the storage itself failing: nothing was dispatched to it
            return False

    def _write_checksums(self) -> None:
        """Orbax's post-finalization callback, on process 0 in its save thread once every
        process has written its files of the step and before the step is committed (renamed
        into place, or on object stores its commit marker written): the step's checksums, so
        a committed step has them. A failure here fails the save, as a failed write does."""
        step = self._finalizing.popleft()
        tmp = self.path / f"{step}{ocp.path.atomicity.TMP_DIR_SUFFIX}"
        integrity.write(tmp if tmp.exists() else self.path / str(step))

    def restore_latest(self, abstract_params, abstract_opt_state, config: dict | None = None):
        """(step, params, opt_state, data_state) of the newest checkpoint that restores, or
        None when the workdir has no checkpoint yet. A checkpoint saved with a different model
        or optimizer than `config` (the run config as JSON) is a ConfigError naming the
        change. A checkpoint whose files fail to restore (truncated, corrupt) is renamed
        `<step>.unreadable` (kept for inspection, out of Orbax's way) and the previous one
        is tried; if none is left, that is an error too: a run never silently starts over
        in a workdir that held checkpoints. So is one whose files differ from the checksums
        written when it was saved (checked first: such files may restore without an error)."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        for step in steps:
            self._refuse_weights_only(step, config)
            try:
                verified = verify(self.path / str(step))
                if not verified:
                    log.info(f"checkpoint {self.path / str(step)} has no {integrity.MANIFEST} (saved "
                             f"before checksums were written): restoring it unverified")
                _say_unfinished(self.path / str(step), verified)
            except integrity.DamagedCheckpoint as e:
                self._set_aside(step, f"checkpoint {self.path / str(step)} cannot be restored, it is "
                                      f"damaged: {e.details}")
                continue
            try:
                metadata = self.manager.item_metadata(step)
            except Exception as e:  # noqa: BLE001 (unreadable metadata: handled by restore below)
                failing = storage_failure(e, self.path / str(step), "restoring")
                if failing is not None:  # not once more at the restore: it is the store
                    raise failing from None
                metadata = None
            if config is not None:
                self._check_same_run(step, config)
            at = {"params": abstract_params, "opt_state": abstract_opt_state}
            changed: dict[str, dict] = {"params": {}, "opt_state": {}}
            if metadata is not None and metadata["params"] is not None:
                for k in at if metadata["opt_state"] is not None else ("params",):
                    at[k], changed[k] = old_layouts.target(_shapes(metadata[k]), at[k])
                self._check_fits(step, metadata, at["params"], at["opt_state"])
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(at["params"]),
                    opt_state=ocp.args.StandardRestore(at["opt_state"]), data=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 (any failure here means: files not usable)
                failing = storage_failure(e, self.path / str(step), "restoring")
                if failing is not None:  # the files may be good: never set aside for that
                    raise failing from None
                problem = f"{type(e).__name__}: {_first_line(e)}"
            else:
                old_layouts.say(f"{self.path}/{step}", *changed.values())
                params, opt_state = (old_layouts.today(out[k], changed[k]) for k in at)
                return step, params, opt_state, dict(out["data"])
            _quiet_abandoned_reads()
            self._set_aside(step, f"checkpoint {self.path / str(step)} cannot be restored ({problem})")
        unreadable = sorted(p.name for p in self.path.glob("*.unreadable")) if self.path.exists() else []
        if unreadable:
            raise ConfigError(
                f"{self.path}: no readable checkpoint left ({', '.join(unreadable)} could not be "
                f"restored); refusing to start over from step 0 in this workdir. Use a new "
                f"--workdir, or move the *.unreadable folders away to start over here")
        return None

    def _refuse_weights_only(self, step: int, config: dict | None) -> None:
        """A step whose params are there but not the rest of a training state (a convert or
        average output, or a copy without its opt_state) is no damaged checkpoint: it is an
        error naming what is missing and the way to train from its weights (after the stored
        config's own, of another run), and it is left where it is (eval and export read it)."""
        step_dir = self.path / str(step)
        if not (step_dir / "params").is_dir():
            return
        missing = [item for item in ("opt_state", "data") if not (step_dir / item).is_dir()]
        if missing:
            if config is not None:
                self._check_same_run(step, config)
            raise ConfigError(
                f"checkpoint {step_dir} has its params but no {' and no '.join(missing)} folder "
                f"(weights only: a convert or average output, or a copy without them), so "
                f"training cannot resume from it; to train from its weights, give "
                f"--config.init_from={self.path.parent} with a new --workdir (or restore "
                f"{step_dir / missing[0]} from a copy)")

    def _set_aside(self, step: int, problem: str) -> None:
        """Renames checkpoint `step` to `<step>.unreadable` (kept for inspection, out of
        Orbax's way), saying why."""
        bad = self.path / str(step)
        log.warning(f"warning: {problem}; renamed to {bad}.unreadable, trying the previous one")
        if jax.process_index() == 0:
            bad.rename(bad.with_name(f"{step}.unreadable"))
        self.manager.reload()

    def _check_same_run(self, step: int, config: dict) -> None:
        """The stored config of checkpoint `step` against this run's (refuse_other_run)."""
        try:
            args = ocp.args.Composite(config=ocp.args.JsonRestore())
            stored = self.manager.restore(step, args=args)["config"]
        except Exception:  # noqa: BLE001 (no readable config: restore decides below)
            return
        refuse_other_run(f"{self.path}/{step}", stored, config)
        self.data_changes = say_data_changes(f"{self.path}/{step}", stored, config)
        say_setting_changes(f"{self.path}/{step}", stored, config)

    def _check_fits(self, step: int, metadata, abstract_params, abstract_opt_state) -> None:
        """A readable checkpoint whose arrays do not match the config is the user's config
        change, not corruption: stop with the differences instead of skipping it."""
        where = f"{self.path}/{step}"
        diff = _shape_diff(_shapes(metadata["params"]), _shapes(abstract_params))
        if diff:
            raise ConfigError(
                f"checkpoint {where} holds a different model than this config (differing "
                f"params, checkpoint vs config: {diff}); train in a new --workdir, or use the "
                f"config stored in {where}/config")
        if metadata["opt_state"] is not None and sorted(
                _shapes(metadata["opt_state"]).values()) != sorted(_shapes(abstract_opt_state).values()):
            raise ConfigError(
                f"checkpoint {where}: its optimizer state does not fit the optimizer "
                f"of this config (was optimizer.name changed?); "
                f"train in a new --workdir, or use the config stored in {where}/config")

    def latest_step(self) -> int | None:
        """The newest saved step (None before the first save)."""
        return self.manager.latest_step()

    def reached_preemption(self, step: int) -> bool:
        """Whether the processes of a multi-process run agreed to stop at `step` (Orbax's
        preemption sync point); False on one process, where SIGTERM says it directly."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def wait(self) -> None:
        """Waits for the async saves to finish; a failed one is the one-line OSError of save."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 (as in save)
            raise self._write_error(e) from None

    def _write_error(self, e: Exception) -> Exception:
        """One line for a save that failed (full disk, no permission, bucket gone, storage that
        kept failing); an error no storage raises (NOT_STORAGE: a missing key, a wrong type) is
        returned as it is, never called a storage fault."""
        good = self.latest_step()
        failing = storage_failure(e, self.path, "saving a checkpoint in")
        if failing is not None:
            return paths.StorageFailing(f"{failing}; the last complete checkpoint is "
                                        f"{f'step {good}' if good is not None else 'none yet'}")
        if isinstance(e, NOT_STORAGE):  # a fault of this program, not of the storage
            return e
        code = re.search(r"os_error_code='(\d+)'", str(e))  # TensorStore names the OS error
        if isinstance(e, OSError) and e.errno:
            reason = os.strerror(e.errno)
        elif code:
            reason = os.strerror(int(code.group(1)))
        else:
            reason = (str(e).splitlines()[0] if str(e) else type(e).__name__)[:300]
        return OSError(f"cannot write a checkpoint in {self.path} ({reason}); fix the storage (space, "
                       f"permissions, quota) and rerun: it resumes from "
                       f"{f'step {good}' if good is not None else 'the start'}")

    def close(self) -> None:
        self.manager.close()

    def __enter__(self) -> TrainCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        """Waits for the last saves (a failed one raises), then closes (after a failed one
        too: Orbax's threads end with it)."""
        try:
            self.wait()
        finally:
            self.close()




def refuse_other_run(where: str, stored: dict, config: dict) -> None:
    """Run config `config` against the one stored with checkpoint `where` (`stored`) that it
    would resume: a changed model, fine-tuning task (tasks.run_name) or optimizer is the user's
    change (an error naming it), not a corrupt checkpoint."""
    model_diff = changed_fields(stored.get("model", {}), config.get("model", {}), STATE_FIELDS,
                                "model.")
    if model_diff:
        raise ConfigError(f"checkpoint {where} holds a different model than this config "
                          f"({model_diff}); train in a new --workdir, or use the config "
                          f"stored in {where}/config")
    ran, runs = (tasks.run_name(c["data"]) if isinstance(c.get("data"), dict) else None
                 for c in (stored, config))
    if ran is not None and ran != runs:
        # Another task's head, labels and best metric: not a run to continue.
        raise ConfigError(f"checkpoint {where} holds a run fine-tuned on {ran}, but this config "
                          f"{f'fine-tunes {runs}' if runs else 'is not that fine-tuning'}; use a "
                          f"new --workdir (--config.init_from may start it from this run's "
                          f"weights), or resume with the config stored in {where}/config")
    opt_diff = changed_fields(stored.get("optimizer", {}), config.get("optimizer", {}), ("name",),
                              "optimizer.")
    if opt_diff:
        # E.g. a run saved with adamw, the BERT configs' default before adam_weight_decay.
        raise ConfigError(f"checkpoint {where}: its optimizer state does not fit the optimizer "
                          f"of this config ({opt_diff}); to resume it pass "
                          f"--config.optimizer.name={stored['optimizer']['name']}, or train "
                          f"in a new --workdir")


# Keys of the data section that name what is evaluated or how the input is read, not which
# batches a run trains on: a resume that changes them reads the same training stream (grain's
# worker processes keep the order).
NOT_TRAINING_DATA = ("dev_file", "test_file", "test_files", "eval_files", "eval_masked_lm_prob",
                     "tfds_eval_split", "bleu_sentences", "skip_bad_rows", "worker_count",
                     "n_best_size", "max_answer_length", "null_score_diff_threshold")


def say_data_changes(where: str, stored: dict, config: dict) -> str:
    """A warning naming each key of the data section that differs from the one stored with
    checkpoint `where`: the run resumes (the user may mean it: a new mixture for a later
    stage), but its batches from here on follow the new data, not the stored run's stream
    (several training files or data.mix: a different order from the resumed step on). A key
    the stored section lacks is not compared: a checkpoint of an older version has no key that
    version did not know (data.mix: one training file then). Returns the changes said ('' if
    none)."""
    if "data" not in stored or "data" not in config:  # an older stored config: nothing to compare
        return ""
    before, now = stored["data"], config["data"]
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return ""
    diff = changed_fields(before, now, [k for k in sorted(now) if k not in NOT_TRAINING_DATA], "data.")
    if diff:
        log.warning(f"warning: resuming {where} with other training data ({diff}): the batches "
                    f"from this step on follow the new data, not the stream the checkpoint's run "
                    f"would have read; to continue that stream, resume with its config "
                    f"({where}/config)")
    return diff


def say_setting_changes(where: str, stored: dict, config: dict) -> None:
    """A warning naming each key outside the data section (say_data_changes) whose value
    differs from the one stored with checkpoint `where`, every key by the same rule (those a
    resume cannot take were refused: refuse_other_run): the run resumes, its steps from here
    on computed with the new values (a loss scale, dropout, learning rate, more steps). A key
    the stored config lacks (an older version's) is not compared."""
    before = trees.dotted({k: v for k, v in stored.items() if k != "data"})
    now = trees.dotted({k: v for k, v in config.items() if k != "data"})
    diff = changed_fields(before, now, sorted(now), "")
    if diff:
        log.warning(f"warning: resuming {where} with settings changed since it was saved ({diff}): "
                    f"the steps from here on use the new values; to resume the run as it was, "
                    f"use its config ({where}/config)")


def check_resumes(workdir: str | os.PathLike, config: dict) -> None:
    """Before a run is started elsewhere (launch, before renting a slice): the latest
    checkpoint in `workdir`, if any, is one run config `config` resumes (refuse_other_run, as
    the run's resume checks it)."""
    if not checkpoint_dir(workdir).is_dir():
        return
    with manager(workdir, read_only=True) as mngr:
        step = mngr.latest_step()
    if step is not None:
        refuse_other_run(f"{checkpoint_dir(workdir)}/{step}", read_config(workdir, step), config)


def _params_metadata(directory: str | os.PathLike) -> tuple[int, dict[tuple[str, ...], Any]]:
    """(latest step, {param path: shape/dtype metadata}) without reading any array."""
    with manager(directory, read_only=True) as mngr:
        step = _resolve_step(mngr, directory, None)
        tree = mngr.item_metadata(step)["params"]
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return step, {trees.key_names(path): x for path, x in leaves}


# How a model reads its token embeddings and positions, each with the value of a family that has
# no such field (no token-type table, no norm after the embeddings, no scaling, no offset).
EMBEDDING_FIELDS = {"positions": None, "position_offset": 0, "type_vocab_size": 0,
                    "embedding_norm": False, "scale_embeddings": False}
TRANSPLANT = "--config.init_mode=transplant"


def check_same_family(directory: str | os.PathLike, theirs: dict[str, Any], ours: dict[str, Any]
                      ) -> None:
    """init_from `directory` (holding model section `theirs`) for a model `ours` of another
    family only where it reads embeddings and positions the same way (EMBEDDING_FIELDS): else
    an error naming what differs and the opt-in to a partial start (init_mode=transplant)."""
    theirs_family, ours_family = (models.CONFIGS[c["name"]].family for c in (theirs, ours))
    if theirs_family == ours_family:
        return
    theirs, ours = (models.complete_model_config(c) for c in (theirs, ours))
    differ = {k: (theirs.get(k, none), ours.get(k, none)) for k, none in EMBEDDING_FIELDS.items()}
    differ = {k: v for k, v in differ.items() if v[0] != v[1]}
    if differ:
        def said(value, config: dict, k: str) -> str:  # a field the family lacks: "none"
            return repr(value) if k in config else "none"
        found = "; ".join(f"model.{k}: {said(a, theirs, k)} in the checkpoint, {said(b, ours, k)} here"
                          for k, (a, b) in differ.items())
        raise ConfigError(f"init_from={directory}: holds a {theirs['name']!r} model ({theirs_family} "
                          f"family), but this config trains {ours['name']!r} ({ours_family} "
                          f"family), which reads embeddings and positions another way ({found}); "
                          f"start from a {ours_family} checkpoint (or none), or pass {TRANSPLANT} "
                          f"to take only its tensors whose names and shapes match (the rest "
                          f"trained from scratch)")


def load_pretrained(directory: str | os.PathLike, model_cfg: dict[str, Any], abstract_params: dict,
                    mesh, transplant: bool = False) -> tuple[dict, list[str], list[str]]:
    """Weights for `config.init_from`: every parameter of our model (`abstract_params`: shapes
    with target shardings) that the checkpoint in `directory` (a `bert-jax convert` output or a
    training workdir) also has, restored sharded onto `mesh`. Returns (params found, our
    parameters not found (fresh heads), checkpoint parameters not used). A differing
    architecture is a ConfigError naming the fields; with `transplant` (init_mode=transplant)
    any family and sizes, a tensor of another shape left unused, and only a checkpoint with no
    tensor of our names and shapes is an error."""
    # Stored configs may leave out fields at their defaults; compare the fields both models read.
    source_cfg = models.complete_model_config(read_config(directory)["model"])
    model_cfg = models.complete_model_config(model_cfg)
    if not transplant:
        check_same_family(directory, source_cfg, model_cfg)
    diff = [k for k in ARCHITECTURE_FIELDS if k in model_cfg and k in source_cfg
            and model_cfg[k] != source_cfg[k] and not transplant]
    if diff:
        found = "; ".join(f"model.{k}: config {model_cfg[k]!r}, checkpoint {source_cfg[k]!r}" for k in diff)
        fix = " ".join(f"--config.model.{k}={source_cfg[k]}" for k in diff)
        grow = (" (or --config.init_mode=tile_from_middle to tile its weights into this larger model)"
                if all(k in SIZE_FIELDS and model_cfg[k] > source_cfg[k] for k in diff) else "")
        raise ConfigError(f"init_from={directory}: the checkpoint's model differs from this config "
                          f"({found}); use the checkpoint's sizes: {fix}{grow}")
    step, theirs = _params_metadata(directory)
    # Each model holds the encoder at its own path (the bare encoder at its root, task models
    # under `bert`): a checkpoint parameter under its encoder path moves to ours.
    theirs_at, ours_at = models.encoder_path(source_cfg["name"]), models.encoder_path(model_cfg["name"])

    def rename(k: tuple[str, ...]) -> tuple[str, ...]:
        return ours_at + k[len(theirs_at):] if k[:len(theirs_at)] == theirs_at else k
    ours = traverse_util.flatten_dict(abstract_params)
    other_shape = set()  # init_mode=transplant: tensors of our names but not our shapes, unused
    for k, meta in theirs.items():  # (restore_params reads an old layout: old_layouts)
        if rename(k) in ours and tuple(meta.shape) != ours[rename(k)].shape and not (
                old_layouts.has_first_row(k, meta.shape, ours[rename(k)].shape)):
            if not transplant:
                raise ConfigError(f"init_from={directory}: parameter {'/'.join(rename(k))} has shape "
                                  f"{tuple(meta.shape)} in the checkpoint but {ours[rename(k)].shape} "
                                  f"here; pass {TRANSPLANT} to take only its tensors whose names "
                                  f"and shapes match (its encoder; the rest trained from scratch)")
            other_shape.add(k)

    def taken(k: tuple[str, ...]) -> bool:
        return rename(k) in ours and k not in other_shape
    if transplant and not any(map(taken, theirs)):
        raise ConfigError(f"init_from={directory} with init_mode=transplant: none of its tensors "
                          f"has a name and shape of this model's, so nothing would be taken; "
                          f"start from another checkpoint (or none)")
    # Unused arrays (e.g. the MLM head) are read replicated and dropped.
    target = traverse_util.unflatten_dict({k: ours[rename(k)] if taken(k) else jax.ShapeDtypeStruct(
        tuple(m.shape), m.dtype, sharding=sharding.replicated(mesh)) for k, m in theirs.items()})
    source = traverse_util.flatten_dict(restore_params(directory, target, step))
    found = {rename(k): v for k, v in source.items() if taken(k)}
    fresh = sorted("/".join(k) for k in ours if k not in found)
    unused = sorted("/".join(k) + (f" (shape {tuple(theirs[k].shape)})" if k in other_shape else "")
                    for k in theirs if not taken(k))
    return traverse_util.unflatten_dict(found), fresh, unused
