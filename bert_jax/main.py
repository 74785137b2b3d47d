"""The `bert-jax` command line.

  bert-jax train --config configs/bert_pretrain.py:tiny --workdir <dir> [--config.train.steps=100]
  bert-jax eval --config configs/bert_pretrain.py:tiny --workdir <dir> [--step latest|best|all|N]
               [--split dev|test|<file>]   (fine-tuning: <dir>/eval/step_N/, other splits <dir>/eval/<split>/)
  bert-jax sweep --config configs/sweeps/glue.py:mrpc --workdir <dir> [--print_commands]
  bert-jax vocab --input 'books/*.txt' --size 8192 --type wordpiece --out <dir>
  bert-jax prepare --config configs/bert_pretrain.py:base --out <dir>   (array_record shards)
  bert-jax info --config configs/bert_pretrain.py:base [--config.dtype=bfloat16]
  bert-jax convert hf:<hf_dir> <out_dir> [--head bert_classification]
  bert-jax features --checkpoint <dir> --input <txt> --output <jsonl> [--layers -1,-2,-3,-4]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "get_config(arg) file: path.py:arg")
_HEAD = flags.DEFINE_string("head", None, "convert: our model name for the converted weights "
                            "(default: from the checkpoint's architectures)")
_WORKDIR = flags.DEFINE_string("workdir", None, "train: run directory (rerun to resume)")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "features: converted or training dir")
_INPUT = flags.DEFINE_string("input", None, "features: text file, one line per example "
                             "(`A ||| B` for pairs)")
_OUTPUT = flags.DEFINE_string("output", None, "features: output JSON-lines file")
_LAYERS = flags.DEFINE_string("layers", "-1,-2,-3,-4", "features: encoder layers to output")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "features: tokens per example")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "features: examples per batch")
_SEQ_LEN = flags.DEFINE_integer("seq_len", None, "info: sequence length for FLOPs "
                                "(default: config.data.max_seq_length)")

_OUT = flags.DEFINE_string("out", None, "vocab, prepare: output directory")
_SIZE = flags.DEFINE_integer("size", 30522, "vocab: vocabulary size (at most)")
_TYPE = flags.DEFINE_enum("type", "wordpiece", ["wordpiece", "sentencepiece"], "vocab: kind")
_SP_MODEL = flags.DEFINE_enum("sp_model_type", "unigram", ["unigram", "bpe"],
                              "vocab: SentencePiece algorithm")
_LOWERCASE = flags.DEFINE_boolean("lowercase", True, "vocab: lowercase (uncased) vocabulary")
_STEP = flags.DEFINE_string("step", "latest", "eval: latest, best, all or a checkpoint step")
_SPLIT = flags.DEFINE_string("split", None, "eval (fine-tuning): dev (default), test, or a file path")
_PRINT_COMMANDS = flags.DEFINE_boolean("print_commands", False, "sweep: print one `bert-jax train` "
                                       "command per trial (for a cluster scheduler) instead of running")

COMMANDS = ("train", "eval", "sweep", "vocab", "prepare", "info", "convert", "features")


def _require(flag, command: str):
    if flag.value is None:
        raise app.UsageError(f"`bert-jax {command}` needs --{flag.name}")
    return flag.value


def maybe_initialize_distributed() -> None:
    """jax.distributed.initialize() when launched as one of several processes: Cloud TPU pod
    slices, SLURM, or JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID set by hand."""
    import os

    import jax

    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"],
                                   int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"]))
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        jax.distributed.initialize()  # auto-detected from the cluster environment


def cmd_train(args: list[str]) -> None:
    """Trains (or resumes) the config in --workdir; metrics go to <workdir>/metrics.jsonl."""
    maybe_initialize_distributed()
    import jax

    from bert_jax import train

    summary = train.train_and_evaluate(_require(_CONFIG, "train"), _require(_WORKDIR, "train"))
    if jax.process_index() == 0:
            print(json.dumps({k: summary[k] for k in ("step", "preempted")}
                         | {"metrics": summary.get("metrics"), "eval": summary.get("eval")}))


def cmd_eval(args: list[str]) -> None:
    """Evaluates saved checkpoints on the validation split; prints one JSON line each."""
    maybe_initialize_distributed()
    from bert_jax import evaluate

    for result in evaluate.evaluate_checkpoints(
            _require(_CONFIG, "eval"), _require(_WORKDIR, "eval"), _STEP.value, _SPLIT.value):
        print(json.dumps(result))


def cmd_sweep(args: list[str]) -> None:
    """Runs every trial of a sweep config (skipping finished ones), then writes results.csv/.md."""
    from bert_jax import sweep

    try:
        result = sweep.run_sweep(_require(_CONFIG, "sweep"), _require(_WORKDIR, "sweep"),
                                 _PRINT_COMMANDS.value)
    except sweep.TrialsFailed as e:
        print(f"bert-jax sweep: error: {e}", file=sys.stderr)
        sys.exit(1)
    if _PRINT_COMMANDS.value:
        print("\n".join(result["commands"]))
    else:
        print(Path(result["results"]).read_text())


def _text_lines(spec: str):
    """Lines of comma-separated file globs, or of a TFDS dataset's `text` (tfds:name[:split])."""
    if spec.startswith("tfds:"):
        import tensorflow_datasets as tfds

        name, _, split = spec[5:].partition(":")
        source = tfds.data_source(name, split=split or "train")
        for i in range(len(source)):
            text = source[i]["text"]
            yield from (text.decode() if isinstance(text, bytes) else text).splitlines()
        return
    from bert_jax.data.documents import expand

    for path in expand(spec):
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f


def cmd_vocab(args: list[str]) -> None:
    """Trains a WordPiece or SentencePiece vocabulary on text files or a TFDS dataset."""
    from bert_jax.data import vocab

    out = vocab.train_vocab(_text_lines(_require(_INPUT, "vocab")), size=_SIZE.value,
                            kind=_TYPE.value, out_dir=_require(_OUT, "vocab"),
                            lowercase=_LOWERCASE.value, sp_model_type=_SP_MODEL.value)
    tok = vocab.load_tokenizer(out)
    print(json.dumps({"out": str(out), "kind": tok.kind, "vocab_size": tok.vocab_size}))


def cmd_prepare(args: list[str]) -> None:
    """Tokenizes the config's corpus into array_record shards for data.name=array_record."""
    from bert_jax.data import documents

    out = _require(_OUT, "prepare")
    counts = documents.prepare(_require(_CONFIG, "prepare"), out)
    print(json.dumps({"out": out, "documents": counts}))
    print(f"train with: --config.data.name=array_record --config.data.train_files='{out}/train-*' "
          f"--config.data.eval_files='{out}/validation-*'")


def cmd_info(args: list[str]) -> None:
    """Prints the model, its parameter count per module and total, and FLOPs per token."""
    from bert_jax import models
    from bert_jax.config import model_config

    config = _require(_CONFIG, "info")
    model_cfg = model_config(config)
    seq_len = _SEQ_LEN.value or config.get("data", {}).get("max_seq_length", model_cfg.get(
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
    print(f"\nforward FLOPs per token at sequence length {seq_len} (training ~3x):")
    for name, value in models.flops_per_token(model_cfg, seq_len).items():
        print(f"  {name}: {value / 1e6:,.1f} MFLOPs")


def cmd_convert(args: list[str]) -> None:
    """Converts a public checkpoint into a bert_jax checkpoint directory."""
    from bert_jax import convert

    if len(args) != 2 or not args[0].startswith("hf:"):
        raise app.UsageError("usage: bert-jax convert hf:<huggingface_dir> <out_dir>")
    report = convert.convert_hf(args[0][3:], args[1], _HEAD.value)
    print(f"converted {args[0]} -> {report['out']} as {report['model']}")
    if report["missing"]:
        print("not in the checkpoint (freshly initialised): " + ", ".join(report["missing"]))
    if report["unused"]:
        print("in the checkpoint but unused by this model: " + ", ".join(report["unused"]))


def cmd_features(args: list[str]) -> None:
    """Writes contextual token vectors of chosen layers, one JSON line per input line."""
    from bert_jax import features

    try:
        layers = [int(x) for x in _LAYERS.value.split(",")]
    except ValueError:
        raise app.UsageError(f"--layers={_LAYERS.value!r}: expected integers like -1,-2") from None
    n = features.extract_features(
        _require(_CHECKPOINT, "features"), _require(_INPUT, "features"),
        _require(_OUTPUT, "features"), layers=layers, max_seq_length=_MAX_SEQ_LENGTH.value,
        batch_size=_BATCH_SIZE.value)
    print(json.dumps({"lines": n, "output": _OUTPUT.value, "layers": layers}))


def main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:  # libraries' INFO lines (Orbax: dozens a save) off
        logging.set_verbosity(logging.WARNING)
    from bert_jax import log

    log.configure()  # our progress lines (INFO) on stdout, warnings on stderr
    if len(argv) < 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: bert-jax <command> [flags]; commands: {', '.join(COMMANDS)}")
    try:
        globals()[f"cmd_{argv[1]}"](argv[2:])
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"bert-jax {argv[1]}: error: {e}", file=sys.stderr)
        sys.exit(1)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one clear line (not a traceback) for a bad flag or override."""
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 (config overrides raise AttributeError, TypeError...)
        print(f"bert-jax: bad flag: {_explain_flag_error(argv) or e}\n"
              "Run `bert-jax --help` for the flags.", file=sys.stderr)
        sys.exit(2)


def _explain_flag_error(argv: list[str]) -> str | None:
    """Re-applies --config and its overrides with our loader, whose errors name the key and
    the valid choices (ml_collections' own messages do not always)."""
    from bert_jax import config as config_lib

    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    overrides = [a[len("--config."):] for a in argv if a.startswith("--config.")]
    if spec is None:
        return None
    try:
        config_lib.load(spec, overrides)
    except Exception as e:  # noqa: BLE001 (the message is what we want)
        return str(e)
    return None


def run() -> None:
    """Console-script entry point."""
    try:
        app.run(main, flags_parser=_parse_flags)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    run()
