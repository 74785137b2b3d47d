"""`bert-jax plot` and `attention`: training curves of workdirs, attention maps of a checkpoint."""

from __future__ import annotations

import json

from absl import app

from bert_jax.commands.options import (
    CHECKPOINT,
    HEAD_INDEX,
    LAYER,
    MAX_SEQ_LENGTH,
    OUT,
    PAIR,
    SMOOTHING,
    STEP,
    TEXT,
    WORKDIR,
    X,
    list_items,
    require,
)


def cmd_plot(args: list[str]) -> None:
    """Draws training curves of one or more workdirs (loss, learning rate, task and eval
    metrics; phases marked) into one figure, with its data as CSV beside it."""
    from bert_jax import paths
    from bert_jax.viz import plots

    # (a run named twice would be drawn twice, one curve over the other)
    workdirs = list_items("--workdir", [require(WORKDIR, "plot")] + args, same=paths.listed_as)
    print(json.dumps(plots.plot_workdirs(workdirs, OUT.value, x=X.value, smoothing=SMOOTHING.value)))


def cmd_attention(args: list[str]) -> None:
    """Draws the attention of every layer and head of a checkpoint for one input: a figure
    and a self-contained interactive HTML page, with the probabilities as JSON beside them."""
    from bert_jax.viz import attention_maps

    if args:
        raise app.UsageError(f"unexpected arguments {args}; quote the text: --text \"...\"")
    step = None if STEP.value == "latest" else STEP.value
    if step is not None and not step.isdigit():
        raise app.UsageError(f"--step={step!r}: attention takes latest or a checkpoint step")
    print(json.dumps(attention_maps.attention(
        require(CHECKPOINT, "attention"), require(TEXT, "attention"), PAIR.value,
        out=OUT.value, layer=LAYER.value, head=HEAD_INDEX.value,
        step=None if step is None else int(step), max_len=MAX_SEQ_LENGTH.value)))
