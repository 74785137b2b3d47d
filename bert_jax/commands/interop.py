"""`bert-jax convert`, `export` and `features`: public checkpoints in, Hugging Face folders
out, contextual token vectors."""

from __future__ import annotations

import json

from absl import app

from bert_jax.commands.options import (
    BATCH_SIZE,
    CHECKPOINT,
    HEAD,
    INPUT,
    LAYERS,
    MAX_SEQ_LENGTH,
    OUTPUT,
    STEP,
    require,
)


def cmd_convert(args: list[str]) -> None:
    """Converts a public checkpoint into a bert_jax checkpoint directory."""
    from bert_jax.interop import convert

    if len(args) != 2 or not args[0].startswith(("hf:", "tf:")):
        raise app.UsageError("usage: bert-jax convert hf:<huggingface_dir> <out_dir>, or "
                             "tf:<original TF checkpoint folder or prefix> <out_dir>")
    report = convert.convert_hf(args[0][3:], args[1], HEAD.value)
    print(f"converted {args[0]} -> {report['out']} as {report['model']}")
    if report["missing"]:
        print("not in the checkpoint (freshly initialised): " + ", ".join(report["missing"]))
    if report["unused"]:
        print("in the checkpoint but unused by this model: " + ", ".join(report["unused"]))


def cmd_export(args: list[str]) -> None:
    """Writes a checkpoint (a convert output or a training workdir) as a Hugging Face folder."""
    from bert_jax.interop import export

    if len(args) != 2 or not args[1].startswith("hf:"):
        raise app.UsageError("usage: bert-jax export <checkpoint_dir> hf:<out_dir>")
    if STEP.value != "latest" and not STEP.value.isdigit():
        raise app.UsageError(f"--step={STEP.value!r}: export takes latest or a step number")
    step = None if STEP.value == "latest" else int(STEP.value)
    report = export.export_hf(args[0], args[1][3:], step)
    print(f"exported {args[0]} -> {report['out']} as {report['architecture']}"
          + ("" if report["tokenizer"] else " (no tokenizer files)"))


def cmd_features(args: list[str]) -> None:
    """Writes contextual token vectors of chosen layers, one JSON line per input line."""
    from bert_jax.interop import features

    try:
        layers = [int(x) for x in LAYERS.value.split(",")]
    except ValueError:
        raise app.UsageError(f"--layers={LAYERS.value!r}: expected integers like -1,-2") from None
    n = features.extract_features(
        require(CHECKPOINT, "features"), require(INPUT, "features"),
        require(OUTPUT, "features"), layers=layers, max_seq_length=MAX_SEQ_LENGTH.value,
        batch_size=8 if BATCH_SIZE.value is None else BATCH_SIZE.value)
    print(json.dumps({"lines": n, "output": OUTPUT.value, "layers": layers}))
