"""Checkpoint averaging (Vaswani et al. 2017 §6.1: base models average the last 5 checkpoints,
big models the last 20): the mean of the params of a workdir's newest checkpoints, saved as
a checkpoint directory in the layout `bert-jax convert` writes, which every command that
reads checkpoints takes."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from bert_jax import paths, trees
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.paths import workdir_path
from bert_jax.training import checkpoint, integrity


def _metadata(mngr, step: int) -> dict[tuple[str, ...], Any]:
    """{param path: array metadata (shape, dtype)} of checkpoint `step`, reading no array."""
    tree = mngr.item_metadata(step)["params"]
    return {trees.key_names(path): x for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _signature(meta: dict[tuple[str, ...], Any]) -> dict[str, tuple]:
    return {"/".join(k): (tuple(m.shape), np.dtype(m.dtype).name) for k, m in meta.items()}


def _check_paths(workdir: str, out: str) -> None:
    """`out` must be a new place: never the workdir, never inside its checkpoints, never
    over an existing checkpoint."""
    src, dst = workdir_path(workdir), workdir_path(out)
    if dst == src or checkpoint.checkpoint_dir(workdir) in (dst, *dst.parents):
        raise ValueError(f"--out={out} is the workdir {workdir} (or inside its checkpoints/); "
                         "choose a new folder for the averaged checkpoint")
    saved = checkpoint.checkpoint_dir(out)
    # A step folder is complete (Orbax renames it into place last); an interrupted average
    # leaves none, so it can simply be rerun.
    if saved.exists() and any(p.name.isdigit() for p in saved.iterdir()):
        raise ValueError(f"{out}: already holds a checkpoint (checkpoints/), which is never "
                         "overwritten; choose another --out or delete that folder")
    # Other files (a vocab, a data set) would sit beside the average's own, its tokenizer
    # files among them.
    paths.check_new_folder(out, "--out", leftovers=("checkpoints",))


def _choose_steps(workdir: str, mngr, last: int) -> list[int]:
    """The newest `last` steps, or an error listing what there is."""
    steps = sorted(mngr.all_steps())
    where = checkpoint.checkpoint_dir(workdir)
    if not steps:
        raise ValueError(str(checkpoint.no_checkpoint(workdir, "no complete checkpoint to average",
                                                      "give the workdir of a run that saved some")))
    if len(steps) < last:
        raise ValueError(f"{where}: only {len(steps)} checkpoint(s) (steps "
                         f"{', '.join(map(str, steps))}), fewer than --last {last}; use "
                         f"--last {len(steps)} or less, or keep more when training "
                         "(train.keep_checkpoints)")
    return steps[-last:]


def _advice(workdir: str, step: int, steps: list[int]) -> str:
    """What to do about damaged checkpoint `step` of the `steps` to average (--last takes the
    newest, so only newer ones can be chosen without it)."""
    newer = len(steps) - 1 - steps.index(step)
    skip = (f"use --last {newer} to average only the newer ones" if newer else
            f"move it out of {checkpoint.checkpoint_dir(workdir)} to average the ones before it")
    return f"restore the folder from a copy, or {skip}"


def _refuse_same_files(workdir: str, steps: list[int]) -> None:
    """Two of `steps` that are one folder (a step folder linked to another) or hold the same
    params files (a copy: their checksums agree) would be one checkpoint counted twice; a step
    folder that is a link to a folder of another step name would average under a wrong step."""
    where = checkpoint.checkpoint_dir(workdir)
    seen: dict[str, int] = {}
    for step in steps:
        folder = where / str(step)
        if not paths.is_remote(folder):
            real = os.path.realpath(folder)
            if real in seen:
                raise ValueError(f"{where}: steps {seen[real]} and {step} are the same folder "
                                 f"({real}), which would count one checkpoint twice; remove the "
                                 f"link, or average with a smaller --last")
            seen[real] = step
            if os.path.islink(folder) and os.path.basename(real) != str(step):
                raise ValueError(f"{folder} is a link to {real}, a checkpoint of another step; "
                                 f"average reads each step's own folder: remove the link")
        try:  # a copy of another step: the same params files (checksums.json, when saved with it)
            listed = json.loads((folder / integrity.MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        params = json.dumps(sorted((k, v) for k, v in listed.items() if k.startswith("params/")))
        if params in seen:
            raise ValueError(f"{where}: steps {seen[params]} and {step} hold the same params files "
                             f"(their {integrity.MANIFEST} agree): one checkpoint copied, which would "
                             f"count twice; remove the copy, or average with a smaller --last")
        seen[params] = step


def _refuse_other_models(workdir: str, steps: list[int]) -> None:
    """Checkpoints whose stored models differ in a field a resume also refuses to change
    (checkpoint.STATE_FIELDS: a size, the pooling, the head; not dropout) are not one
    model's, even with params of the same shapes: refused naming the steps and the fields.
    The average is saved with the newest step's config."""
    newest = steps[-1]
    want = checkpoint.read_config(workdir, newest)["model"]
    for step in steps[:-1]:
        diff = checkpoint.changed_fields(checkpoint.read_config(workdir, step)["model"], want,
                                         checkpoint.STATE_FIELDS, "model.")
        if diff:
            diff = diff.replace("in the checkpoint", f"in {step}").replace(" here", f" in {newest}")
            raise ValueError(f"{checkpoint.checkpoint_dir(workdir)}: checkpoints {step} and {newest} "
                             f"hold different models ({diff}); average only checkpoints of one "
                             "model, with a smaller --last")


def average_checkpoints(workdir: str | os.PathLike, last: int, out: str | os.PathLike) -> dict[str, Any]:
    """Averages the params of the newest `last` checkpoints of `workdir` into a new checkpoint
    directory `out` (step and config of the newest one, plus the workdir's tokenizer files).
    Returns {"out", "steps": the averaged steps, "step": the newest}."""
    workdir, out = str(workdir), str(out)
    if last < 1:
        raise ValueError(f"--last {last}: average at least 1 checkpoint (the paper: 5 for base, "
                         "20 for big)")
    _check_paths(workdir, out)
    if not checkpoint.checkpoint_dir(workdir).is_dir():
        raise ValueError(f"{workdir}: no checkpoints/ folder; give the workdir of a training run")
    with checkpoint.manager(workdir) as mngr:  # as read_config does (read_only only adds warnings)
        steps = _choose_steps(workdir, mngr, last)
        metas = {}
        for s in reversed(steps):  # the newest first: then --last can skip a damaged older one
            try:
                metas[s] = _metadata(mngr, s)
            except Exception as e:  # noqa: BLE001 (whatever Orbax raises, the files are not usable)
                raise ValueError(f"{checkpoint.checkpoint_dir(workdir)}/{s}: its params metadata cannot "
                                 f"be read ({type(e).__name__}: {str(e)[:200]}); the checkpoint is "
                                 f"damaged: {_advice(workdir, s, steps)}") from None
    newest = steps[-1]
    _refuse_same_files(workdir, steps)
    _refuse_other_models(workdir, steps)
    want = _signature(metas[newest])
    for step in steps[:-1]:
        have = _signature(metas[step])
        diff = sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))
        if diff:
            shown = "; ".join(f"{k}: {have.get(k, 'absent')} vs {want.get(k, 'absent')}" for k in diff[:6])
            raise ValueError(f"{checkpoint.checkpoint_dir(workdir)}: checkpoints {step} and {newest} "
                             f"hold different params ((shape, dtype) in {step} vs {newest}: {shown}); "
                             "average only checkpoints of one model, with a smaller --last")
    # Restored one at a time (onto one device) and summed in float32 on the host: memory for
    # two copies of the params, however many checkpoints are averaged.
    abstract = trees.nest([(k, jax.ShapeDtypeStruct(tuple(m.shape), m.dtype))
                           for k, m in metas[newest].items()])
    leaves, treedef = jax.tree.flatten(abstract)
    total = [np.zeros(x.shape, np.float32) for x in leaves]
    for step in steps:
        params = jax.tree.leaves(checkpoint.restore_params(workdir, abstract, step,
                                                           advice=_advice(workdir, step, steps)))
        for acc, x in zip(total, params):
            np.add(acc, np.asarray(x, np.float32), out=acc)
        del params
    averaged = treedef.unflatten([(t / len(steps)).astype(x.dtype) for t, x in zip(total, leaves)])
    checkpoint.save_params(out, newest, averaged, checkpoint.read_config(workdir, newest))
    if tokenizer_lib.has_tokenizer(workdir):  # local or gs://, either way
        tokenizer_lib.copy_tokenizer(workdir, out)
    return {"out": out, "steps": steps, "step": newest}
