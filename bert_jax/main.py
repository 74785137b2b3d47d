"""The `bert-jax` command line.

  bert-jax train --config configs/bert_pretrain.py:tiny --workdir <dir> [--config.train.steps=100]
  bert-jax eval --workdir <dir> [--config <file>] [--step latest|best|all|N]
               [--split dev|test|<file>]   (fine-tuning: <dir>/eval/step_N/, other splits <dir>/eval/<split>/)
  bert-jax sweep --config configs/sweeps/glue.py:mrpc --workdir <dir> [--print_commands]
  bert-jax vocab --input 'books/*.txt' --size 8192 --type wordpiece --out <dir>
  bert-jax prepare --config configs/bert_pretrain.py:base --out <dir>   (array_record shards)
  bert-jax info --config configs/bert_pretrain.py:base [--config.dtype=bfloat16]
  bert-jax plan --config configs/bert_pretrain.py:base --topology v3-32 [--slices 2] [--json]
  bert-jax launch --config configs/bert_pretrain.py:base --topology v3-32 --workdir gs://B/run
               --name bert-base --zone europe-west4-a [--spot] [--keep] [--dry_run]
  bert-jax convert hf:<hf_dir>|tf:<tf_checkpoint> <out_dir> [--head bert_classification]
  bert-jax export <checkpoint_dir> hf:<out_dir> [--step N]   (a Hugging Face folder for transformers)
  bert-jax features --checkpoint <dir> --input <txt> --output <jsonl> [--layers -1,-2,-3,-4]
  bert-jax translate --checkpoint <dir> --input <txt> --output <txt> [--beam 4 --alpha 0.6]
               [--reference <txt>]   (prints sacreBLEU against the reference)
  bert-jax average --workdir <dir> --last 5 --out <dir>   (a checkpoint of the mean weights)
  bert-jax plot --workdir <dir> [<dir> ...] [--out curves.png|.svg] [--x step|time|tokens]
               [--smoothing 0.6]   (default out: <first dir>/plots/metrics.png, data in .csv beside)
  bert-jax attention --checkpoint <dir> --text "..." [--pair "..."] [--out a.png|a.html]
               [--layer -1 --head_index 0]   (default: <dir>/plots/attention.png and .html;
               data in .json)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from absl import app, flags, logging

from bert_jax import config as config_lib
from bert_jax.paths import REPO

# Each command imports its own modules when it runs, so a command does not pay for the others'
# imports (TensorFlow datasets, torch-free HF readers, Orbax...).

_CONFIG = flags.DEFINE_string("config", None, "train, eval, sweep, prepare, info, plan, launch: a "
                              "get_config(arg) file, path.py[:arg]; then --config.<key>=<value> "
                              "overrides")
_HEAD = flags.DEFINE_string("head", None, "convert: our model name for the converted weights "
                            "(default: from the checkpoint's architectures)")
_WORKDIR = flags.DEFINE_string("workdir", None, "train, eval, sweep, launch, average, plot: the "
                               "run directory (local or gs://; rerunning train resumes it)")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "features, translate, attention: converted, "
                                  "averaged or training dir")
_INPUT = flags.DEFINE_string("input", None, "features: text file, one line per example "
                             "(`A ||| B` for pairs); translate: source sentences, one per line")
_OUTPUT = flags.DEFINE_string("output", None, "features: output JSON-lines file; translate: "
                              "output text file (one translation per input line)")
_BEAM = flags.DEFINE_integer("beam", None, "translate: beam size, 1 = greedy (default: the "
                             "run config's decode.beam_size)")
_ALPHA = flags.DEFINE_float("alpha", None, "translate: length penalty alpha (default: "
                            "decode.alpha of the run config)")
_REFERENCE = flags.DEFINE_string("reference", None, "translate: reference translations; prints "
                                 "sacreBLEU and the paper's tokenized BLEU")
_LAST = flags.DEFINE_integer("last", 5, "average: number of newest checkpoints to average")
_LAYERS = flags.DEFINE_string("layers", "-1,-2,-3,-4", "features: encoder layers to output")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "features, attention: tokens per "
                                       "example (at most)")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "features: examples per batch (default "
                                   "8); translate: sentences per batch (default decode.batch_size)")
_SEQ_LEN = flags.DEFINE_integer("seq_len", None, "info: sequence length for FLOPs "
                                "(default: config.data.max_seq_length)")

_OUT = flags.DEFINE_string("out", None, "vocab, prepare, average: output directory; plot, "
                           "attention: output file (.png, .svg, .pdf; attention also .html)")
_X = flags.DEFINE_enum("x", "step", ["step", "time", "tokens"], "plot: the x axis (wall time in "
                       "hours, or real tokens seen)")
_SMOOTHING = flags.DEFINE_float("smoothing", 0.6, "plot: exponential smoothing weight of train "
                                "curves, as TensorBoard's (0 = raw only)")
_TEXT = flags.DEFINE_string("text", None, "attention: the input sentence (an encoder-decoder "
                            "translates it)")
_PAIR = flags.DEFINE_string("pair", None, "attention: a second sentence (BERT: segment B)")
_LAYER = flags.DEFINE_integer("layer", -1, "attention: the layer of the large heatmap")
_HEAD_INDEX = flags.DEFINE_integer("head_index", 0, "attention: the head of the large heatmap")
_SIZE = flags.DEFINE_integer("size", 30522, "vocab: vocabulary size (at most)")
_TYPE = flags.DEFINE_enum("type", "wordpiece", ["wordpiece", "sentencepiece"], "vocab: kind")
_SP_MODEL = flags.DEFINE_enum("sp_model_type", "unigram", ["unigram", "bpe"],
                              "vocab: SentencePiece algorithm")
_LOWERCASE = flags.DEFINE_boolean("lowercase", True, "vocab: lowercase (uncased) vocabulary")
_STEP = flags.DEFINE_string("step", "latest", "eval: latest, best, all or a checkpoint step; "
                            "export, attention: latest or a step")
_SPLIT = flags.DEFINE_string("split", None, "eval (fine-tuning): dev (default), test, or a file path")
_TOPOLOGY = flags.DEFINE_string("topology", None, "plan: a Cloud TPU slice, e.g. v3-32, v4-32, "
                                "v5p-64, v5litepod-16, v6e-16")
_SLICES = flags.DEFINE_integer("slices", 1, "plan: number of such slices (multislice)")
_MFU = flags.DEFINE_float("mfu", 0.4, "plan: model FLOPs utilisation for the projected time")
_JSON = flags.DEFINE_boolean("json", False, "plan: print JSON (for scripts) instead of a table")
_NAME = flags.DEFINE_string("name", None, "launch: name of the queued resource and TPU VM")
_ZONE = flags.DEFINE_string("zone", None, "launch: Cloud zone, e.g. us-central2-b")
_ANY_ZONE = flags.DEFINE_boolean("any_zone", False, "launch: accept a --zone missing from "
                                 "bert_jax's table of TPU zones (one Google added since)")
_PROJECT = flags.DEFINE_string("project", None, "launch: Cloud project (default: gcloud's)")
_RUNTIME = flags.DEFINE_string("runtime_version", None, "launch: TPU VM software version "
                               "(default: by generation, e.g. tpu-ubuntu2204-base for v4)")
_SPOT = flags.DEFINE_boolean("spot", False, "launch: spot capacity (cheaper, preemptible)")
_KEEP = flags.DEFINE_boolean("keep", False, "launch: keep the slice at the end (default: delete)")
_DRY_RUN = flags.DEFINE_boolean("dry_run", False, "launch: print every gcloud command, run none")
_MAX_RESTARTS = flags.DEFINE_integer("max_restarts", 3, "launch: re-requests after preemption")
_REPO = flags.DEFINE_string("repo", None, "launch: git URL the workers clone (default: origin)")
_COMMIT = flags.DEFINE_string("commit", None, "launch: commit the workers run (default: HEAD)")
_SKIP_PLAN = flags.DEFINE_boolean("skip_plan", False, "launch: do not compile the plan first "
                                  "(where libtpu cannot be installed)")
_POLL = flags.DEFINE_float("poll_seconds", 30.0, "launch: seconds between state checks")
_PYTHON = flags.DEFINE_string("python", None, "launch: the workers' Python, major.minor (default: "
                              "this machine's; uv provides it where the image's python3 differs)")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", "auto", "train, eval, translate, features, attention: JAX's persistent "
    "cache of compiled programs, so a restart loads them instead of compiling again: auto (the "
    "gs:// --workdir's compilation_cache/ folder, else ~/.cache/bert_jax/jit; "
    "$JAX_COMPILATION_CACHE_DIR if set), off, or a directory (local or gs://)")
_PRINT_COMMANDS = flags.DEFINE_boolean("print_commands", False, "sweep: print one `bert-jax train` "
                                       "command per trial (for a cluster scheduler) instead of running")

COMMANDS = ("train", "eval", "sweep", "vocab", "prepare", "info", "plan", "launch", "convert",
            "export", "features", "translate", "average", "plot", "attention")
# The flags each command reads, for `bert-jax <command> --help`.
COMMAND_FLAGS = {
    "train": ("config", "workdir", "compilation_cache"),
    "eval": ("workdir", "config", "step", "split", "compilation_cache"),
    "sweep": ("config", "workdir", "print_commands"),
    "vocab": ("input", "size", "type", "sp_model_type", "lowercase", "out"),
    "prepare": ("config", "out"), "info": ("config", "seq_len"),
    "plan": ("config", "topology", "slices", "mfu", "json"),
    "launch": ("config", "workdir", "topology", "name", "zone", "any_zone", "project",
               "runtime_version", "spot",
               "keep", "dry_run", "max_restarts", "repo", "commit", "skip_plan", "poll_seconds", "python"),
    "convert": ("head",),
    "export": ("step",),
    "features": ("checkpoint", "input", "output", "layers", "max_seq_length", "batch_size",
                 "compilation_cache"),
    "translate": ("checkpoint", "input", "output", "beam", "alpha", "reference", "batch_size",
                  "compilation_cache"),
    "average": ("workdir", "last", "out"),
    "plot": ("workdir", "out", "x", "smoothing"),
    "attention": ("checkpoint", "text", "pair", "out", "layer", "head_index", "step",
                  "max_seq_length", "compilation_cache"),
}
# The commands that compile a model, and so use the persistent compilation cache.
COMPILING = ("train", "eval", "translate", "features", "attention")
# The cache of local runs: one per user, shared by every run, eval and translation of the
# machine (entries are keyed by the program, the JAX version, devices and flags).
LOCAL_COMPILATION_CACHE = "~/.cache/bert_jax/jit"
LOCAL_COMPILATION_CACHE_BYTES = 8 * 2**30  # least recently used entries go beyond this
HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")


class _Started:
    """When the command started (unix time): a training job's wall time (goodput) begins here."""

    at: float | None = None


class _LoadedConfig:
    """The --config file with its --config.<key>=<value> overrides, loaded by _parse_flags."""

    value = None  # ml_collections.ConfigDict, or None without --config
    overrides: tuple[str, ...] = ()  # "key=value" as typed

    @classmethod
    def set_by_user(cls) -> set[str]:
        return {o.partition("=")[0] for o in cls.overrides}


def _require(flag, command: str):
    value = _LoadedConfig.value if flag.name == "config" else flag.value
    if value is None:
        raise app.UsageError(f"`bert-jax {command}` needs --{flag.name}")
    return value


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

    from bert_jax.training import train

    workdir = _require(_WORKDIR, "train")
    if not workdir.strip():  # else the run would write into the current directory
        raise app.UsageError("--workdir is empty: give the run's directory, e.g. --workdir "
                             "/tmp/run (a new folder, or a run to resume)")
    summary = train.train_and_evaluate(_require(_CONFIG, "train"), workdir,
                                       set_by_user=_LoadedConfig.set_by_user(),
                                       started=_Started.at)
    if jax.process_index() == 0:
            print(json.dumps({k: summary[k] for k in ("step", "preempted")}
                         | {"metrics": summary.get("metrics"), "eval": summary.get("eval")}))


def cmd_eval(args: list[str]) -> None:
    """Evaluates saved checkpoints on the validation split (with the config stored in the
    checkpoint unless --config is given); prints one JSON line each."""
    maybe_initialize_distributed()
    from bert_jax.training import evaluate

    for result in evaluate.evaluate_checkpoints(
            _LoadedConfig.value, _require(_WORKDIR, "eval"), _STEP.value, _SPLIT.value):
        print(json.dumps(result))


def cmd_sweep(args: list[str]) -> None:
    """Runs every trial of a sweep config (skipping finished ones), then writes results.csv/.md."""
    from bert_jax import sweep

    try:
        result = sweep.run_sweep(_require(_CONFIG, "sweep"), _require(_WORKDIR, "sweep"),
                                 _PRINT_COMMANDS.value, spec=_CONFIG.value)
    except sweep.TrialsFailed as e:
        print(f"bert-jax sweep: error: {e}", file=sys.stderr)
        sys.exit(1)
    if _PRINT_COMMANDS.value:
        print("\n".join(result["commands"]))
    else:
        print(Path(result["results"]).read_text())


def _text_lines(spec: str):
    """Lines of comma-separated file globs (plain or .gz), or of a TFDS dataset's fields
    (tfds:name[:split[:field,field]], default field `text`; e.g. ...:train:en,de)."""
    if spec.startswith("tfds:"):
        from bert_jax.data.documents import tfds_source

        name, _, rest = spec[5:].partition(":")
        split, _, fields = rest.partition(":")
        source = tfds_source(name, split or "train", what=f"--input={spec}",
                             data_dir_flag="$TFDS_DATA_DIR")
        for i in range(len(source)):
            for field in (fields or "text").split(","):
                text = source[i][field]
                yield from (text.decode() if isinstance(text, bytes) else text).splitlines()
        return
    from bert_jax.data.documents import expand

    for path in expand(spec, "--input"):
        yield from _utf8_lines(path)


def _utf8_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, plain or .gz (local or gs://), as text-mode reading gives
    them; a byte that is not UTF-8 is an error naming the line, as the other readers' are (a
    vocab learned from replacement characters would be silently wrong)."""
    import gzip
    import io

    from bert_jax import paths

    offset = 0
    with paths.path(path).open("rb") as raw, (gzip.open(raw) if path.endswith(".gz") else raw) as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {number} (byte {offset + e.start}) is not UTF-8 "
                                 f"({e.reason}); re-encode the file as UTF-8") from None
            offset += len(line)
            if "\r" in text:  # \r\n and \r end lines, as in text mode
                yield from io.StringIO(text, newline=None)
            else:
                yield text


def cmd_vocab(args: list[str]) -> None:
    """Trains a WordPiece or SentencePiece vocabulary on text files or a TFDS dataset."""
    from bert_jax import paths
    from bert_jax.data import tokenizer as tokenizer_lib

    out_dir = _require(_OUT, "vocab")
    if found := [n for n in tokenizer_lib.TOKENIZER_FILES if (paths.path(out_dir) / n).is_file()]:
        raise ValueError(f"--out {out_dir} already holds a vocab ({', '.join(found)}); give another "
                         "--out, or remove that folder to train a new vocab there")
    out = tokenizer_lib.train_vocab(_text_lines(_require(_INPUT, "vocab")), size=_SIZE.value,
                                    kind=_TYPE.value, out_dir=out_dir,
                                    lowercase=_LOWERCASE.value, sp_model_type=_SP_MODEL.value)
    tok = tokenizer_lib.load_tokenizer(out)
    print(json.dumps({"out": str(out), "kind": tok.kind, "vocab_size": tok.vocab_size}))


def cmd_prepare(args: list[str]) -> None:
    """Tokenizes the config's corpus into array_record shards for data.name=array_record."""
    from bert_jax.data import sources

    out = _require(_OUT, "prepare")
    counts = sources.prepare(_require(_CONFIG, "prepare"), out)
    print(json.dumps({"out": out, "documents": counts}))
    print(f"train with: --config.data.name=array_record --config.data.train_files='{out}/train-*' "
          f"--config.data.eval_files='{out}/validation-*'")


def cmd_info(args: list[str]) -> None:
    """Prints the model, its parameter count per module and total, and FLOPs per token."""
    from bert_jax import models
    from bert_jax.config import model_config

    config = _require(_CONFIG, "info")
    if _SEQ_LEN.value is not None and _SEQ_LEN.value < 1:
        raise app.UsageError(f"--seq_len={_SEQ_LEN.value}: tokens per sequence, >= 1 (leave it "
                             "out for the config's data.max_seq_length)")
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


def cmd_plan(args: list[str]) -> None:
    """Compiles the train step of each sequence-length phase and the eval step for a Cloud TPU
    slice (no TPU needed; libtpu: pip install 'bert_jax[tpu]') and prints memory per device
    against its HBM, whether it fits, model FLOPs per step and the projected run time."""
    from bert_jax.cloud import plan

    result = plan.plan(_require(_CONFIG, "plan"), _require(_TOPOLOGY, "plan"), _SLICES.value,
                       _MFU.value)
    print(json.dumps(result, indent=1) if _JSON.value else plan.format_plan(result))
    if not result["fits"]:
        sys.exit(1)


def cmd_launch(args: list[str]) -> None:
    """Plans the config for the slice (refusing one that does not fit), queues the capacity,
    sets up every worker at a pinned commit, trains with one log per worker under
    <workdir>/logs, re-queues and resumes after preemption, and deletes the capacity at the
    end (see launch/README.md)."""
    from bert_jax.cloud import bringup, launch, plan

    config = _require(_CONFIG, "launch")
    topology, workdir = _require(_TOPOLOGY, "launch"), _require(_WORKDIR, "launch")
    name, zone = _require(_NAME, "launch"), _require(_ZONE, "launch")
    launch.check_flags(name, zone, topology, _MAX_RESTARTS.value, _POLL.value, _ANY_ZONE.value)
    if not workdir.startswith("gs://"):
        raise ValueError(f"--workdir={workdir}: the workers of a slice share a gs:// workdir "
                         "(checkpoints, logs); a local path would be one per worker")
    root = REPO
    origin, head, dirty = launch.git_head(str(root))
    path, colon, arg = _CONFIG.value.partition(":")
    try:  # the workers run the repository's copy of the config file
        worker_config = str(Path(path).resolve().relative_to(root)) + colon + arg
    except ValueError:
        raise ValueError(f"--config={_CONFIG.value}: the workers have only the repository "
                         f"({root} at the commit they run); put the config file in it and commit "
                         f"it") from None
    repo, commit = _REPO.value or origin, _COMMIT.value or head
    placeholders = (not repo or not commit) and _DRY_RUN.value
    if placeholders:
        print("warning: no --repo/--commit, and no git origin/HEAD here to take them from: the dry "
              "run shows REPO_URL/COMMIT and checks neither them nor the config file", file=sys.stderr)
        repo, commit = repo or "REPO_URL", commit or "COMMIT"
    if not repo or not commit:
        raise app.UsageError("launch needs --repo and --commit (no git checkout here to take "
                             "them from)")
    if dirty and not _COMMIT.value:
        print(f"warning: uncommitted changes here are not on the workers, which run {commit}",
              file=sys.stderr)
    # Before compiling or renting anything: what would make the workers fail.
    python = bringup.check_python(_PYTHON.value or bringup.default_python())
    if not placeholders:
        commit = bringup.check_remote(root, repo, commit, _DRY_RUN.value)
        bringup.check_config(root, worker_config.partition(":")[0], commit)
    bringup.check_workdir(workdir, _DRY_RUN.value)
    pins, notes = bringup.lock(root / "pyproject.toml")
    print(bringup.describe(python, pins))
    for note in notes:
        print(f"warning: not pinned for the workers: {note}", file=sys.stderr)
    if _SKIP_PLAN.value:
        print("warning: --skip_plan: the config was not compiled for the slice", file=sys.stderr)
    else:
        result = plan.plan(config, topology)
        print(plan.format_plan(result))
        if not result["fits"]:
            raise ValueError(f"the config does not fit {topology} (plan above); refusing to launch")
    run = launch.Launch(
        name=name, zone=zone, topology=topology, workdir=workdir, repo=repo, commit=commit,
        train_args=["--config", worker_config, *(f"--config.{o}" for o in _LoadedConfig.overrides)],
        project=_PROJECT.value, runtime_version=_RUNTIME.value, spot=_SPOT.value, keep=_KEEP.value,
        dry_run=_DRY_RUN.value, max_restarts=_MAX_RESTARTS.value, poll_seconds=_POLL.value,
        python=python, lock=tuple(pins))
    print(json.dumps(launch.run(run)))


def cmd_convert(args: list[str]) -> None:
    """Converts a public checkpoint into a bert_jax checkpoint directory."""
    from bert_jax.interop import convert

    if len(args) != 2 or not args[0].startswith(("hf:", "tf:")):
        raise app.UsageError("usage: bert-jax convert hf:<huggingface_dir> <out_dir>, or "
                             "tf:<original TF checkpoint folder or prefix> <out_dir>")
    report = convert.convert_hf(args[0][3:], args[1], _HEAD.value)
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
    if _STEP.value != "latest" and not _STEP.value.isdigit():
        raise app.UsageError(f"--step={_STEP.value!r}: export takes latest or a step number")
    step = None if _STEP.value == "latest" else int(_STEP.value)
    report = export.export_hf(args[0], args[1][3:], step)
    print(f"exported {args[0]} -> {report['out']} as {report['architecture']}"
          + ("" if report["tokenizer"] else " (no tokenizer files)"))


def cmd_features(args: list[str]) -> None:
    """Writes contextual token vectors of chosen layers, one JSON line per input line."""
    from bert_jax.interop import features

    try:
        layers = [int(x) for x in _LAYERS.value.split(",")]
    except ValueError:
        raise app.UsageError(f"--layers={_LAYERS.value!r}: expected integers like -1,-2") from None
    n = features.extract_features(
        _require(_CHECKPOINT, "features"), _require(_INPUT, "features"),
        _require(_OUTPUT, "features"), layers=layers, max_seq_length=_MAX_SEQ_LENGTH.value,
        batch_size=8 if _BATCH_SIZE.value is None else _BATCH_SIZE.value)
    print(json.dumps({"lines": n, "output": _OUTPUT.value, "layers": layers}))


def cmd_translate(args: list[str]) -> None:
    """Translates a text file with an encoder-decoder checkpoint; scores it given a reference."""
    from bert_jax.translation import translate

    maybe_initialize_distributed()  # on a pod every host runs this; they decode together
    report = translate.translate_file(
        _require(_CHECKPOINT, "translate"), _require(_INPUT, "translate"),
        _require(_OUTPUT, "translate"), beam_size=_BEAM.value, alpha=_ALPHA.value,
        batch_size=_BATCH_SIZE.value, reference=_REFERENCE.value)
    if "sacrebleu" in report:
        print(f"sacreBLEU {report['sacrebleu']['bleu']:.2f} ({report['sacrebleu']['signature']})\n"
              f"tokenized BLEU {report['tokenized_bleu']['bleu']:.2f} (compound-split, the "
              "paper's convention: compare with its 27.3 / 28.4, not with sacreBLEU)")
    print(json.dumps(report))


def cmd_average(args: list[str]) -> None:
    """Averages the newest --last checkpoints of a workdir into a new checkpoint --out."""
    from bert_jax.training import average

    report = average.average_checkpoints(_require(_WORKDIR, "average"), _LAST.value,
                                         _require(_OUT, "average"))
    print(json.dumps(report))


def cmd_plot(args: list[str]) -> None:
    """Draws training curves of one or more workdirs (loss, learning rate, task and eval
    metrics; phases marked) into one figure, with its data as CSV beside it."""
    from bert_jax.viz import plots

    workdirs = [w for w in ([_require(_WORKDIR, "plot")] + args) for w in w.split(",") if w]
    print(json.dumps(plots.plot_workdirs(workdirs, _OUT.value, x=_X.value,
                                         smoothing=_SMOOTHING.value)))


def cmd_attention(args: list[str]) -> None:
    """Draws the attention of every layer and head of a checkpoint for one input: a figure
    and a self-contained interactive HTML page, with the probabilities as JSON beside them."""
    from bert_jax.viz import attention_maps

    if args:
        raise app.UsageError(f"unexpected arguments {args}; quote the text: --text \"...\"")
    step = None if _STEP.value == "latest" else _STEP.value
    if step is not None and not step.isdigit():
        raise app.UsageError(f"--step={step!r}: attention takes latest or a checkpoint step")
    print(json.dumps(attention_maps.attention(
        _require(_CHECKPOINT, "attention"), _require(_TEXT, "attention"), _PAIR.value,
        out=_OUT.value, layer=_LAYER.value, head=_HEAD_INDEX.value,
        step=None if step is None else int(step), max_len=_MAX_SEQ_LENGTH.value)))


def main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:  # libraries' INFO lines (Orbax: dozens a save) off
        logging.set_verbosity(logging.WARNING)
    from bert_jax import log

    log.configure()  # our progress lines (INFO) on stdout, warnings on stderr
    log.divert_library_errors()  # a failed save's hundreds of Orbax lines: to a file
    try:
        if len(argv) < 2 or argv[1] not in COMMANDS:
            got = f"unknown command {argv[1]!r}; " if len(argv) > 1 else ""
            raise app.UsageError(f"{got}usage: bert-jax <command> [flags]; commands: "
                                 f"{', '.join(COMMANDS)}")
        if argv[1] in COMPILING:
            setup_compilation_cache(_COMPILATION_CACHE.value, argv[1], _WORKDIR.value)
        globals()[f"cmd_{argv[1]}"](argv[2:])
    except app.UsageError as e:  # a missing or malformed flag or argument
        _bad_flag(str(e))
    except (ValueError, OSError, config_lib.MissingExtra) as e:  # bad input, storage, an uninstalled
        # extra: one line, not a traceback
        print(f"bert-jax {argv[1]}: error: {_one_line(e)}", file=sys.stderr)
        sys.exit(1)


def compilation_cache_dir(setting: str, command: str, workdir: str | None,
                          environ=os.environ) -> str | None:
    """Where JAX keeps compiled programs for `command` (None: nowhere) from --compilation_cache.
    auto: a JAX_COMPILATION_CACHE_DIR the user set; for train and eval with a gs:// workdir,
    <workdir>/compilation_cache (a pod's restart gets fresh VMs: their local disks are gone,
    the bucket is not, and every worker shares it); else LOCAL_COMPILATION_CACHE, shared by
    the machine's runs (reruns, sweep trials, eval and translate of one model), kept out of
    workdirs so they stay small to copy."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting if "://" in setting else os.path.abspath(os.path.expanduser(setting))
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    if command in ("train", "eval") and workdir and workdir.startswith("gs://"):
        return workdir.rstrip("/") + "/compilation_cache"
    base = environ.get("XDG_CACHE_HOME")
    return (os.path.join(base, "bert_jax", "jit") if base
            else os.path.expanduser(LOCAL_COMPILATION_CACHE))


def setup_compilation_cache(setting: str, command: str, workdir: str | None) -> None:
    """Points JAX's persistent compilation cache at compilation_cache_dir (before anything
    compiles: JAX opens the cache at its first compile). What the user set through JAX's own
    environment variables (JAX_ENABLE_COMPILATION_CACHE, JAX_COMPILATION_CACHE_DIR,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS...) stands unless --compilation_cache says
    otherwise; programs compiled in under a second (JAX's threshold) are not stored."""
    import jax

    path = compilation_cache_dir(setting, command, workdir)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    if setting == "auto" and (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                              or not jax.config.jax_enable_compilation_cache):
        return  # the user's own JAX settings
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    if (setting == "auto" and "://" not in path
            and "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ):
        jax.config.update("jax_compilation_cache_max_size", LOCAL_COMPILATION_CACHE_BYTES)


def _one_line(error: BaseException) -> str:
    """The error's message on one line (a library's message may span several)."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without them, the --config.<key>=<value> overrides); `--config.key value` too."""
    rest, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            key_value = arg[len("--config."):]
            if "=" not in key_value and i + 1 < len(argv):
                key_value, i = f"{key_value}={argv[i + 1]}", i + 1
            overrides.append(key_value)
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def _bad_flag(message) -> None:
    print(f"bert-jax: bad flag: {_one_line(message)} (`bert-jax --help` lists the commands and "
          "flags)", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl flags, then --config loaded with its overrides by our loader (whose errors name the
    file, the key and the valid choices): one clear line and exit 2 for anything bad."""
    rest, overrides = _split_overrides(argv)
    try:
        remaining = flags.FLAGS(rest)
    except flags.Error as e:
        _bad_flag(str(e))
    if _CONFIG.value is not None:
        try:
            _LoadedConfig.value = config_lib.load(_CONFIG.value, overrides)
        except Exception as e:  # noqa: BLE001 (a config file can raise anything; say which file)
            _bad_flag(e if isinstance(e, config_lib.ConfigError) else f"--config={_CONFIG.value}: "
                      f"{type(e).__name__}: {e}")
        _LoadedConfig.overrides = tuple(overrides)
    elif overrides:
        _bad_flag(f"--config.{overrides[0]} needs --config=<file.py[:arg]> to apply to")
    return remaining


def _usage_lines() -> dict[str, list[str]]:
    """This module's docstring usage lines, by command."""
    out: dict[str, list[str]] = {}
    command = None
    for line in (__doc__ or "").splitlines():
        if line.startswith("  bert-jax "):
            command = line.split()[1]
            out.setdefault(command, []).append(line)
        elif command and line.startswith("    "):
            out[command].append(line)
        else:
            command = None
    return out


def print_help(command: str | None) -> None:
    """`bert-jax --help` (every command) or `bert-jax <command> --help` (its usage and flags)."""
    usage = _usage_lines()
    if command not in COMMANDS:
        print("usage: bert-jax <command> [flags]   (`bert-jax <command> --help` for its flags)\n")
        for name in COMMANDS:
            doc = " ".join((globals()[f"cmd_{name}"].__doc__ or "").split()).split(";")[0]
            print(f"  {name:<9} {doc}")
        print("\n" + "\n".join(line for name in COMMANDS for line in usage.get(name, [])))
        return
    print("usage:\n" + "\n".join(usage.get(command, [f"  bert-jax {command} [flags]"])))
    print((globals()[f"cmd_{command}"].__doc__ or "").strip() + "\n\nflags:")
    for name in COMMAND_FLAGS.get(command, ()):
        flag = flags.FLAGS[name]
        default = "" if flag.default is None else f" (default: {flag.default})"
        print(f"  --{name}: {flag.help}{default}")


def setup_process() -> None:
    """What a bert_jax process sets up once, before JAX starts: the console log handler, and
    libtpu told that there is no TPU when it is installed on a machine without one."""
    from bert_jax import log
    from bert_jax.cloud import tpu

    log.install()
    tpu.quiet_libtpu_off_tpu()


def run() -> None:
    """Console-script entry point."""
    _Started.at = time.time()
    setup_process()
    try:
        if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
            print_help(sys.argv[1] if len(sys.argv) > 1 else None)
            sys.exit(0)
        app.run(main, flags_parser=_parse_flags)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    run()
