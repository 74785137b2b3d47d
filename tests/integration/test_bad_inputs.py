"""Bad inputs a user can make, through the real command line in-process (`main.run` with a
patched sys.argv): each exits 1 (found while running) or 2 (a bad flag) with one line on
stderr naming the file, line or config key and what to do, no traceback, and every file of
the runs, checkpoints and results that existed before is left as it was."""

from __future__ import annotations

import dataclasses
import errno
import gzip
import hashlib
import io
import json
import math
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from flax import nnx
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import convert, export
from bert_jax.training import checkpoint, sharding, state, train
from bert_jax.training import metrics as metrics_lib

WORDS = ("the a an cat dog sat on mat hello world good bad movie is was what who where when "
         "why how film it this that and or not very").split()
SMALL_MODEL = ("--config.model.vocab_size=128 --config.model.num_layers=1 "
               "--config.model.emb_dim=32 --config.model.num_heads=2 --config.model.head_dim=16 "
               "--config.model.mlp_dim=64")
PRETRAIN = ("train --config configs/bert_pretrain.py:tiny --workdir {tmp}/w " + SMALL_MODEL +
            " --config.data.name=synthetic --config.train.batch_size=8 "
            "--config.data.max_seq_length=16 --config.data.max_predictions_per_seq=3 "
            "--config.train.steps=2 --config.schedule.warmup_steps=1")
TEXT = (PRETRAIN.replace("--config.data.name=synthetic", "--config.data.name=text")
        + " --config.data.tokenizer={vocab} --config.data.train_files={tmp}/corpus/*.txt "
          "--config.data.text_format=sentences --config.data.heldout_every=2")
FINETUNE = (" --workdir {tmp}/w --config.data.tokenizer={vocab} --config.data.data_dir={tmp}/data "
            + SMALL_MODEL + " --config.data.max_seq_length=16 --config.train.batch_size=8")
GLUE = "train --config configs/glue.py:sst2,tiny" + FINETUNE
STSB = "train --config configs/glue.py:stsb,tiny" + FINETUNE
NER = "train --config configs/ner.py:conll2003,tiny" + FINETUNE
SQUAD = ("train --config configs/squad.py:v1,tiny" + FINETUNE
         + " --config.data.doc_stride=4 --config.data.max_query_length=4")
SWAG = "train --config configs/swag.py:tiny" + FINETUNE
INFO = "info --config configs/bert_pretrain.py:tiny"
RESUME = PRETRAIN.replace("{tmp}/w", "{run}")  # the shared run with the config it was trained with
FEATURES = "features --checkpoint {ckpt} --input {tmp}/in.txt --output {tmp}/out.jsonl --layers=-1"


# --- Files written by the cases' setups -------------------------------------------------------

def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


SST2 = "sentence\tlabel\nthe movie is good\t1\nthe film was bad\t0\nhello world\t1\n"
STSB_ROWS = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
             "0\tmain\tf\t2012\t0\ts\ts\tthe cat sat\tthe dog sat\t{}\n")
CONLL = "-DOCSTART- -X- -X- O\n\nthe DT B-NP O\ncat NN I-NP B-PER\n\ndog NN B-NP B-LOC\n"
SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
SWAG_ROW = "0,v,1,the cat,the cat sat,the cat,gold,sat,ran,is,was,{}\n"


def squad_json(answer_start: int = 4, text: str = "cat") -> str:
    qa = {"id": "q1", "question": "what sat", "answers": [{"text": text, "answer_start": answer_start}]}
    return json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "the cat sat on the mat", "qas": [qa]}]}]})


def files(**named: str | bytes) -> Callable[[Path, dict], None]:
    """A setup writing {relative path under tmp: content} (keys use __ for / and _DOT_ for .)."""
    def setup(tmp: Path, ctx: dict) -> None:
        for key, text in named.items():
            write(tmp / key.replace("__", "/").replace("_DOT_", "."), text)
    return setup


def glue(train: str | bytes = SST2, dev: str | bytes | None = SST2, task: str = "SST-2"):
    return files(**{f"data__{task}__train_DOT_tsv": train},
                 **({f"data__{task}__dev_DOT_tsv": dev} if dev is not None else {}))


def ner(train: str | bytes = CONLL, valid: str | bytes | None = CONLL):
    return files(data__train_DOT_txt=train, **({"data__valid_DOT_txt": valid} if valid is not None else {}))


def squad(train: str | bytes = squad_json(), dev: str | bytes | None = squad_json()):
    out = {"data__train-v1_DOT_1_DOT_json": train}
    if dev is not None:
        out["data__dev-v1_DOT_1_DOT_json"] = dev
    return files(**out)


def swag(train: str | bytes = SWAG_HEADER + SWAG_ROW.format(0), val: str | bytes | None = None):
    good = SWAG_HEADER + SWAG_ROW.format(1)
    return files(data__train_DOT_csv=train, data__val_DOT_csv=good if val is None else val)


CORPUS = "the cat sat on the mat.\nthe dog sat.\n\nhello world.\nthe film was good.\n\n"


def corpus(text: str | bytes = CORPUS * 3):
    return files(corpus__a_DOT_txt=text)


def copy_of(name: str, *then: Callable[[Path], None]):
    """A setup copying ctx[name] to tmp/<name>, then changing the copy."""
    def setup(tmp: Path, ctx: dict) -> None:
        shutil.copytree(ctx[name], tmp / name)
        for change in then:
            change(tmp / name)
    return setup


def bare_weights(folder: Path) -> None:
    """The folder's tensors without the `bert.` prefix (as a bare encoder's: no family's names)."""
    import safetensors.numpy

    tensors = safetensors.numpy.load_file(folder / "model.safetensors")
    safetensors.numpy.save_file({k.removeprefix("bert."): v for k, v in tensors.items()},
                                folder / "model.safetensors", metadata={"format": "pt"})


def as_int8(tensor: str):
    """A change storing the folder's `tensor` as int8 (as a quantized checkpoint holds weights)."""
    def change(folder: Path) -> None:
        import safetensors.numpy

        tensors = safetensors.numpy.load_file(folder / "model.safetensors")
        tensors[tensor] = (tensors[tensor] * 100).astype("int8")
        safetensors.numpy.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return change


def cut_short(name: str, by: int):
    """A change cutting the folder's file `name` short by `by` bytes (a download stopped early)."""
    return lambda folder: (folder / name).write_bytes((folder / name).read_bytes()[:-by])


def hf_config(**changes):
    def change(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(changes)
        for k in [k for k, v in changes.items() if v is None]:
            del cfg[k]
        (folder / "config.json").write_text(json.dumps(cfg))
    return change


def remove(name: str):
    return lambda folder: (folder / name).unlink()


def replace(name: str, content: str | bytes):
    return lambda folder: write(folder / name, content)


def corrupt_params(folder: Path, steps: str = "*") -> None:
    """Overwrites every file of the params item of every checkpoint (or of `steps`) with garbage."""
    for f in (folder / "checkpoints").glob(f"{steps}/params/**/*"):
        if f.is_file():
            f.write_bytes(b"\x00garbage" * 8)


def corrupt_params_of(step: int) -> Callable[[Path], None]:
    return lambda folder: corrupt_params(folder, str(step))


def sweep_file(base: str, grid: dict):
    """A setup writing tmp/sw.py, a sweep config of `base` over `grid`."""
    return files(sw_DOT_py="from bert_jax.commands.sweep import sweep_config\n\n\n"
                           f"def get_config(arg=None):\n    return sweep_config({base!r}, {grid!r})\n")


def truncate_arrays(folder: Path) -> None:
    """Cuts every array data file of the params of every checkpoint to half its size."""
    for f in (folder / "checkpoints").glob("*/params/ocdbt.process_0/d/*"):
        f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])


def features_input(text: str | bytes = "the cat sat\nhello ||| world\n"):
    return files(in_DOT_txt=text)


# --- The table --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: str  # formatted with {tmp}, {run}, {ft}, {ckpt}, {hf}, {vocab}, {preln}
    code: int  # 1: found while running; 2: a bad flag
    says: tuple[str, ...]  # in the error line
    setup: Callable[[Path, dict], None] | None = None


def case(id: str, argv: str, code: int, *says: str, setup=None) -> Case:
    return Case(id, argv, code, says, setup)


CONFIG_CASES = [
    # config files and variants
    case("config-file-missing", "info --config configs/nope.py", 2, "configs/nope.py", "no such file"),
    case("config-file-missing-with-arg", "train --config configs/nope.py:tiny --workdir {tmp}/w", 2,
         "configs/nope.py"),
    case("config-is-a-directory", "info --config configs", 2, "configs"),
    case("config-is-a-url", "info --config gs://bucket/configs/glue.py:mrpc", 2,
         "gs://bucket/configs/glue.py:mrpc", "local Python file", "never a URL"),
    case("config-not-python", "info --config README.md", 2, "README.md", "get_config"),
    case("config-without-get-config", "info --config {tmp}/c.py", 2, "c.py", "get_config",
         setup=files(c_DOT_py="X = 1\n")),
    case("config-raises", "info --config {tmp}/c.py", 2, "c.py", "ZeroDivisionError",
         setup=files(c_DOT_py="def get_config(arg=None):\n    return 1 / 0\n")),
    case("config-space-form-missing", "info --config configs/nope.py:base", 2, "configs/nope.py"),
    case("pretrain-variant-huge", "info --config configs/bert_pretrain.py:huge", 2, "huge", "choose one of"),
    case("pretrain-variant-named-as-the-argument", "info --config configs/bert_pretrain.py:huge", 2,
         "--config=configs/bert_pretrain.py:huge: its argument 'huge' (after the ':'): unknown BERT "
         "size 'huge'"),
    case("wmt-variant-huge", "info --config configs/wmt.py:huge", 2, "huge", "choose one of"),
    case("glue-task-mrcp", "train --config configs/glue.py:mrcp --workdir {tmp}/w", 2, "mrcp", "mrpc"),
    case("glue-size-huge", "info --config configs/glue.py:sst2,huge", 2, "huge", "choose one of"),
    case("ner-variant", "info --config configs/ner.py:conll2004", 2, "conll2004", "conll2003"),
    case("squad-variant", "info --config configs/squad.py:v3", 2, "v3", "v1 or v2"),
    case("swag-variant", "info --config configs/swag.py:huge", 2, "huge", "choose one of"),
    case("sweep-variant", "sweep --config configs/sweeps/glue.py:mrcp --workdir {tmp}/s", 1, "mrcp"),
    # override keys, types and forms
    case("override-unknown-key", INFO + " --config.model.num_layer=3", 2, "model.num_layer", "num_layers"),
    case("override-unknown-section", INFO + " --config.modle.num_layers=3", 2, "modle", "model"),
    case("override-too-deep", INFO + " --config.train.steps.max=3", 2, "train.steps.max"),
    case("override-int-text", INFO + " --config.train.steps=abc", 2, "train.steps", "abc", "int"),
    case("override-int-float", INFO + " --config.train.steps=1.5", 2, "train.steps", "int"),
    case("override-float-text", INFO + " --config.optimizer.learning_rate=fast", 2,
         "optimizer.learning_rate", "float"),
    case("override-bool-text", INFO + " --config.model.scan_layers=maybe", 2, "model.scan_layers", "bool"),
    case("override-tuple-text", INFO + " --config.logical_axis_rules=notatuple", 2, "logical_axis_rules"),
    case("override-tuple-dict", INFO + " --config.logical_axis_rules={{1:2}}", 2, "logical_axis_rules",
         "tuple"),
    case("override-section-value", INFO + " --config.model=3", 2, "model", "--config.model.<key>"),
    case("override-no-value", INFO + " --config.train.steps", 2, "train.steps", "key=value"),
    case("override-without-config", "info --config.train.steps=3", 2, "--config.train.steps", "--config="),
    case("override-seed-text", INFO + " --config.seed=abc", 2, "seed", "int"),
    case("override-grid-not-tuple", "sweep --config configs/sweeps/glue.py:mrpc --workdir {tmp}/s "
         "--config.grid.seed=3", 2, "grid.seed", "tuple"),
    # values checked before anything runs
    case("batch-zero", PRETRAIN + " --config.train.batch_size=0", 1, "train.batch_size=0", ">= 1"),
    case("steps-zero", PRETRAIN + " --config.train.steps=0", 1, "train.steps=0", ">= 1"),
    case("seed-negative", PRETRAIN + " --config.seed=-3", 1, "seed=-3", "[0, 2**31)"),
    case("block-size-without-splash", PRETRAIN + " --config.model.attention_block_q=256", 1,
         "--config.model.attention_block_q", "attention_kernel='xla'", "would do nothing"),
    case("override-tuple-not-literal", INFO + " --config.logical_axis_rules=abc", 2,
         "logical_axis_rules", "not a Python literal", "strings quoted"),
    case("steps-negative", PRETRAIN + " --config.train.steps=-5", 1, "train.steps=-5"),
    case("log-every-zero", PRETRAIN + " --config.train.log_every=0", 1, "train.log_every=0"),
    case("checkpoint-every-zero", PRETRAIN + " --config.train.checkpoint_every=0", 1,
         "train.checkpoint_every=0"),
    case("keep-checkpoints-zero", PRETRAIN + " --config.train.keep_checkpoints=0", 1,
         "train.keep_checkpoints=0"),
    case("grad-accum-zero", PRETRAIN + " --config.train.grad_accum_steps=0", 1, "train.grad_accum_steps=0"),
    case("epochs-on-pretraining", PRETRAIN + " --config.train.steps=0 --config.train.epochs=2", 1,
         "train.epochs", "train.steps"),
    case("dtype-float16", PRETRAIN + " --config.dtype=float16", 1, "dtype='float16'", "bfloat16"),
    case("dtype-info", INFO + " --config.dtype=int8", 1, "dtype", "float32"),
    case("model-dtype-not-a-key", PRETRAIN + " --config.model.dtype=bfloat16", 2, "model.dtype",
         "valid keys"),
    case("mesh-too-big", PRETRAIN + " --config.mesh.data=3", 1, "mesh", "8", "mesh.data=-1"),
    case("mesh-zero", PRETRAIN + " --config.mesh.fsdp=0", 1, "mesh", "positive"),
    case("mesh-two-fills", PRETRAIN + " --config.mesh.fsdp=-1", 1, "mesh", "-1"),
    case("mesh-not-dividing", PRETRAIN + " --config.mesh.fsdp=3", 1, "mesh", "divisible"),
    case("mesh-negative", PRETRAIN + " --config.mesh.tensor=-2", 1, "mesh", "positive"),
    case("axis-rule-unknown-mesh-axis", PRETRAIN + " --config.logical_axis_rules=\"(('embed', 'fsdpp'),)\"",
         1, "logical_axis_rules", "fsdpp", "data"),
    case("axis-rule-unknown-mesh-axis-in-tuple",
         PRETRAIN + " --config.logical_axis_rules=\"(('batch', ('data', 'model')),)\"", 1,
         "logical_axis_rules", "'model'"),
    case("axis-rule-not-a-pair", PRETRAIN + " --config.logical_axis_rules=\"(('embed',),)\"", 1,
         "logical_axis_rules", "pair"),
    case("axis-rule-unknown-logical-axis", PRETRAIN + " --config.logical_axis_rules=\"(('embd', 'fsdp'),)\"",
         1, "logical_axis_rules", "embd", "embed"),
    case("axis-rule-eval", "eval --workdir {run} --config configs/bert_pretrain.py:tiny "
         "--config.logical_axis_rules=\"(('mlp', 'tensr'),)\"", 1, "logical_axis_rules", "tensr"),
    case("batch-not-divisible", PRETRAIN + " --config.train.batch_size=12", 1, "train.batch_size", "mesh"),
    case("microbatch-not-divisible", PRETRAIN + " --config.train.grad_accum_steps=3", 1,
         "train.grad_accum_steps=3"),
    case("microbatch-not-sharded", PRETRAIN + " --config.train.grad_accum_steps=2", 1,
         "microbatch", "mesh"),
    case("schedule-unknown", PRETRAIN + " --config.schedule.name=linear", 1, "schedule.name='linear'",
         "warmup_linear"),
    case("warmup-negative", PRETRAIN + " --config.schedule.warmup_steps=-1", 1, "schedule.warmup_steps=-1"),
    case("warmup-over-steps", PRETRAIN + " --config.schedule.warmup_steps=50", 1,
         "schedule.warmup_steps=50", "train.steps=2"),
    case("rsqrt-warmup-zero", PRETRAIN + " --config.schedule.name=rsqrt_paper "
         "--config.schedule.warmup_steps=0", 1, "schedule.warmup_steps=0", ">= 1"),
    case("cosine-final-fraction", PRETRAIN + " --config.schedule.name=cosine "
         "--config.schedule.final_fraction=2.0", 1, "schedule.final_fraction=2.0", "[0, 1]"),
    case("optimizer-unknown", PRETRAIN + " --config.optimizer.name=adamax", 1, "optimizer.name='adamax'",
         "adamw"),
    case("learning-rate-negative", PRETRAIN + " --config.optimizer.learning_rate=-0.1", 1,
         "optimizer.learning_rate=-0.1"),
    case("weight-decay-negative", PRETRAIN + " --config.optimizer.weight_decay=-1.0", 1,
         "optimizer.weight_decay=-1.0"),
    case("weight-decay-with-adam", PRETRAIN + " --config.optimizer.name=adam", 1,
         "optimizer.weight_decay", "adamw"),
    case("grad-clip-negative", PRETRAIN + " --config.optimizer.grad_clip_norm=-1.0", 1,
         "optimizer.grad_clip_norm=-1.0"),
    case("seq-over-position-table", PRETRAIN + " --config.data.max_seq_length=1024", 1,
         "data.max_seq_length=1024", "model.max_len=512"),
    case("phase-over-position-table", PRETRAIN + " --config.data.phases=\"((0, 16, 3), (1, 600, 3))\"", 1,
         "600", "model.max_len=512"),
    case("label-smoothing-on-bert", PRETRAIN + " --config.train.label_smoothing=0.1", 1,
         "train.label_smoothing=0.1", "set it to 0"),
    case("label-smoothing-one", PRETRAIN + " --config.train.label_smoothing=1.0", 1,
         "train.label_smoothing=1.0", "[0, 1)"),
    case("model-name-unknown", INFO + " --config.model.name=gpt5", 1, "model.name='gpt5'", "choose one of"),
    case("model-activation", PRETRAIN + " --config.model.activation=swish", 1, "model.activation='swish'",
         "gelu"),
    case("model-norm", INFO + " --config.model.norm=mid", 1, "model.norm='mid'", "pre"),
    case("model-positions", "info --config configs/multi30k.py --config.model.positions=rotary", 1,
         "model.positions='rotary'"),
    case("model-field-not-read", PRETRAIN + " --config.model.tie_output=false", 2,
         "model.tie_output", "'bert_pretraining'", "does not read"),
    case("model-remat", INFO + " --config.model.remat_policy=all", 1, "model.remat_policy='all'"),
    case("model-vocab-zero", INFO + " --config.model.vocab_size=0", 1, "model.vocab_size=0", ">= 1"),
    case("model-layers-negative", PRETRAIN + " --config.model.num_layers=-1", 1, "model.num_layers=-1"),
    case("model-heads-zero", INFO + " --config.model.num_heads=0", 1, "model.num_heads=0"),
    case("model-dropout-above-one", PRETRAIN + " --config.model.dropout_rate=1.5", 1,
         "model.dropout_rate=1.5", "[0, 1)"),
    case("data-name-unknown", PRETRAIN + " --config.data.name=wiki", 1, "data.name='wiki'", "synthetic"),
    case("data-format-unknown", TEXT + " --config.data.text_format=lines", 1, "text_format", "paragraphs",
         setup=corpus()),
    case("init-from-missing", GLUE + " --config.init_from={tmp}/nope", 1, "nope", "checkpoints/"),
    case("init-from-empty-dir", GLUE + " --config.init_from={tmp}", 1, "checkpoints/", setup=glue()),
    case("init-from-size-set-differs", "train --config configs/glue.py:sst2,tiny --workdir {tmp}/w "
         "--config.init_from={ckpt} --config.data.data_dir={tmp}/data --config.model.num_layers=3 "
         "--config.data.max_seq_length=16 --config.train.batch_size=8", 1, "model.num_layers",
         "--config.model.num_layers=1", "--config.init_mode=tile_from_middle", setup=glue()),
    case("init-mode-unknown", PRETRAIN + " --config.init_mode=tile", 1, "init_mode='tile'",
         "'exact', 'tile_from_middle'"),
    case("init-mode-tile-without-init-from", PRETRAIN + " --config.init_mode=tile_from_middle", 1,
         "init_from is empty", "--config.init_from=", "init_mode=exact"),
    case("init-mode-tile-into-smaller", GLUE + " --config.init_from={ckpt} "
         "--config.init_mode=tile_from_middle --config.model.mlp_dim=32", 1,
         "model.mlp_dim=32 is smaller than the checkpoint's 64", "init_mode=exact", setup=glue()),
    # the command line itself
    case("no-command", "", 2, "usage"),
    case("unknown-command", "trian --config configs/bert_pretrain.py:tiny", 2, "'trian'", "train"),
    case("train-without-workdir", "train --config configs/bert_pretrain.py:tiny", 2, "--workdir"),
    case("train-without-config", "train --workdir {tmp}/w", 2, "--config"),
    case("unknown-flag", "train --config configs/bert_pretrain.py:tiny --wrokdir={tmp}/w", 2, "wrokdir"),
    case("int-flag-text", FEATURES + " --max_seq_length=abc", 2, "max_seq_length"),
    case("enum-flag", "vocab --input {tmp}/a.txt --out {tmp}/v --type=bpe", 2, "type", "wordpiece"),
    # a run that exists: a changed model or optimizer is the user's change, named
    case("resume-other-model", RESUME + " --config.model.num_layers=2 --config.train.steps=4", 1,
         "model.num_layers", "--workdir"),
    case("resume-other-optimizer", RESUME + " --config.optimizer.name=lamb --config.train.steps=4", 1,
         "optimizer.name", "--workdir"),
    case("resume-other-vocab", RESUME.replace("vocab_size=128", "vocab_size=256")
         + " --config.train.steps=4", 1, "model.vocab_size", "--workdir"),
    case("workdir-is-a-file", PRETRAIN.replace("{tmp}/w", "{tmp}/f"), 1, "{tmp}/f is a file",
         "another --workdir", setup=files(f="a file")),
    # phases out of order (one would never run) or not from step 0
    case("phases-first-not-at-step-0", PRETRAIN + " --config.data.phases=\"((1, 16, 3),)\"", 1,
         "data.phases[0] starts at step 1", "must start at step 0"),
    case("phases-unsorted", PRETRAIN + " --config.data.phases=\"((0, 16, 3), (2, 8, 2), (1, 16, 3))\"",
         1, "data.phases[2] starts at step 1, before data.phases[1] (step 2)", "never run"),
    case("phases-same-start", PRETRAIN + " --config.data.phases=\"((0, 16, 3), (0, 8, 2))\"", 1,
         "data.phases[1] starts at step 0, the same step as data.phases[0]", "never run"),
    # a whole number beyond 64 bits, in any section (the upper bound of every count field)
    case("vocab-size-beyond-int64", INFO + " --config.model.vocab_size=99999999999999999999", 1,
         "model.vocab_size=99999999999999999999 is beyond what a run can count", "2**63 - 1"),
    case("train-vocab-size-beyond-int64", "train --config configs/bert_pretrain.py:tiny --workdir {tmp}/w "
         "--config.model.vocab_size=99999999999999999999", 1, "model.vocab_size=99999999999999999999"),
    case("steps-beyond-int64", INFO + " --config.train.steps=9223372036854775808", 1,
         "train.steps=9223372036854775808"),
    case("phase-predictions-beyond-int64",
         INFO + " --config.data.phases=\"((0, 128, 99999999999999999999),)\"", 1,
         "data.phases[0][2]=99999999999999999999"),
    # two keys of one value both given: neither is silently dropped
    case("warmup-steps-and-fraction", GLUE + " --config.schedule.warmup_steps=3 "
         "--config.schedule.warmup_fraction=0.2", 1, "--config.schedule.warmup_steps=3 and "
         "--config.schedule.warmup_fraction=0.2 both set the warmup", "give one", setup=glue()),
]

MINE_PAIRS = "mine --checkpoint {ckpt} --input {tmp}/p.jsonl --output {tmp}/m.jsonl"
DATA_CASES = [
    # GLUE TSV files
    case("glue-no-data-dir", GLUE.replace("--config.data.data_dir={tmp}/data", ""), 1, "data.data_dir",
         "--config.data.data_dir"),
    case("glue-missing-train", GLUE, 1, "SST-2/train.tsv", "data.data_dir"),
    case("glue-missing-dev", GLUE, 1, "SST-2/dev.tsv", setup=glue(dev=None)),
    case("glue-empty-train", GLUE, 1, "train.tsv", "empty", setup=glue(train="")),
    case("glue-header-only", GLUE, 1, "train.tsv", "no examples", setup=glue(train="sentence\tlabel\n")),
    case("glue-wrong-header", GLUE, 1, "train.tsv:1", "sentence", setup=glue(train="text\tlabel\nhi\t1\n")),
    case("glue-short-row", GLUE, 1, "train.tsv:3", "columns", "skip_bad_rows",
         setup=glue(train="sentence\tlabel\nthe cat\t1\nno label here\n")),
    case("glue-long-row", GLUE, 1, "train.tsv:2", "columns", setup=glue(train="sentence\tlabel\na\t1\t1\n")),
    case("glue-bad-label", GLUE, 1, "train.tsv:2", "'2'", "0, 1",
         setup=glue(train="sentence\tlabel\na\t2\n")),
    case("glue-bad-dev-label", GLUE, 1, "dev.tsv:3", "'yes'",
         setup=glue(dev="sentence\tlabel\na\t1\nb\tyes\n")),
    case("glue-non-utf8", GLUE, 1, "train.tsv:3", "UTF-8",
         setup=glue(train=b"sentence\tlabel\nthe cat\t1\ncaf\xe9 au lait\t0\n")),
    case("glue-non-utf8-dev", GLUE, 1, "dev.tsv:2", "UTF-8",
         setup=glue(dev=b"sentence\tlabel\n\xff\xfe bad\t0\n")),
    case("stsb-score-text", STSB, 1, "train.tsv:2", "'high'", "0 to 5",
         setup=glue(train=STSB_ROWS.format("high"), dev=STSB_ROWS.format(1), task="STS-B")),
    case("stsb-score-range", STSB, 1, "train.tsv:2", "'7'", setup=glue(
        train=STSB_ROWS.format(7), dev=STSB_ROWS.format(1), task="STS-B")),
    case("glue-tfds-missing", GLUE + " --config.data.source=tfds", 1, "glue/sst2", "tfds build"),
    case("glue-source-unknown", GLUE + " --config.data.source=csv", 1, "data.source='csv'", "files",
         setup=glue()),
    case("glue-no-tokenizer", GLUE.replace("--config.data.tokenizer={vocab}", ""), 1, "data.tokenizer",
         setup=glue()),
    case("glue-tokenizer-missing", GLUE.replace("{vocab}", "{tmp}/nope"), 1, "nope", "vocab.txt",
         setup=glue()),
    case("glue-tokenizer-too-big", GLUE.replace("vocab_size=128", "vocab_size=40"), 1, "model.vocab_size=40",
         "--config.model.vocab_size", setup=glue()),
    case("glue-seq-too-short", GLUE.replace("max_seq_length=16", "max_seq_length=2"), 1,
         "data.max_seq_length=2", "at least 3", setup=glue()),
    # NER column files
    case("ner-missing-train", NER, 1, "train.txt", "data.data_dir"),
    case("ner-missing-dev", NER, 1, "valid.txt", setup=ner(valid=None)),
    case("ner-empty-train", NER, 1, "train.txt", "no examples", setup=ner(train="")),
    case("ner-columns", NER, 1, "train.txt", "line 4", "columns",
         setup=ner(train="-DOCSTART- -X- -X- O\n\nthe DT B-NP O\ncat B-PER\n")),
    case("ner-unknown-tag", NER, 1, "train.txt", "line 3", "'B-ANIMAL'", "data.labels",
         setup=ner(train="the DT B-NP O\n\ncat NN I-NP B-ANIMAL\n")),
    case("ner-unknown-dev-tag", NER, 1, "valid.txt", "line 1", "B-XYZ",
         setup=ner(valid="the DT B-NP B-XYZ\n")),
    case("ner-non-utf8", NER, 1, "train.txt:2", "UTF-8",
         setup=ner(train=b"the DT B-NP O\nd\xe9j\xe0 NN I-NP O\n")),
    case("ner-labels-vs-num-labels", NER + " --config.model.num_labels=3", 1, "data.labels",
         "model.num_labels=3", setup=ner()),
    case("ner-empty-token", NER, 1, "train.txt", "line 1", "empty", setup=ner(train="the\t\n")),
    # SQuAD JSON
    case("squad-missing-train", SQUAD, 1, "train-v1.1.json", "data.data_dir"),
    case("squad-missing-dev", SQUAD, 1, "dev-v1.1.json", setup=squad(dev=None)),
    case("squad-not-json", SQUAD, 1, "train-v1.1.json", "JSON", setup=squad(train="{not json")),
    case("squad-empty", SQUAD, 1, "train-v1.1.json", setup=squad(train="")),
    case("squad-no-data", SQUAD, 1, "train-v1.1.json", "data", setup=squad(train='{"version": "1.1"}')),
    case("squad-data-not-list", SQUAD, 1, "train-v1.1.json", "array", setup=squad(train='{"data": 3}')),
    case("squad-no-context", SQUAD, 1, "train-v1.1.json", "context",
         setup=squad(train='{"data": [{"paragraphs": [{"qas": []}]}]}')),
    case("squad-answer-misplaced", SQUAD, 1, "train-v1.1.json", "answer_start=0", "skip_bad_rows",
         setup=squad(train=squad_json(answer_start=0))),
    case("squad-answer-outside", SQUAD, 1, "train-v1.1.json", "answer_start=99",
         setup=squad(train=squad_json(answer_start=99))),
    case("squad-answer-start-text", SQUAD, 1, "train-v1.1.json", "answer_start",
         setup=squad(train=squad_json().replace('"answer_start": 4', '"answer_start": "4"'))),
    case("squad-non-utf8", SQUAD, 1, "dev-v1.1.json:1", "UTF-8",
         setup=squad(dev=squad_json().encode().replace(b"mat", b"m\xe4t"))),
    case("squad-empty-dev", SQUAD, 1, "dev-v1.1.json", "no examples", setup=squad(dev='{"data": []}')),
    # SWAG CSV and JSON lines
    case("swag-missing-train", SWAG, 1, "train.csv", "data.data_dir"),
    case("swag-header", SWAG, 1, "train.csv:1", "ending3", setup=swag(train="a,b\n1,2\n")),
    case("swag-columns", SWAG, 1, "train.csv:3", "columns",
         setup=swag(train=SWAG_HEADER + SWAG_ROW.format(0) + "1,v,1,x\n")),
    case("swag-label", SWAG, 1, "train.csv:2", "'7'", "0 to 3",
         setup=swag(train=SWAG_HEADER + SWAG_ROW.format(7))),
    case("swag-jsonl-bad-line", SWAG, 1, "train.csv:2", "JSON",
         setup=swag(train='{"sent1": "a", "sent2": "b", "ending0": "c", "ending1": "d", "ending2": "e", '
                          '"ending3": "f", "label": 0}\n{oops\n')),
    case("swag-jsonl-missing-field", SWAG, 1, "train.csv:1", "sent2", setup=swag(train='{"sent1": "a"}\n')),
    case("swag-non-utf8", SWAG, 1, "val.csv:2", "UTF-8",
         setup=swag(val=(SWAG_HEADER + SWAG_ROW.format(1)).encode().replace(b"ran", b"r\xffn"))),
    case("swag-empty", SWAG, 1, "train.csv", setup=swag(train="")),
    # pretraining text
    case("text-glob-matches-nothing", TEXT.replace("corpus/*.txt", "nothing/*.txt"), 1, "data.train_files",
         "nothing/*.txt"),
    case("eval-glob-matches-nothing", TEXT + " --config.data.eval_files={tmp}/held/*.txt", 1,
         "data.eval_files", "held/*.txt", setup=corpus()),
    case("corpus-too-small-for-heldout", TEXT.replace("heldout_every=2", "heldout_every=100"), 1,
         "validation", "data.heldout_every", setup=corpus()),
    case("corpus-one-document", TEXT, 1, "train", "documents", setup=corpus("one sentence only.\n")),
    case("corpus-empty", TEXT, 1, "a.txt", "no documents", setup=corpus("\n\n")),
    case("pretrain-no-tokenizer", TEXT.replace("--config.data.tokenizer={vocab}", ""), 1, "data.tokenizer",
         setup=corpus()),
    case("pretrain-tokenizer-missing", TEXT.replace("{vocab}", "{tmp}/nope"), 1, "nope", "vocab.txt",
         setup=corpus()),
    case("pretrain-tokenizer-too-big", TEXT.replace("vocab_size=128", "vocab_size=20"), 1,
         "model.vocab_size=20", "--config.model.vocab_size", setup=corpus()),
    case("tokenizer-vocab-non-utf8", TEXT.replace("{vocab}", "{tmp}/v"), 1, "vocab.txt:3", "UTF-8",
         setup=files(v__vocab_DOT_txt=b"[PAD]\n[UNK]\n\xff\n[CLS]\n[SEP]\n[MASK]\n", **{
             "corpus__a_DOT_txt": CORPUS * 3})),
    case("tokenizer-no-special-tokens", TEXT.replace("{vocab}", "{tmp}/v"), 1, "vocab.txt", "[PAD]",
         setup=files(v__vocab_DOT_txt="a\nb\n", corpus__a_DOT_txt=CORPUS * 3)),
    case("tokenizer-config-bad-json", TEXT.replace("{vocab}", "{tmp}/v"), 1, "tokenizer_config.json", "JSON",
         setup=files(v__vocab_DOT_txt="[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n",
                     v__tokenizer_config_DOT_json="{oops", corpus__a_DOT_txt=CORPUS * 3)),
    case("vocab-input-matches-nothing", "vocab --input {tmp}/none/*.txt --out {tmp}/v --size 50", 1,
         "none/*.txt"),
    case("vocab-size-too-small", "vocab --input {tmp}/corpus/a.txt --out {tmp}/v --size 3", 1, "size=3",
         setup=corpus()),
    case("vocab-without-out", "vocab --input {tmp}/corpus/a.txt", 2, "--out", setup=corpus()),
    case("prepare-out-not-empty", "prepare --config configs/bert_pretrain.py:tiny --out {tmp}/corpus "
         "--config.data.tokenizer={vocab} --config.data.train_files={tmp}/corpus/a.txt", 1, "corpus",
         "--out", setup=corpus()),
    case("prepare-no-tokenizer", "prepare --config configs/bert_pretrain.py:tiny --out {tmp}/shards "
         "--config.data.train_files={tmp}/corpus/a.txt", 1, "data.tokenizer", setup=corpus()),
    case("glue-empty-sentence", GLUE, 1, "train.tsv:3", "column 'sentence'", "a non-empty text",
         setup=glue(train="sentence\tlabel\nthe cat\t1\n\t0\n")),
    # pair files: two names for one text, or one column twice, is refused (neither is dropped)
    case("pairs-query-and-anchor", MINE_PAIRS, 1, "p.jsonl:1: fields 'query' and 'anchor'",
         "one of them", setup=files(p_DOT_jsonl='{"query": "a", "anchor": "zzz", "positive": "b"}\n')),
    case("pairs-positive-and-sentence2", MINE_PAIRS, 1, "p.jsonl:2: fields 'positive' and 'sentence2'",
         setup=files(p_DOT_jsonl='{"query": "a", "positive": "b"}\n'
                                 '{"query": "a", "positive": "b", "sentence2": "q"}\n')),
    case("pairs-negatives-and-negative", MINE_PAIRS, 1, "p.jsonl:1: fields 'negatives' and 'negative'",
         setup=files(p_DOT_jsonl='{"query": "a", "positive": "b", "negatives": ["c"], "negative": "d"}\n')),
    case("pairs-header-column-twice", MINE_PAIRS.replace("p.jsonl", "p.tsv"), 1,
         "p.tsv:1: header names the column 'positive' twice",
         setup=files(p_DOT_tsv="query\tpositive\tpositive\na\tb\tc\n")),
]

COLA = "src\t1\t\tthe cat sat\nsrc\t0\t*\tcat the sat\n"


CHECKPOINT_CASES = [
    case("eval-workdir-missing", "eval --workdir {tmp}/nope", 1, "nope", "checkpoints/"),
    case("eval-workdir-is-a-file", "eval --workdir {tmp}/f", 1, "checkpoints/", setup=files(f="x")),
    case("eval-not-a-checkpoint-dir", "eval --workdir {tmp}", 1, "checkpoints/", setup=corpus()),
    case("eval-empty-checkpoints", "eval --workdir {tmp}/w", 1, "checkpoints", "no complete checkpoint",
         setup=files(w__checkpoints__README="")),
    case("eval-corrupted-checkpoint", "eval --workdir {tmp}/run", 1, "run/checkpoints/2", "--step",
         setup=copy_of("run", corrupt_params)),
    case("eval-truncated-checkpoint-data", "eval --workdir {tmp}/run --step 1", 1, "run/checkpoints/1",
         "damaged", setup=copy_of("run", truncate_arrays)),
    case("eval-checkpoint-without-params", "eval --workdir {tmp}/run", 1, "run/checkpoints/2", "params",
         setup=copy_of("run", lambda d: shutil.rmtree(d / "checkpoints" / "2" / "params"))),
    case("eval-corrupted-config", "eval --workdir {tmp}/run", 1, "run/checkpoints/2",
         setup=copy_of("run", lambda d: [write(f, b"\xffnot json") for f in
                                         (d / "checkpoints").glob("*/config/*") if f.is_file()])),
    case("eval-step-missing", "eval --workdir {run} --step 7", 1, "--step='7'", "[1, 2]"),
    case("eval-step-text", "eval --workdir {run} --step last", 1, "--step='last'", "latest"),
    case("eval-step-best-pretraining", "eval --workdir {run} --step best", 1, "--step=best", "pretraining",
         "--step=latest"),
    case("eval-step-best-unscored", "eval --workdir {ft} --step best", 1, "--step=best", "eval/accuracy",
         "--step=latest"),
    case("eval-converted-without-config", "eval --workdir {ckpt}", 1, "--config"),
    case("eval-seq-over-position-table", "eval --workdir {run} --config configs/bert_pretrain.py:tiny "
         "--config.data.max_seq_length=1024", 1, "data.max_seq_length=1024", "512"),
    case("eval-batch-not-divisible", "eval --workdir {run} --config configs/bert_pretrain.py:tiny "
         "--config.data.name=synthetic --config.train.batch_size=12", 1, "train.batch_size=12"),
    case("eval-task-config-on-pretraining", "eval --workdir {run} --config configs/glue.py:sst2,tiny "
         "--config.data.tokenizer={vocab} --config.data.data_dir={tmp}/data", 1, "bert_pretraining",
         "bert_classification", setup=glue()),
    case("eval-pretraining-config-on-finetuned", "eval --workdir {ft} --config configs/bert_pretrain.py:tiny "
         "--config.data.name=synthetic", 1, "bert_classification", "bert_pretraining", "leave out --config"),
    case("export-step-missing", "export {run} hf:{tmp}/hf --step 9", 1, "no step 9", "[1, 2]"),
    # a step folder that holds no checkpoint of ours: empty (a save that made only its folder),
    # or another tool's layout
    case("eval-step-folder-empty", "eval --workdir {tmp}/run", 1, "run/checkpoints/3: its config cannot "
         "be read", "use another --step", setup=copy_of("run", lambda d: (d / "checkpoints" / "3").mkdir())),
    case("export-step-folder-foreign", "export {tmp}/run hf:{tmp}/out", 1,
         "run/checkpoints/3: its config cannot be read", "the checkpoint is damaged",
         setup=copy_of("run", lambda d: shutil.copytree(d / "checkpoints" / "2" / "params",
                                                         d / "checkpoints" / "3"))),
    # a workdir fine-tuned on one task resumed with another (same shapes): refused at the start,
    # before a step is trained or a save fails on the other task's best metric
    case("resume-finetuned-with-another-task", GLUE.replace("sst2", "cola").replace("{tmp}/w", "{tmp}/ft"),
         1, "checkpoint {tmp}/ft/checkpoints/0 holds a run fine-tuned on glue sst2",
         "fine-tunes glue cola", "new --workdir", "init_from", "{tmp}/ft/checkpoints/0/config",
         setup=lambda t, c: (copy_of("ft")(t, c), glue(train=COLA, dev=COLA, task="CoLA")(t, c))),
    # init_from a fine-tuned checkpoint whose head has another shape: the way to take its encoder
    case("init-from-other-head-shape", STSB + " --config.init_from={ft}", 1,
         "init_from={ft}: parameter classifier/bias has shape (2,) in the checkpoint but (1,) here",
         "--config.init_mode=transplant", setup=glue(train=STSB_ROWS.format(1.0),
                                                      dev=STSB_ROWS.format(2.0), task="STS-B")),
    # a resume on a step with its weights but not its optimizer state: refused, the step left in
    # place (eval and export read its params); steps a resume set aside are named by eval
    case("resume-checkpoint-without-optimizer-state", PRETRAIN.replace("{tmp}/w", "{tmp}/run")
         .replace("steps=2", "steps=3"), 1, "checkpoint {tmp}/run/checkpoints/2 has its params but "
         "no opt_state folder", "--config.init_from={tmp}/run with a new --workdir",
         setup=copy_of("run", lambda d: shutil.rmtree(d / "checkpoints" / "2" / "opt_state"))),
    case("eval-only-steps-set-aside", "eval --workdir {tmp}/run", 1,
         "run/checkpoints: no complete checkpoint, only 1.unreadable, 2.unreadable", "rename it back",
         setup=copy_of("run", *(lambda d, s=s: (d / "checkpoints" / s).rename(
             d / "checkpoints" / f"{s}.unreadable") for s in "12"))),
    # a checkpoint's vocab.txt edited after it was saved (cut short; a token replaced by a second
    # [UNK]): refused against the checkpoint's own record of it, both files named
    case("features-checkpoint-vocab-cut-short", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1,
         "{tmp}/ckpt/vocab.txt: ", " tokens, but {tmp}/ckpt/bert_jax_tokenizer.json records vocab_size=",
         "restore them from a copy", setup=lambda t, c: (copy_of("ckpt", lambda d: write(
             d / "vocab.txt", "".join((d / "vocab.txt").read_text().splitlines(True)[:-3])))(t, c),
             features_input()(t, c))),
    case("features-checkpoint-vocab-token-replaced", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1,
         "{tmp}/ckpt/vocab.txt: its content differs from the one {tmp}/ckpt/bert_jax_tokenizer.json "
         "records", setup=lambda t, c: (copy_of("ckpt", lambda d: write(
             d / "vocab.txt", (d / "vocab.txt").read_text().replace("\nthe\n", "\n[UNK]\n")))(t, c),
             features_input()(t, c))),
    # pretraining from a checkpoint without data.tokenizer: the advice names init_from's own
    case("pretrain-init-from-without-tokenizer", "train --config configs/bert_pretrain.py:tiny "
         "--workdir {tmp}/w " + SMALL_MODEL + " --config.init_from={ckpt} --config.data.name=text "
         "--config.data.train_files={tmp}/corpus/a.txt", 1,
         "data.tokenizer is empty: set --config.data.tokenizer={ckpt} (init_from's folder holds",
         setup=corpus()),
    # a step's metrics file (Orbax reads every step's when it lists them) that is not JSON
    case("eval-step-metrics-not-json", "eval --workdir {tmp}/run", 1,
         "run/checkpoints/2/metrics/metrics: not valid JSON", "restore it from a copy",
         setup=copy_of("run", replace("checkpoints/2/metrics/metrics", "garbage"))),
    case("features-corrupted-checkpoint", "features --checkpoint {tmp}/run --input {tmp}/in.txt "
         "--output {tmp}/o.jsonl --layers=-1", 1, "run/checkpoints/2", setup=lambda t, c: (
             copy_of("run", corrupt_params)(t, c), features_input()(t, c))),
]

CONVERT_CASES = [
    case("convert-missing-folder", "convert hf:{tmp}/nope {tmp}/out", 1, "nope/config.json", "Hugging Face"),
    case("convert-no-config", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/config.json",
         setup=copy_of("hf", remove("config.json"))),
    case("convert-bad-json", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json", "JSON",
         setup=copy_of("hf", replace("config.json", "{oops"))),
    case("convert-json-not-object", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json", "object",
         setup=copy_of("hf", replace("config.json", "[1, 2]"))),
    case("convert-config-non-utf8", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json",
         setup=copy_of("hf", replace("config.json", b"{\xff}"))),
    case("convert-config-missing-key", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json", "hidden_size",
         setup=copy_of("hf", hf_config(hidden_size=None))),
    case("convert-config-bad-type", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json", "num_hidden_layers",
         setup=copy_of("hf", hf_config(num_hidden_layers="two"))),
    case("convert-model-type", "convert hf:{tmp}/hf {tmp}/out", 1, "model_type='gpt2'",
         "'bert', 'roberta'", setup=copy_of("hf", hf_config(model_type="gpt2"))),
    case("convert-architectures-not-a-list", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf: config.json: architectures='BertModel', expected a list of Hugging Face class names",
         setup=copy_of("hf", hf_config(architectures="BertModel"))),
    case("convert-config-value-of-another-type", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf: model.layer_norm_eps='small': expected a number",
         setup=copy_of("hf", hf_config(layer_norm_eps="small"))),
    case("convert-activation", "convert hf:{tmp}/hf {tmp}/out", 1, "hidden_act='swish'",
         setup=copy_of("hf", hf_config(hidden_act="swish"))),
    case("convert-heads-not-dividing", "convert hf:{tmp}/hf {tmp}/out", 1, "num_attention_heads=3",
         "hidden_size=32", setup=copy_of("hf", hf_config(num_attention_heads=3))),
    case("convert-missing-weights", "convert hf:{tmp}/hf {tmp}/out", 1, "hf", "model.safetensors",
         setup=copy_of("hf", remove("model.safetensors"))),
    case("convert-corrupt-safetensors", "convert hf:{tmp}/hf {tmp}/out", 1, "model.safetensors",
         setup=copy_of("hf", replace("model.safetensors", b"\x05\x00\x00\x00\x00\x00\x00\x00garbage"))),
    case("convert-corrupt-bin", "convert hf:{tmp}/hf {tmp}/out", 1, "pytorch_model.bin", "torch",
         setup=copy_of("hf", remove("model.safetensors"), replace("pytorch_model.bin", b"not a zip"))),
    case("convert-bad-index", "convert hf:{tmp}/hf {tmp}/out", 1, "model.safetensors.index.json",
         setup=copy_of("hf", remove("model.safetensors"), replace("model.safetensors.index.json", "{}"))),
    case("convert-safetensors-cut-short", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/model.safetensors: not a valid safetensors file", "the file is cut short",
         "download the model's files again", setup=copy_of("hf", cut_short("model.safetensors", 100))),
    case("convert-safetensors-header-length-past-the-end", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/model.safetensors: not a valid safetensors file", "its header length says",
         setup=copy_of("hf", lambda d: (d / "model.safetensors").write_bytes(
             b"\xff" * 8 + (d / "model.safetensors").read_bytes()[8:]))),
    case("convert-quantized-weights", "convert hf:{tmp}/hf {tmp}/out", 1,
         "{tmp}/hf: tensor bert.encoder.layer.0.attention.self.query.weight is int8, not floating point",
         "quantized checkpoint",
         setup=copy_of("hf", as_int8("bert.encoder.layer.0.attention.self.query.weight"))),
    # config.json's sizes against the tensors' shapes: both sides named
    case("convert-wrong-shapes", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/config.json: intermediate_size=48",
         "encoder.layer.0.intermediate.dense.weight has shape (64, 32)", "use the config.json",
         setup=copy_of("hf", hf_config(intermediate_size=48))),
    case("convert-wrong-vocab", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json: vocab_size=300",
         "word_embeddings.weight has shape (128, 32) (128 rows)",
         setup=copy_of("hf", hf_config(vocab_size=300))),
    case("convert-positions-not-the-table", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: max_position_embeddings=1024", "bert.embeddings.position_embeddings.weight has shape",
         setup=copy_of("hf", hf_config(max_position_embeddings=1024))),
    case("convert-segments-not-the-table", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: type_vocab_size=1",
         "bert.embeddings.token_type_embeddings.weight has shape (2, 32) (2 rows)",
         setup=copy_of("hf", hf_config(type_vocab_size=1))),
    case("convert-fewer-layers-than-the-weights", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: num_hidden_layers=2 but the weights hold 1 layer (0 to 0)",
         setup=copy_of("hf", hf_config(num_hidden_layers=2))),
    case("convert-vocab-bigger-than-model", "convert hf:{tmp}/hf {tmp}/out", 1, "vocab.txt", "vocab_size",
         setup=copy_of("hf", replace("vocab.txt", "\n".join(
             ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(200)]) + "\n"))),
    case("convert-vocab-without-cls-and-sep", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/vocab.txt: the vocab lacks [CLS], [SEP], which every input", "came with the model",
         setup=copy_of("hf", remove("tokenizer.json"), replace("vocab.txt", "\n".join(
             ["[PAD]", "[UNK]", "[MASK]"] + [f"w{i}" for i in range(60)]) + "\n"))),
    # a masked-LM model whose vocab has no mask token: it could never be trained or used as one
    case("convert-masked-lm-without-mask-token", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/vocab.txt: the vocab has no mask token ([MASK])", "masked-LM model (BertForPreTraining)",
         "--head bert", setup=copy_of("hf", remove("tokenizer.json"), lambda d: write(
             d / "vocab.txt", (d / "vocab.txt").read_text().replace("[MASK]\n", "")))),
    case("convert-no-vocab", "convert hf:{tmp}/hf {tmp}/out", 1, "vocab.txt",
         setup=copy_of("hf", remove("vocab.txt"), remove("tokenizer.json"))),
    case("convert-unknown-head", "convert hf:{hf} {tmp}/out --head bert_regression", 1,
         "--head='bert_regression'", "bert_classification"),
    case("convert-out-has-checkpoints", "convert hf:{hf} {ckpt}", 1, "already holds checkpoints"),
    case("convert-one-argument", "convert hf:{hf}", 2, "usage", "<out_dir>"),
    case("convert-no-prefix", "convert {hf} {tmp}/out", 2, "hf:"),
    case("convert-tf-missing", "convert tf:{tmp}/nope/bert_model.ckpt {tmp}/out", 1, "nope"),
    case("convert-tf-bad-index", "convert tf:{tmp}/tf/bert_model.ckpt {tmp}/out", 1, "bert_model.ckpt.index",
         setup=files(tf__bert_model_DOT_ckpt_DOT_index=b"garbage", tf__bert_config_DOT_json="{}")),
    # one of the source's files given for its folder (or a TF checkpoint's file for its prefix)
    case("convert-source-a-weights-file", "convert hf:{hf}/model.safetensors {tmp}/out", 1,
         "<source>=hf:{hf}/model.safetensors is a file, not a folder", "give hf:{hf} (the folder"),
    case("convert-tf-index-file-for-the-prefix", "convert tf:{tmp}/tf/bert_model.ckpt.index {tmp}/out",
         1, "a file where a folder is needed", "give tf:{tmp}/tf/bert_model.ckpt (the prefix)",
         setup=files(tf__bert_model_DOT_ckpt_DOT_index=b"garbage", tf__bert_config_DOT_json="{}")),
    # a flag convert would ignore: st: converts the sentence model's bare encoder
    case("convert-st-with-head", "convert st:{tmp}/st {tmp}/out --head bert_classification", 2,
         "--head=bert_classification would do nothing with an st: source"),
    # a sentence length past the model's position table, as sentence_bert_config.json gives it
    case("convert-st-max-seq-length-past-the-positions", "convert st:{tmp}/st {tmp}/out", 1,
         "st/sentence_bert_config.json: max_seq_length=100000, but the model has",
         "set max_seq_length to", setup=lambda tmp, ctx: st_folder(json_file(  # (defined below)
             "sentence_bert_config.json", {"max_seq_length": 100000, "do_lower_case": False}))(tmp, ctx)),
    case("export-out-not-empty", "export {run} hf:{tmp}", 1, "not empty", "new output folder",
         setup=files(x="x")),
    case("export-not-hf-expressible", "export {preln} hf:{tmp}/out", 1, "model.norm='pre'",
         "Hugging Face"),
    case("export-not-bert", "export {lm} hf:{tmp}/out", 1, "model.name='decoder_lm'", "exportable"),
    case("export-missing-source", "export {tmp}/nope hf:{tmp}/out", 1, "nope", "checkpoints/"),
    case("export-no-prefix", "export {run} {tmp}/out", 2, "hf:"),
    case("export-step-text", "export {run} hf:{tmp}/out --step best", 2, "--step='best'"),
]

FEATURES_CASES = [
    case("features-missing-input", FEATURES, 1, "in.txt", "--input"),
    case("features-empty-input", FEATURES, 1, "in.txt", "empty", setup=features_input("")),
    case("features-blank-input", FEATURES, 1, "in.txt", "empty", setup=features_input("\n\n")),
    case("features-non-utf8", FEATURES, 1, "in.txt:2", "UTF-8", setup=features_input(b"ok\nbad \xff\n")),
    case("features-layer-too-high", FEATURES.replace("--layers=-1", "--layers=5"),
         1, "--layers", "5", setup=features_input()),
    case("features-layer-too-low", FEATURES.replace("--layers=-1", "--layers=-1,-9"),
         1, "--layers", "-9", setup=features_input()),
    case("features-layers-text", FEATURES.replace("--layers=-1", "--layers=last"),
         2, "--layers='last'", setup=features_input()),
    case("features-seq-over-position-table", FEATURES + " --max_seq_length=1024", 1,
         "--max_seq_length=1024", "512", setup=features_input()),
    case("features-seq-too-short", FEATURES + " --max_seq_length=2", 1, "--max_seq_length=2",
         setup=features_input()),
    case("features-batch-zero", FEATURES + " --batch_size=0", 1, "--batch_size=0", setup=features_input()),
    case("features-missing-checkpoint", FEATURES.replace("{ckpt}", "{tmp}/nope"), 1, "nope", "checkpoints/",
         setup=features_input()),
    case("features-no-tokenizer", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1, "ckpt", "vocab.txt",
         setup=lambda t, c: (copy_of("ckpt", remove("vocab.txt"), remove("tokenizer_config.json"))(t, c),
                             features_input()(t, c))),
    case("features-without-output", "features --checkpoint {ckpt} --input {tmp}/in.txt", 2, "--output",
         setup=features_input()),
    case("features-output-in-a-file", FEATURES.replace("{tmp}/out.jsonl", "{tmp}/f/out.jsonl"), 1,
         "--output={tmp}/f/out.jsonl", "choose another",
         setup=lambda t, c: (features_input()(t, c), files(f="x")(t, c))),
    case("features-two-separators", FEATURES, 1, "{tmp}/in.txt:2: ' ||| ' 2 times", "fix that line",
         setup=features_input("the cat\na ||| b ||| c\n")),
    # the default --layers (never given) beyond a 1-layer model: the default is named, not blamed
    case("features-checkpoint-a-hugging-face-folder", FEATURES.replace("{ckpt}", "{hf}"), 1,
         "--checkpoint={hf} is a Hugging Face model folder", "convert it first: bert-jax convert "
         "hf:{hf} <dir>", setup=features_input()),
    case("features-default-layers-beyond-model", FEATURES.replace(" --layers=-1", ""), 1,
         "--layers is not given and its default -1,-2,-3,-4 asks for 4 layers", "has 1",
         "give --layers (use -1..0", setup=features_input()),
    # a list flag's item given twice or empty (options.list_items): one rule for every list flag
    case("features-layers-repeated", FEATURES.replace("--layers=-1", "--layers=-1,-1"), 2,
         "--layers='-1,-1': -1 is named twice", setup=features_input()),
    case("features-layers-empty-item", FEATURES.replace("--layers=-1", "--layers=-1,"), 2,
         "--layers='-1,': an empty item", setup=features_input()),
    case("features-layers-one-layer-twice", FEATURES.replace("--layers=-1", "--layers=-1,0"), 1,
         "--layers: -1 and 0 are the same layer of a 1-layer model", setup=features_input()),
    case("plot-workdir-repeated", "plot --workdir {run},{run}/ --out {tmp}/p.png", 2,
         "--workdir=", "is named twice (again as {run}/)"),
]

class _Evil:
    """A pickled object that runs a shell command when unpickled (a malicious checkpoint)."""

    def __reduce__(self):
        return os.system, ("touch pwned",)


def evil_torch_bin() -> bytes:
    """A torch.save-style zip whose data.pkl runs code when loaded by a plain unpickler."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"w": _Evil()}, protocol=2))
        zf.writestr("archive/version", "3\n")
    return buffer.getvalue()


def translation_checkpoint(tmp: Path, ctx: dict) -> None:
    small = dict(vocab_size=64, emb_dim=16, num_layers=1, num_decoder_layers=1, num_heads=2,
                 head_dim=8, mlp_dim=32)
    cfg = {"name": "transformer", **small}
    save_model(tmp / "mt", models.create_model(cfg), {"model": cfg})
    tokenizer_lib.copy_tokenizer(ctx["vocab"], tmp / "mt")
    features_input()(tmp, ctx)


TF_WITHOUT_INDEX = files(tf__bert_config_DOT_json="{}", tf__vocab_DOT_txt="[PAD]\n",
                         **{"tf__bert_model_DOT_ckpt_DOT_data-00000-of-00001": b"\x00" * 8})

EXPORT_CASES = [
    case("features-output-exists", FEATURES, 1, "--output={tmp}/out.jsonl", "already exists",
         "new --output", setup=files(in_DOT_txt="the cat sat\n", out_DOT_jsonl="earlier\n")),
    case("features-output-is-a-folder", FEATURES, 1, "--output={tmp}/out.jsonl is a directory, not a file",
         setup=files(in_DOT_txt="the cat sat\n", out_DOT_jsonl__x="x")),
    case("features-translation-checkpoint", FEATURES.replace("{ckpt}", "{tmp}/mt"), 1,
         "--checkpoint={tmp}/mt", "'transformer'", "encoder-decoder", "BERT encoder checkpoint",
         setup=translation_checkpoint),
    case("features-lm-checkpoint", FEATURES.replace("{ckpt}", "{lm}"), 1, "'decoder_lm'",
         "BERT encoder checkpoint", setup=features_input()),
    case("convert-tf-prefix-without-index", "convert tf:{tmp}/tf/bert_model.ckpt {tmp}/out", 1,
         "{tmp}/tf/bert_model.ckpt.index: not found", "bert_model.ckpt.data-00000-of-00001",
         "bert_config.json", setup=TF_WITHOUT_INDEX),
    case("convert-tf-folder-without-index", "convert tf:{tmp}/tf {tmp}/out", 1, "<prefix>.index",
         "found bert_model.ckpt.data-00000-of-00001", "copy its .index", setup=TF_WITHOUT_INDEX),
    case("convert-malicious-pickle", "convert hf:{tmp}/hf {tmp}/out", 1, "pytorch_model.bin",
         "forbidden global", "model.safetensors",
         setup=copy_of("hf", remove("model.safetensors"), replace("pytorch_model.bin", evil_torch_bin()))),
]

EVAL_CASES = [
    case("eval-split-on-pretraining", "eval --workdir {run} --split test", 1, "--split", "pretraining",
         "leave out --split"),
    case("eval-split-file-missing", "eval --workdir {ft} --split {tmp}/nope.tsv", 1, "nope.tsv"),
    case("eval-split-test-missing", "eval --workdir {ft} --split test", 1, "SST-2/test.tsv"),
    case("eval-split-malformed", "eval --workdir {ft} --split {tmp}/bad.tsv", 1, "bad.tsv:2",
         setup=files(bad_DOT_tsv="sentence\tlabel\nx\t9\n")),
    case("eval-split-non-utf8", "eval --workdir {ft} --split {tmp}/bad.tsv", 1, "bad.tsv:2", "UTF-8",
         setup=files(bad_DOT_tsv=b"sentence\tlabel\n\xe9t\xe9\t1\n")),
    case("eval-data-dir-gone", "eval --workdir {ft} --config configs/glue.py:sst2,tiny "
         "--config.data.data_dir={tmp}/gone --config.data.tokenizer={vocab}", 1, "gone"),
    case("eval-without-workdir", "eval", 2, "--workdir"),
    case("eval-unknown-override", "eval --workdir {run} --config configs/bert_pretrain.py:tiny "
         "--config.data.max_seq_len=8", 2, "data.max_seq_len", "max_seq_length"),
    # a path that is there but of another kind than the one read (paths.path_kind): said as
    # what it is, with the way to the kind needed, not "not found" or "no checkpoints/ folder"
    case("eval-workdir-a-step-folder", "eval --workdir {run}/checkpoints/2", 1,
         "--workdir={run}/checkpoints/2 is the folder of step 2 of a run, not a training run's folder",
         "give its run folder {run} with --step 2"),
    case("plot-workdir-a-sweep-folder", "plot --workdir {tmp}/sw --out {tmp}/p.png", 1,
         "--workdir={tmp}/sw is a sweep's folder (1 trial), not a training run's folder",
         "give one of its trials' folders, e.g. {tmp}/sw/lr1",
         setup=files(sw__lr1__trial_config_DOT_json="{}")),
    case("embed-checkpoint-a-sentence-transformers-folder", "embed --checkpoint {tmp}/st --input "
         "{tmp}/in.txt --output {tmp}/v.npy", 1, "--checkpoint={tmp}/st is a sentence-transformers "
         "folder, not a checkpoint", "convert it first: bert-jax convert st:{tmp}/st <dir>",
         setup=lambda t, c: st_folder()(t, c)),
    case("init-from-a-hugging-face-folder", PRETRAIN + " --config.init_from={hf}", 1,
         "{hf} is a Hugging Face model folder, not a checkpoint", "bert-jax convert hf:{hf} <dir>"),
    case("eval-embeddings-beir-a-qrels-file", "eval-embeddings --bm25 --beir {tmp}/beir/qrels/test.tsv",
         1, "--beir={tmp}/beir/qrels/test.tsv is a BEIR qrels file, not a BEIR folder",
         "give the BEIR folder {tmp}/beir with --split test", setup=lambda t, c: BEIR_FILES(t, c)),
    case("config-a-folder", "eval --workdir {run} --config configs", 2,
         "--config=configs is a folder, not a config file"),
]

SWEEP_CASES = [
    case("sweep-non-sweep-config", "sweep --config configs/glue.py:mrpc --workdir {tmp}/s", 1,
         "configs/glue.py:mrpc", "configs/sweeps"),
    case("sweep-non-sweep-print", "sweep --config configs/bert_pretrain.py:tiny --workdir {tmp}/s "
         "--print_commands", 1, "configs/bert_pretrain.py:tiny", "grid"),
    case("sweep-grid-key-missing", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1, "optimizer.lr",
         "learning_rate", setup=sweep_file("configs/glue.py:sst2,tiny", {"optimizer.lr": (1e-5, 2e-5)})),
    case("sweep-grid-value-type", "sweep --config {tmp}/sw.py --workdir {tmp}/s --print_commands", 1,
         "train.batch_size", "int", setup=sweep_file("configs/glue.py:sst2,tiny",
                                                     {"train.batch_size": ("big",)})),
    case("sweep-grid-empty-values", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1, "grid.train.epochs",
         "non-empty", setup=sweep_file("configs/glue.py:sst2,tiny", {"train.epochs": ()})),
    case("sweep-base-missing", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1, "nope.py",
         setup=sweep_file("nope.py:x", {})),
    case("sweep-base-variant", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1, "mrcp",
         setup=sweep_file("configs/glue.py:mrcp", {})),
    case("sweep-grid-override", "sweep --config configs/sweeps/glue.py:mrpc --workdir {tmp}/s "
         "--config.grid.optimizer.learning_rate=\"('fast',)\"", 1, "optimizer.learning_rate", "float"),
    case("sweep-override-key-missing", "sweep --config configs/sweeps/glue.py:mrpc --workdir {tmp}/s "
         "--config.overrides=\"('data.dir=/x',)\"", 1, "data.dir", "data_dir"),
    case("sweep-override-no-equals", "sweep --config configs/sweeps/glue.py:mrpc --workdir {tmp}/s "
         "--config.overrides=\"('init_from',)\"", 1, "init_from", "key=value"),
    case("sweep-remote-workdir", "sweep --config configs/sweeps/glue.py:mrpc --workdir gs://b/s", 1,
         "gs://b/s", "--print_commands"),
    case("sweep-without-workdir", "sweep --config configs/sweeps/glue.py:mrpc", 2, "--workdir"),
    # every trial checked as train checks it before any is printed or started
    case("sweep-print-trial-train-refuses", "sweep --config configs/sweeps/glue.py:mrpc,tiny "
         "--workdir {tmp}/s --print_commands --config.grid.optimizer.learning_rate=\"(2e-5, -1.0)\"", 1,
         "trial learning_rate=-1_seed=0", "optimizer.learning_rate=-1.0 must be > 0"),
    case("sweep-print-seed-negative", "sweep --config configs/sweeps/glue.py:mrpc,tiny --workdir {tmp}/s "
         "--print_commands --config.grid.seed=\"(0, -1)\"", 1, "_seed=-1", "seed=-1",
         "a whole number in [0, 2**31)"),
    # a trial's key set where the sweep cannot use it: the message names the grid flag
    case("sweep-seed-in-overrides", "sweep --config configs/sweeps/glue.py:mrpc,tiny --workdir {tmp}/s "
         "--print_commands --config.overrides=\"('seed=3',)\"", 1, "overrides sets seed=3",
         "--config.grid.seed='(3,)'"),
    case("sweep-seed-flag", "sweep --config configs/sweeps/glue.py:mrpc,tiny --workdir {tmp}/s "
         "--config.seed=3", 2, "unknown config key 'seed'", "--config.grid.seed='(3,)'"),
    # (the first trial is good: refused before it runs, else this would train it)
    # a typo in a grid key names its wrong part; a run key the grid lacks gets the overrides flag
    case("sweep-grid-key-typo", "sweep --config configs/sweeps/glue.py:mrpc,tiny --workdir {tmp}/s "
         "--print_commands --config.grid.optimizer.learnin_rate=\"(1e-3,)\"", 2,
         "'learnin_rate' is not a part of any grid key under 'optimizer'", "a copy of the sweep file"),
    case("sweep-run-key-flag", "sweep --config configs/sweeps/glue.py:mrpc,tiny --workdir {tmp}/s "
         "--print_commands --config.train.steps=3", 2, "unknown config key 'train.steps'",
         "--config.overrides='(\"train.steps=3\",)'"),
    # the sweep's own argument is wrong, not a trial
    case("sweep-argument-typo", "sweep --config configs/sweeps/glue.py:mrpcx --workdir {tmp}/s "
         "--print_commands", 1, "its argument 'mrpcx'", "unknown GLUE task 'mrpcx'",
         "check the sweep's --config argument"),
    case("sweep-start-trial-train-refuses", "sweep --config configs/sweeps/glue.py:mrpc,tiny "
         "--workdir {tmp}/s --config.grid.optimizer.learning_rate=\"(2e-5, -1.0)\"", 1,
         "trial learning_rate=-1_seed=0", "optimizer.learning_rate=-1.0 must be > 0"),
]

VOCAB_TEXT = "vocab --input {tmp}/corpus/a.txt --out {tmp}/v --size 50"
PREPARE_TEXT = ("prepare --config configs/bert_pretrain.py:tiny --out {tmp}/shards "
                "--config.data.tokenizer={vocab} --config.data.train_files={tmp}/corpus/a.txt")
NOT_UTF8 = b"the cat sat on the mat\nthe dog\nbad \xff here\n" + CORPUS.encode() * 3

VOCAB_CASES = [
    # `bert-jax vocab`: an existing vocab is never overwritten (the shared one is in the snapshot)
    case("vocab-out-existing-vocab", "vocab --input {tmp}/corpus/a.txt --out {vocab} --size 50", 1,
         "--out {vocab} already holds a vocab", "vocab.txt", "another --out", "remove", setup=corpus()),
    case("vocab-out-existing-spm", "vocab --input {tmp}/corpus/a.txt --out {tmp}/sp --size 50", 1,
         "{tmp}/sp already holds a vocab", "spm.model", setup=files(corpus__a_DOT_txt=CORPUS * 3,
                                                                     sp__spm_DOT_model=b"\x00")),
    # text that is not UTF-8 is refused as every other reader's (data/text.py not_text), naming
    # the line, its byte and what the file looks like instead (a stray byte on at most 1% of the
    # lines is replaced with a warning: tests/unit/data/test_text_files.py)
    case("vocab-input-non-utf8", VOCAB_TEXT, 1,
         "corpus/a.txt:3: not UTF-8: found byte 0xff at column 5", "iconv -f cp1252",
         "(1 of its 21 lines are not UTF-8)", setup=corpus(NOT_UTF8)),
    case("vocab-input-non-utf8-sentencepiece", "vocab --input {tmp}/corpus/a.txt.gz --out {tmp}/v "
         "--size 50 --type sentencepiece", 1, "a.txt.gz:3: not UTF-8: found byte 0xff",
         setup=files(corpus__a_DOT_txt_DOT_gz=gzip.compress(NOT_UTF8))),
    case("vocab-input-utf16", VOCAB_TEXT, 1,
         "corpus/a.txt:1: UTF-16 text", "iconv -f utf-16 -t utf-8",
         setup=corpus((CORPUS * 3).encode("utf-16"))),
    case("prepare-input-utf16", PREPARE_TEXT, 1,
         "corpus/a.txt:1: UTF-16 text", "iconv -f utf-16 -t utf-8",
         setup=corpus((CORPUS * 3).encode("utf-16-le"))),
    # every command that reads text refuses what vocab refuses, naming the encoding it sees
    case("prepare-input-non-utf8", PREPARE_TEXT, 1,
         "corpus/a.txt:3: not UTF-8: found byte 0xff at column 5", "iconv -f cp1252",
         setup=corpus(NOT_UTF8)),
    case("vocab-input-utf32", VOCAB_TEXT, 1,
         "corpus/a.txt:1: UTF-32 text", "iconv -f utf-32 -t utf-8",
         setup=corpus((CORPUS * 3).encode("utf-32"))),
    case("prepare-input-utf32-no-mark", PREPARE_TEXT, 1,
         "corpus/a.txt:1: UTF-32 text", "iconv -f utf-32 -t utf-8",
         setup=corpus((CORPUS * 3).encode("utf-32-le"))),
    case("prepare-input-shift-jis", PREPARE_TEXT, 1, "corpus/a.txt:1: not UTF-8",
         "it decodes as shift_jis", "iconv -f <it> -t utf-8",
         setup=corpus("これは日本語のテキストです。\n東京は大きい都市です。\n".encode("shift_jis") * 20)),
    case("vocab-input-cyrillic-8-bit", VOCAB_TEXT, 1, "corpus/a.txt:1: not UTF-8",
         "an 8-bit encoding of another alphabet: Cyrillic `iconv -f cp1251 -t utf-8`",
         setup=corpus("Это русский текст.\nМосква большой город.\n".encode("cp1251") * 20)),
    case("vocab-input-empty", VOCAB_TEXT, 1,
         "--input={tmp}/corpus/a.txt: no text to train on (empty, or blank lines only)", setup=corpus("")),
    case("vocab-input-blank-lines", VOCAB_TEXT + " --type sentencepiece", 1,
         "--input={tmp}/corpus/a.txt: no text to train on", setup=corpus("\n  \n\t\n")),
    case("vocab-size-zero", VOCAB_TEXT.replace("--size 50", "--size 0"), 1,
         "--size=0 leaves no room beside the special tokens", "use at least 6", setup=corpus()),
    case("prepare-input-binary", PREPARE_TEXT, 1,
         "corpus/a.txt:1: a NUL byte: a binary file, not text",
         setup=corpus(bytes(range(256)) * 4)),
]

TRANSLATE = "translate --checkpoint {mt} --input {tmp}/src.txt --output {tmp}/out.txt"


def translate_input(text: str | bytes = "the cat sat\nhello world\n", **more: str):
    return files(src_DOT_txt=text, **more)


TRANSLATE_CASES = [
    case("translate-alpha-nan", TRANSLATE + " --alpha nan", 1, "--alpha=nan", ">= 0",
         setup=translate_input()),
    case("translate-alpha-negative", TRANSLATE + " --alpha=-0.6", 1, "--alpha=-0.6", ">= 0",
         setup=translate_input()),
    case("translate-beam-zero", TRANSLATE + " --beam 0", 1, "--beam=0", ">= 1", setup=translate_input()),
    case("translate-beam-negative", TRANSLATE + " --beam=-2", 1, "--beam=-2", ">= 1",
         setup=translate_input()),
    case("translate-batch-zero", TRANSLATE + " --batch_size 0", 1, "--batch_size=0", ">= 1",
         setup=translate_input()),
    case("translate-output-is-a-directory", TRANSLATE.replace("{tmp}/out.txt", "{tmp}/d"), 1,
         "--output={tmp}/d", "directory", setup=translate_input(d__x="x")),
    case("translate-output-in-a-file", TRANSLATE.replace("{tmp}/out.txt", "{tmp}/f/out.txt"), 1,
         "--output={tmp}/f/out.txt", "choose another", setup=translate_input(f="x")),
    case("translate-output-exists", TRANSLATE, 1, "{tmp}/out.txt exists", "--output",
         setup=translate_input(out_DOT_txt="earlier translations\n")),
    case("translate-empty-input", TRANSLATE, 1, "--input={tmp}/src.txt", "empty", setup=translate_input("")),
    case("translate-missing-input", TRANSLATE, 1, "--input={tmp}/src.txt"),
    # a bare encoder (no objective of its own) is no encoder-decoder either
    case("translate-bare-encoder", TRANSLATE.replace("{mt}", "{preln}"), 1,
         "--checkpoint={preln} holds a model.name='bert' model; translate needs an encoder-decoder",
         setup=translate_input()),
]

# eval given another task's config or files
EVAL_TASK_CASES = [
    case("eval-other-task-config", "eval --workdir {ft} --config configs/glue.py:cola,tiny "
         "--config.data.data_dir={glue} --config.data.tokenizer={vocab}", 1, "glue cola", "glue sst2",
         "leave out --config"),
    case("eval-split-squad-file-on-glue", "eval --workdir {ft} --split {tmp}/dev-v1.1.json", 1,
         "--split={tmp}/dev-v1.1.json", "SQuAD JSON", "glue sst2 run",
         setup=files(**{"dev-v1_DOT_1_DOT_json": squad_json()})),
]

def finished_trial(trial: str, items: list[str], *changes: str):
    """A setup: <tmp>/s/<trial>, a trial that finished (its summary) with the run config of
    `items` over the sweep's base and then `changes` ("key=value"), as the sweep recorded it."""
    def setup(tmp: Path, ctx: dict) -> None:
        base = str(REPO / "configs/glue.py:sst2,tiny")
        ran = config_lib.load(base, [*items, *changes])
        write(tmp / "s" / trial / "summary.json", json.dumps({"step": 2, "steps": 2, "preempted": False}))
        write(tmp / "s" / trial / "trial_config.json", ran.to_json())
    return setup


def then(*setups):
    def setup(tmp: Path, ctx: dict) -> None:
        for s in setups:
            s(tmp, ctx)
    return setup


SWEEP_TRIAL_CASES = [
    case("sweep-trial-fails", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1, "1 of 1 trial(s) failed",
         "learning_rate=0.001_seed=0: ", "data.tokenizer",
         "(log: {tmp}/s/learning_rate=0.001_seed=0/train.log)", "fix the cause",
         setup=sweep_file("configs/glue.py:sst2,tiny", {"optimizer.learning_rate": (1e-3,)})),
    # a finished trial whose settings the sweep changed since (its overrides): not skipped with
    # its old numbers reported for the new settings, nor run again over them
    case("sweep-finished-trial-changed", "sweep --config {tmp}/sw.py --workdir {tmp}/s", 1,
         "trial {tmp}/s/learning_rate=0.001_seed=0 finished with other settings",
         "model.dropout_rate: 0.3 before, 0.1 now", "new --workdir",
         setup=then(sweep_file("configs/glue.py:sst2,tiny", {"optimizer.learning_rate": (1e-3,)}),
                    finished_trial("learning_rate=0.001_seed=0",
                                   ["optimizer.learning_rate=0.001", "seed=0"], "model.dropout_rate=0.3"))),
]

AVERAGE_CASES = [
    case("average-damaged-newest", "average --workdir {tmp}/run --last 2 --out {tmp}/avg", 1,
         "run/checkpoints/2", "restore the folder", "move it out of", setup=copy_of("run", corrupt_params)),
    case("average-damaged-older", "average --workdir {tmp}/run --last 2 --out {tmp}/avg", 1,
         "run/checkpoints/1", "--last 1", setup=copy_of("run", corrupt_params_of(1))),
    # one checkpoint counted twice: a step folder linked to another
    case("average-step-linked-to-another", "average --workdir {tmp}/run --last 3 --out {tmp}/avg", 1,
         "run/checkpoints: steps 2 and 3 are the same folder", "remove the link",
         setup=copy_of("run", lambda d: (d / "checkpoints" / "3").symlink_to(d / "checkpoints" / "2"))),
]

LAUNCH = ("launch --config configs/bert_pretrain.py:tiny --topology v4-8 --workdir gs://b/run "
          "--name bert-tiny --zone us-central2-b --repo https://example.org/bert_jax.git --dry_run")
WMT = ("train --config configs/wmt.py:base --workdir {tmp}/w --config.data.tokenizer={vocab} "
       "--config.data.tfds_data_dir={tmp}/tfds")

# Values that once trained or ran (exit 0), or failed deep inside a library: run values,
# TFDS datasets, metrics files, info's and prepare's flags.
RUN_VALUE_CASES = [
    case("train-workdir-empty", PRETRAIN.replace("{tmp}/w", "''"), 2, "--workdir is empty"),
    case("compilation-cache-off-in-capitals", PRETRAIN + " --compilation_cache=OFF", 2,
         "--compilation_cache='OFF' reads as a switch, not a folder", "./OFF"),
    case("attention-checkpoint-without-tokenizer", "attention --checkpoint {preln} --text 'the cat' "
         "--out {tmp}/a.png", 1, "no tokenizer in {preln}: looked for vocab.txt"),
    case("workdir-inside-a-file", PRETRAIN.replace("{tmp}/w", "{tmp}/f/run"), 1, "inside {tmp}/f, a file",
         setup=files(f="a file")),
    case("masked-lm-prob-above-one", PRETRAIN + " --config.data.masked_lm_prob=1.5", 1,
         "data.masked_lm_prob=1.5", "(0, 1]"),
    case("masked-lm-prob-zero", PRETRAIN + " --config.data.masked_lm_prob=0.0", 1, "data.masked_lm_prob=0.0"),
    case("pretrain-seq-too-short", PRETRAIN.replace("max_seq_length=16", "max_seq_length=4"), 1,
         "data.max_seq_length=4", "at least 5"),
    case("pretrain-phase-too-short", PRETRAIN + " --config.data.phases=\"((0, 16, 3), (1, 4, 1))\"", 1,
         "data.phases length 4", "at least 5"),
    # more predictions than a row has tokens (too few is refused above)
    case("pretrain-predictions-over-length", PRETRAIN.replace("max_predictions_per_seq=3",
         "max_predictions_per_seq=17"), 1, "data.max_predictions_per_seq=17 is more than the 16 "
         "tokens of a row (data.max_seq_length=16)", "<= 16"),
    case("pretrain-phase-predictions-over-length", PRETRAIN + " --config.data.phases=\"((0, 16, 3), "
         "(1, 8, 9))\"", 1, "data.phases[1] predictions=9 is more than the 8 tokens of a row "
         "(data.phases[1] length=8)"),
    case("pack-instances-zero", PRETRAIN + " --config.data.pack=True "
         "--config.data.max_instances_per_row=0", 1, "data.max_instances_per_row=0", ">= 1"),
    case("pack-instances-negative", PRETRAIN + " --config.data.pack=True "
         "--config.data.max_instances_per_row=-1", 1, "data.max_instances_per_row=-1"),
    case("glue-num-labels", GLUE + " --config.model.num_labels=3", 1, "model.num_labels=3", "sst2",
         "--config.model.num_labels=2", setup=glue()),
    case("stsb-num-labels", STSB + " --config.model.num_labels=2", 1, "model.num_labels=2", "regression",
         "--config.model.num_labels=1"),
    # a file named twice (after glob expansion) would be read twice
    case("train-files-repeated", TEXT.replace("{tmp}/corpus/*.txt", "{tmp}/corpus/a.txt,{tmp}/corpus/*.txt"),
         1, "data.train_files=", "{tmp}/corpus/a.txt is named twice", "list each file once",
         setup=corpus()),
    case("pair-train-file-repeated", "train --config configs/embeddings.py:contrastive,tiny" + FINETUNE
         + " --config.data.train_file=p.jsonl,./p.jsonl", 1, "data.train_file='p.jsonl,./p.jsonl'",
         "{tmp}/data/p.jsonl is named twice: it would be read twice",
         setup=files(data__p_DOT_jsonl='{"query": "a cat", "positive": "the cat"}\n')),
    # a JSON line cut short: json's reason whole, with its column (not "Invalid control character")
    case("pair-file-line-cut-short", "train --config configs/embeddings.py:contrastive,tiny" + FINETUNE
         + " --config.data.train_file=p.jsonl --config.data.dev_file=p.jsonl", 1,
         "p.jsonl:2: line:", "expected a JSON object (Unterminated string starting at column 30)",
         setup=files(data__p_DOT_jsonl='{"query": "a cat", "positive": "the cat"}\n'
                     '{"query": "abc", "positive": "de\n')),
    # an input with no text on any line: refused as an empty one (not a vector per blank line)
    case("embed-input-all-blank", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output {tmp}/v.npy",
         1, "--input={tmp}/in.txt: empty, no line to embed (no text on any line)",
         setup=features_input("\n  \n\n")),
    # a path of another kind than the key reads (paths.path_kind), said as what it is
    case("pair-train-file-a-folder", "train --config configs/embeddings.py:contrastive,tiny" + FINETUNE
         + " --config.data.train_file={tmp}/data --config.data.dev_file=p.jsonl", 1,
         "pairs train file {tmp}/data is a folder, not a file",
         setup=files(data__p_DOT_jsonl='{"query": "a cat", "positive": "the cat"}\n')),
    case("pair-data-dir-a-file", "train --config configs/embeddings.py:contrastive,tiny" + FINETUNE
         + " --config.data.train_file=p.jsonl --config.data.dev_file=p.jsonl", 1,
         "data.data_dir={tmp}/data is a file, not a folder; give the folder that holds the train file",
         setup=files(data='{"query": "a cat", "positive": "the cat"}\n')),
    case("tokenizer-a-vocab-file", GLUE.replace("tokenizer={vocab}", "tokenizer={vocab}/vocab.txt"), 1,
         "{vocab}/vocab.txt is a tokenizer file, not a tokenizer's folder; give its folder {vocab}",
         setup=glue()),
]

TFDS_CASES = [
    case("wmt-tfds-not-prepared", WMT, 1, "wmt14_translate/de-en", "not prepared under {tmp}/tfds",
         "tfds build", "--config.data.tfds_data_dir"),
    case("tfds-unknown-dataset", PRETRAIN.replace("data.name=synthetic", "data.name=tfds")
         + " --config.data.tfds_name=no_such_corpus --config.data.tfds_data_dir={tmp}/tfds "
         "--config.data.tokenizer={vocab}", 1,
         "data.tfds_name='no_such_corpus'", "no dataset of that name"),
]

PLOT_CASES = [
    # the data file beside --out: the same plot's (drawn in another format) is shared; one
    # holding other rows (another run's, the same run's at an earlier step) is never replaced
    case("plot-data-file-of-another-run", "plot --workdir {tmp}/r --out {tmp}/m.svg", 1,
         "--out={tmp}/m.svg: {tmp}/m.csv already exists and holds other data than plot would "
         "write there", "choose a new --out",
         setup=files(r__metrics_DOT_jsonl='{"step": 1, "loss": 2.0}\n',
                     m_DOT_csv="run,series,step,x,value,smoothed\nother,loss,1,1.0,3.0,3.0\n")),
    case("plot-metrics-line-a-list", "plot --workdir {tmp}/r", 1, "r/metrics.jsonl:2", "JSON object",
         setup=files(r__metrics_DOT_jsonl='{"step": 1, "loss": 2.0}\n[1, 2]\n')),
    case("plot-metrics-line-no-step", "plot --workdir {tmp}/r", 1, "r/metrics.jsonl:1", "step",
         setup=files(r__metrics_DOT_jsonl='{"loss": 2.0}\n')),
    # a metric's value that is no number (retrieval's, edited by hand): named, not a float() error
    case("plot-metrics-value-a-word", "plot --workdir {tmp}/r", 1,
         "r/metrics.jsonl:2: 'eval/ndcg@10' is \"high\", not a number",
         setup=files(r__metrics_DOT_jsonl='{"step": 1, "loss": 2.0}\n{"step": 1, "eval/ndcg@10": "high"}\n')),
    case("plot-metrics-value-a-list", "plot --workdir {tmp}/r", 1,
         "r/metrics.jsonl:1: 'eval/recall@10' is [1, 2], not a number",
         setup=files(r__metrics_DOT_jsonl='{"step": 1, "eval/recall@10": [1, 2]}\n')),
]

FLAG_CASES = [  # a flag of bert_jax that the command does not read (it would do nothing)
    case("plot-output-is-not-its-flag", "plot --workdir {run} --output {tmp}/p.png", 2,
         "--output is not a flag of `plot`", "--out"),
    case("info-workdir-is-not-its-flag", INFO + " --workdir {tmp}/w", 2,
         "--workdir is not a flag of `info`"),
    # ... nor one it reads only with other flags, given without them
    case("eval-embeddings-split-without-beir", "eval-embeddings --checkpoint {ckpt} --sts {tmp}/s.tsv "
         "--split dev", 2, "--split: `eval-embeddings` reads it only with --beir", "drop it"),
    case("eval-embeddings-bm25-on-sts", "eval-embeddings --checkpoint {ckpt} --sts {tmp}/s.tsv --bm25",
         2, "--bm25: `eval-embeddings` reads it only with --beir or --squad"),
    case("eval-embeddings-pooling-for-bm25", "eval-embeddings --bm25 --squad {tmp}/sq.json "
         "--pooling max", 2, "--pooling: `eval-embeddings` reads it only with --checkpoint"),
    case("embed-shard-size-into-a-npy", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/v.npy --shard_size 5", 2, "--shard_size: `embed` reads it only with a folder as --output"),
    # ... nor one given twice (absl keeps the last): every form, with the list form where one is read
    case("plot-workdir-twice", "plot --workdir {run} --workdir={ft} --out {tmp}/p.png", 2,
         "--workdir is given 2 times", "give it once", "--workdir A,B, for plot"),
    case("launch-spot-and-nospot", LAUNCH + " --spot --nospot", 2, "--spot is given 2 times",
         "give it once"),
    case("info-seq-len-twice", INFO + " --seq_len 16 --seq_len=32", 2, "--seq_len is given 2 times"),
]
INFO_CASES = [
    case("info-seq-len-zero", INFO + " --seq_len 0", 2, "--seq_len=0", "leave it out"),
    case("info-seq-len-negative", INFO + " --seq_len=-3", 2, "--seq_len=-3"),
    # the value checks of train and plan (info prints a model that no run would train)
    case("info-learning-rate-nan", INFO + " --config.optimizer.learning_rate=nan", 1,
         "optimizer.learning_rate=nan: a finite number is needed"),
    # the config checks of train and plan (setup.check), but the platform's and the devices'
    case("info-objective-unknown", "info --config configs/embeddings.py:hinge,tiny", 1,
         "train.objective='hinge'", "choose one of"),
    case("info-data-mix-unknown", "info --config configs/embeddings.py:cosent,tiny "
         "--config.data.mix=random", 1, "data.mix='random'", "'round_robin'"),
    case("info-stage-not-a-dict", "info --config configs/modernbert.py:tiny --config.schedule.stages="
         "'(\"a\",)' --config.schedule.name=warmup_linear --config.schedule.warmup_steps=10 "
         "--config.schedule.decay_fraction=0.0", 1, "schedule.stages[0]='a'", "each stage is a dict"),
    case("info-optimizer-unknown", INFO + " --config.optimizer.name=adamx", 1,
         "optimizer.name='adamx'", "choose one of"),
    case("info-rope-context-below-rows", "info --config configs/modernbert.py:tiny "
         "--config.model.max_len=64", 1, "data.max_seq_length=128", "model.max_len=64",
         "use at most 64"),
]

PREPARE_CASES = [
    case("prepare-finetune-config", "prepare --config configs/glue.py:sst2,tiny --out {tmp}/shards", 1,
         "pretraining corpus", "configs/bert_pretrain.py", "bert-jax train"),
    case("prepare-synthetic", "prepare --config configs/bert_pretrain.py:tiny --config.data.name=synthetic "
         "--out {tmp}/shards", 1, "data.name='synthetic'", "data.name=text"),
    case("prepare-too-small-for-validation", "prepare --config configs/bert_pretrain.py:tiny --out "
         "{tmp}/shards --config.data.tokenizer={vocab} --config.data.train_files={tmp}/corpus/a.txt "
         "--config.data.heldout_every=100", 1, "data.heldout_every=100", "none held out for validation",
         "nothing written", setup=corpus()),
]

LAUNCH_DATA = LAUNCH + " --config.data.tokenizer=gs://b/vocab --config.data.train_files=gs://b/t/*.txt"

# `bert-jax launch` flags checked before git, the plan or gcloud (a dry run included).
LAUNCH_CASES = [
    case("launch-name-uppercase", LAUNCH.replace("bert-tiny", "Bad_Name!"), 1, "--name='Bad_Name!'",
         "lowercase letters"),
    case("launch-name-too-long", LAUNCH.replace("bert-tiny", "b" * 64), 1, "1-63"),
    case("launch-runtime-version-malformed", LAUNCH + " --runtime_version 'no such image!'", 1,
         "--runtime_version='no such image!'", "lowercase letters, digits, dots and hyphens",
         "gcloud compute tpus versions list"),
    case("launch-name-ends-with-hyphen", LAUNCH.replace("bert-tiny", "bert-"), 1, "--name='bert-'"),
    case("launch-zone-unknown", LAUNCH.replace("us-central2-b", "mars-north1-a"), 1,
         "--zone=mars-north1-a", "v4 zones: us-central2-b"),
    case("launch-zone-of-another-generation", LAUNCH.replace("us-central2-b", "europe-west4-a"), 1,
         "--zone=europe-west4-a", "no v4 TPUs", "us-central2-b"),
    # a model size init_from's checkpoint decides, set to another value: training would refuse it
    # only when loading the weights, on the slice
    case("plan-size-init-from-decides", "plan --config configs/glue.py:sst2,tiny --topology v5litepod-8 "
         "--config.init_from={run} --config.model.num_layers=3", 1, "--config.model.num_layers=3",
         "the init_from checkpoint in {run} decides model.num_layers (1)", "drop it"),
    case("launch-size-init-from-decides", LAUNCH.replace("bert_pretrain.py:tiny", "glue.py:sst2,tiny")
         + " --config.data.data_dir=gs://b/glue --config.init_from=tests/fixtures/bert_tiny_a208b4f "
         "--config.model.emb_dim=64 --config.model.head_dim=32 --skip_plan", 1, "--config.model.emb_dim=64",
         "decides model.emb_dim (32)"),
    # --skip_plan compiles nothing, but train's checks still run before anything is rented
    # train's refusal of a pretraining config naming no tokenizer or no training files
    case("launch-pretraining-without-tokenizer", LAUNCH, 1, "data.tokenizer is empty",
         "--config.data.tokenizer="),
    case("launch-pretraining-without-train-files", LAUNCH + " --config.data.tokenizer=gs://b/vocab",
         1, "data.train_files='': no files given"),
    case("launch-skip-plan-tiles-without-splash", LAUNCH_DATA + " --skip_plan "
         "--config.model.attention_block_q=256", 1, "--config.model.attention_block_q", "would do nothing"),
    case("launch-skip-plan-batch-not-divisible", LAUNCH_DATA + " --skip_plan --config.train.batch_size=6", 1,
         "train.batch_size/grad_accum_steps=6", "not divisible by the batch shards"),
    case("launch-max-restarts-negative", LAUNCH + " --max_restarts=-1", 1, "--max_restarts=-1", ">= 0"),
    case("launch-poll-seconds-zero", LAUNCH + " --poll_seconds 0", 1, "--poll_seconds=0.0", "> 0"),
    case("launch-poll-seconds-nan", LAUNCH + " --poll_seconds nan", 1, "--poll_seconds=nan"),
    # a gs:// URL without a bucket, refused as every path flag is (even in a dry run)
    case("launch-workdir-without-bucket", LAUNCH_DATA.replace("gs://b/run", "gs://"),
         2, "--workdir=gs://", "no bucket", "gs://BUCKET/path"),
]

ATTENTION_CASES = [
    # attention kernels and patterns (models/attention.py), refused before anything compiles
    case("attention-kernel-unknown", PRETRAIN + " --config.model.attention_kernel=flash", 1,
         "model.attention_kernel='flash'", "choose one of ['cudnn', 'splash', 'xla']"),
    case("splash-with-attention-dropout", PRETRAIN + " --config.model.attention_kernel=splash", 1,
         "model.attention_dropout_rate=0.1 with model.attention_kernel=splash",
         "set model.attention_dropout_rate=0"),
    case("splash-shorter-than-a-tile", PRETRAIN + " --config.model.attention_kernel=splash "
         "--config.model.attention_dropout_rate=0", 1, "min(model.attention_block_size=128, 16)",
         "multiples of 128"),
    case("splash-block-not-dividing", PRETRAIN.replace("max_seq_length=16", "max_seq_length=384")
         + " --config.model.attention_kernel=splash --config.model.attention_dropout_rate=0 "
           "--config.model.attention_block_size=256", 1, "min(model.attention_block_size=256, 384)"),
    case("attention-window-not-below-length", PRETRAIN + " --config.model.attention_window=16", 1,
         "model.attention_window=16", "sequence length 16", "model.attention_window=0"),
    # `bert-jax attention`: an empty --pair is refused as an empty --text is (not [SEP] [SEP])
    case("attention-checkpoint-a-step-folder", "attention --checkpoint {run}/checkpoints/2 --text "
         "'the cat' --out {tmp}/a.png", 1, "--checkpoint={run}/checkpoints/2 is the folder of step 2",
         "give its run folder {run} with --step 2"),
    case("attention-pair-empty", "attention --checkpoint {ckpt} --text 'the cat' --pair ' ' --out "
         "{tmp}/a.png", 1, "--pair is empty", "or leave --pair out"),
]
PATTERN_CASES = [
    # attention patterns (models/attention.py), refused before anything compiles
    case("attention-pattern-unknown", PRETRAIN + " --config.model.attention_pattern=longformer", 1,
         "model.attention_pattern='longformer'", "choose one of ('full', 'bigbird', 'linformer')"),
    case("bigbird-block-not-dividing", PRETRAIN + " --config.model.attention_pattern=bigbird "
         "--config.model.bigbird_block=5", 1, "model.bigbird_block=5",
         "does not divide the sequence length 16", "model.bigbird_block=4"),
    case("bigbird-block-longer-than-sequence", PRETRAIN + " --config.model.attention_pattern=bigbird "
         "--config.model.bigbird_block=32", 1, "model.bigbird_block=32", "model.bigbird_block=8"),
    case("bigbird-with-a-window", PRETRAIN + " --config.model.attention_pattern=bigbird "
         "--config.model.bigbird_block=4 --config.model.attention_window=4", 1,
         "model.attention_window=4 with model.attention_pattern=bigbird",
         "model.bigbird_window_blocks", "set model.attention_window=0"),
    case("global-layers-without-a-window", PRETRAIN + " --config.model.attention_global_every=3", 1,
         "model.attention_global_every=3", "model.attention_window > 0"),
    case("linformer-with-packing", PRETRAIN + " --config.model.attention_pattern=linformer "
         "--config.model.linformer_k=8 --config.data.pack=true", 1,
         "model.attention_pattern=linformer with data.pack=True", "set data.pack=False"),
    case("linformer-k-not-below-length", PRETRAIN + " --config.model.attention_pattern=linformer "
         "--config.model.linformer_k=16", 1, "model.linformer_k=16", "sequence length 16"),
    case("linformer-with-splash", PRETRAIN + " --config.model.attention_pattern=linformer "
         "--config.model.linformer_k=8 --config.model.attention_kernel=splash "
         "--config.model.attention_dropout_rate=0", 1,
         "model.attention_pattern=linformer runs with model.attention_kernel=xla"),
]

CUDNN = PRETRAIN + " --config.model.attention_kernel=cudnn --config.model.attention_dropout_rate=0 "
ATTENTION_GPU_CASES = [
    # the cudnn kernel (models/attention.py) on a machine without a GPU: the platform is named
    # first, whatever else cuDNN would refuse (its dropout, float32, packed rows, patterns:
    # tests/unit/models/test_cudnn.py), before anything compiles
    case("cudnn-on-cpu", CUDNN + "--config.dtype=bfloat16", 1,
         "model.attention_kernel=cudnn needs a GPU", "not cpu", "model.attention_kernel=xla"),
    case("cudnn-with-attention-dropout-on-cpu", PRETRAIN + " --config.model.attention_kernel=cudnn "
         "--config.dtype=bfloat16", 1, "model.attention_kernel=cudnn needs a GPU", "not cpu"),
    case("cudnn-in-float32-on-cpu", CUDNN, 1, "model.attention_kernel=cudnn needs a GPU", "not cpu"),
    case("cudnn-with-packed-rows-on-cpu", CUDNN + "--config.dtype=bfloat16 --config.data.pack=true", 1,
         "model.attention_kernel=cudnn needs a GPU", "not cpu"),
    case("cudnn-with-bigbird-on-cpu", CUDNN + "--config.dtype=bfloat16 "
         "--config.model.attention_pattern=bigbird --config.model.bigbird_block=4", 1,
         "model.attention_kernel=cudnn needs a GPU", "not cpu"),
    case("cudnn-bidirectional-window-on-cpu", CUDNN + "--config.dtype=bfloat16 "
         "--config.model.attention_window=4", 1, "model.attention_kernel=cudnn needs a GPU", "not cpu"),
    case("cudnn-with-attention-dropout-on-tpu", "plan --config configs/bert_pretrain.py:tiny "
         "--topology v5litepod-8 --config.model.attention_kernel=cudnn", 1,
         "model.attention_kernel=cudnn needs a GPU", "not tpu", "model.attention_kernel=xla (or splash)"),
]

OPTIM_CASES = [
    # the shared run (the tiny config: adamw, as a paper config's run saved before
    # adam_weight_decay became its default) resumed with adam_weight_decay: the flag that resumes it
    case("resume-adamw-run-with-adam-weight-decay", RESUME + " --config.optimizer.name=adam_weight_decay "
         "--config.train.steps=4", 1, "optimizer.name: 'adamw' in the checkpoint, 'adam_weight_decay' here",
         "pass --config.optimizer.name=adamw", "--workdir"),
    case("optimizer-name-misspelt", PRETRAIN + " --config.optimizer.name=adam_weightdecay", 1,
         "optimizer.name='adam_weightdecay'", "'adam_weight_decay'"),
]

WSD = PRETRAIN + " --config.schedule.name=wsd"
MODERN_OPTIM_CASES = [
    # ModernBERT's optimisation: wsd schedule, stable_adamw, batch size phases
    case("wsd-decay-longer-than-the-run", WSD + " --config.schedule.decay_steps=5", 1,
         "schedule.decay_steps=5", "train.steps=2", "at most 1 step(s)"),
    case("wsd-decay-shape-unknown", WSD + " --config.schedule.decay_shape=cosine", 1,
         "schedule.decay_shape='cosine'", "['1-sqrt', 'linear']"),
    case("wsd-final-fraction-above-one", WSD + " --config.schedule.final_fraction=1.5", 1,
         "schedule.final_fraction=1.5", "[0, 1]"),
    case("stable-adamw-eps-zero", PRETRAIN + " --config.optimizer.name=stable_adamw "
         "--config.optimizer.eps=0", 1, "optimizer.eps=0.0", "> 0"),
    case("phase-batch-not-a-multiple-of-the-microbatch", PRETRAIN
         + " --config.data.phases=\"((0, 16, 3, 4), (1, 16, 3))\"", 1,
         "data.phases[0] batch 4", "microbatch train.batch_size/grad_accum_steps=8",
         "use a multiple of 8"),
    case("stages-beside-a-schedule-key", PRETRAIN + " --config.schedule.stages=\"({{'start_step': "
         "0}}, {{'start_step': 2, 'name': 'wsd', 'decay_fraction': 1.0}})\" "
         "--config.schedule.warmup_steps=3", 1, "schedule.warmup_steps=3 with schedule.stages",
         "set them in the stages"),
    case("stage-out-of-order", PRETRAIN + " --config.schedule.warmup_steps=10 "
         "--config.schedule.stages=\"({{'start_step': 0}}, {{'start_step': 0}})\"", 1,
         "schedule.stages[1].start_step=0 is not after"),
    # a stage's warmup longer than the stage never reaches its peak (the next stage starts first)
    case("stage-warmup-longer-than-the-stage", PRETRAIN + " --config.schedule.warmup_steps=10 "
         "--config.schedule.stages=\"({{'start_step': 0, 'warmup_steps': 5}}, {{'start_step': 1}})\"",
         1, "schedule.stages[0].warmup_steps=5 exceeds the length of schedule.stages[0] (steps 0-1)",
         "start schedule.stages[1] later"),
    # the config file's own schedule keys beside stages: the flags that reset them are named
    case("stages-on-a-config-with-its-own-schedule", "train --config configs/modernbert.py:tiny "
         "--workdir {tmp}/w --config.schedule.stages=\"({{'start_step': 0}},)\"", 1,
         "schedule.name='wsd'", "reset these to their defaults: --config.schedule.name=warmup_linear "
         "--config.schedule.warmup_steps=10 --config.schedule.decay_fraction=0.0"),
]


def as_roberta_weights(folder: Path) -> None:
    """The folder's tensors under RoBERTa's encoder prefix (a BERT's under `roberta.` do not
    convert as a RoBERTa otherwise: convert refuses another family's tensor names)."""
    import safetensors.numpy

    tensors = safetensors.numpy.load_file(folder / "model.safetensors")
    safetensors.numpy.save_file({"roberta." + k.removeprefix("bert.") if k.startswith("bert.") else k: v
                                 for k, v in tensors.items()}, folder / "model.safetensors",
                                metadata={"format": "pt"})


def zero_position_row(row: int, prefix: str = "roberta."):
    """A folder's position table (under `prefix`) with `row` all zeros: a RoBERTa's padding row,
    as HF keeps it."""
    def change(folder: Path) -> None:
        import safetensors.numpy

        tensors = safetensors.numpy.load_file(folder / "model.safetensors")
        name = prefix + "embeddings.position_embeddings.weight"
        tensors[name] = tensors[name].copy()
        tensors[name][row] = 0.0
        safetensors.numpy.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return change


def converted_roberta(**changes):
    """A setup converting a copy of the shared HF folder, as a RoBERTa with `changes` to its
    config.json, into tmp/rob."""
    def setup(tmp: Path, ctx: dict) -> None:
        copy_of("hf", hf_config(model_type="roberta", **changes), as_roberta_weights)(tmp, ctx)
        convert.convert_hf(tmp / "hf", tmp / "rob")
    return setup


UNIGRAM_JSON = tokenizers.Tokenizer(tokenizers.models.Unigram([("[UNK]", 0.0), ("a", -1.0)], 0)).to_str()

ROBERTA_CASES = [
    case("convert-unsupported-family", "convert hf:{tmp}/hf {tmp}/out", 1, "model_type='deberta-v2'",
         "does not convert", "supported model_type: 'bert', 'roberta', 'modernbert'",
         setup=copy_of("hf", hf_config(model_type="deberta-v2"))),
    case("convert-roberta-pad-id", "convert hf:{tmp}/hf {tmp}/out", 1, "config.json",
         "pad_token_id=-1", "max_position_embeddings",
         setup=copy_of("hf", hf_config(model_type="roberta", pad_token_id=-1))),
    case("convert-tokenizer-json-not-bpe", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/tokenizer.json",
         "a Unigram tokenizer", "byte-level BPE", "WordPiece",
         setup=copy_of("hf", hf_config(model_type="roberta"), remove("vocab.txt"),
                       replace("tokenizer.json", UNIGRAM_JSON))),
    case("convert-roberta-pad-id-not-the-weights-padding-row", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: pad_token_id=0", "the table's all-zero (padding) row is 1",
         "use the config.json that came with them (pad_token_id=1)",
         setup=copy_of("hf", hf_config(model_type="roberta", pad_token_id=0), as_roberta_weights,
                       zero_position_row(1))),
    case("convert-roberta-positions-labelled-bert", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: model_type='bert' reads positions from row 0",
         "row 1 is all zero", "pad_token_id=1", setup=copy_of("hf", bare_weights, zero_position_row(1, ""))),
    case("convert-roberta-table-shorter-than-its-config", "convert hf:{tmp}/hf {tmp}/out", 1,
         "config.json: max_position_embeddings=514", "roberta.embeddings.position_embeddings.weight",
         setup=copy_of("hf", hf_config(model_type="roberta", max_position_embeddings=514),
                       as_roberta_weights)),
    case("export-roberta-pad-not-before-positions", "export {tmp}/rob hf:{tmp}/out", 1,
         "model.position_offset=3", "pad id + 1 = 1", "Hugging Face RoBERTa",
         setup=converted_roberta(pad_token_id=2)),
    case("config-position-offset-past-table", INFO + " --config.model.position_offset=512", 1,
         "model.position_offset=512", "max_len=512"),
    case("config-position-offset-not-read", "info --config configs/multi30k.py "
         "--config.model.position_offset=2", 2, "position_offset", "'transformer'", "does not read"),
]


def tokenizer_json_only(content: str):
    """A setup: a copy of the converted checkpoint whose only tokenizer file is a tokenizer.json
    holding `content`."""
    return copy_of("ckpt", lambda d: [f.unlink() for f in d.iterdir()
                                      if f.is_file() and f.name in tokenizer_lib.TOKENIZER_FILES],
                   replace("tokenizer.json", content))


def roberta_tokenizer_json(content: str):
    """A setup: a copy of the HF folder as a RoBERTa whose tokenizer is a tokenizer.json holding
    `content`."""
    return copy_of("hf", hf_config(model_type="roberta"), as_roberta_weights, remove("vocab.txt"),
                   replace("tokenizer.json", content))


def roberta_bpe_files(vocab_json: str, merges: str | bytes):
    """A setup: a copy of the HF folder as a RoBERTa whose tokenizer is vocab.json + merges.txt."""
    return copy_of("hf", hf_config(model_type="roberta"), as_roberta_weights, remove("vocab.txt"),
                   remove("tokenizer.json"), replace("vocab.json", vocab_json),
                   replace("merges.txt", merges))


BPE_VOCAB = json.dumps({t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "a", "b", "ab"])})


def edited_tokenizer_json(change: Callable[[dict], None]):
    """A setup: a copy of the HF folder whose tokenizer.json (beside its vocab.txt) is changed
    by `change` (its parsed content, in place)."""
    def edit(folder: Path) -> None:
        state = json.loads((folder / "tokenizer.json").read_text())
        change(state)
        (folder / "tokenizer.json").write_text(json.dumps(state))
    return copy_of("hf", edit)


def without_mask(state: dict) -> None:
    del state["model"]["vocab"]["[MASK]"]
    state["added_tokens"] = [a for a in state["added_tokens"] if a["content"] != "[MASK]"]


TOKENIZER_JSON_CASES = [
    # a tokenizer.json beside the vocab.txt convert reads (transformers loads it first): it must
    # be the same tokenizer, or the converted model tokenizes otherwise than the HF one
    case("convert-tokenizer-json-beside-vocab-not-json", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json", "not valid JSON",
         setup=copy_of("hf", replace("tokenizer.json", '{"version":'))),
    case("convert-tokenizer-json-beside-vocab-unigram", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json: model.type='Unigram', but {tmp}/hf/vocab.txt is a WordPiece vocab",
         "transformers loads tokenizer.json before vocab.txt",
         setup=edited_tokenizer_json(lambda s: s["model"].update(type="Unigram"))),
    case("convert-tokenizer-json-beside-vocab-no-mask", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json: model.vocab lacks '[MASK]' (line 5 of {tmp}/hf/vocab.txt",
         setup=edited_tokenizer_json(without_mask)),
    case("convert-tokenizer-json-beside-vocab-repeated-id", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json: added_tokens: '[PAD]' and '[UNK]' both have the id 0",
         setup=edited_tokenizer_json(lambda s: s["added_tokens"][1].update(id=0))),
    case("convert-tokenizer-json-beside-vocab-id-out-of-range", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json: model.vocab: 'the' has the id 9000, outside {tmp}/hf/vocab.txt's",
         setup=edited_tokenizer_json(lambda s: s["model"]["vocab"].update(the=9000))),
    case("convert-tokenizer-json-beside-vocab-other-id", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer.json: model.vocab: '[PAD]' has the id 5, but line 6 of {tmp}/hf/vocab.txt is",
         setup=edited_tokenizer_json(lambda s: s["model"]["vocab"].update({"[PAD]": 5}))),
    # a tokenizer.json that is not one, in an HF folder (convert) or a checkpoint: the file and
    # what to do, never the tokenizers library's bare message
    case("convert-tokenizer-json-not-json", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/tokenizer.json",
         "not valid JSON", "the model's own tokenizer.json", setup=roberta_tokenizer_json("{oops")),
    case("convert-tokenizer-json-a-list", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/tokenizer.json",
         "expected an object", "the model's own tokenizer.json",
         setup=copy_of("hf", remove("vocab.txt"), replace("tokenizer.json", "[1, 2]"))),
    case("convert-tokenizer-json-no-model", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/tokenizer.json",
         'no "model" object', "the model's own tokenizer.json",
         setup=roberta_tokenizer_json('{"version": "1.0", "model": 3}')),
    case("convert-tokenizer-json-bpe-unreadable", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/tokenizer.json",
         "a BPE tokenizer.json the tokenizers library cannot read", "the model's own tokenizer.json",
         setup=roberta_tokenizer_json('{"model": {"type": "BPE", "vocab": [1], "merges": 3}}')),
    # and byte-level BPE's other pair of files (vocab.json + merges.txt), whose faults the
    # tokenizers library reports as a TypeError or a Rust panic
    case("convert-bpe-vocab-id-not-an-integer", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/vocab.json",
         "token 'a' has the id 'zero', not an integer >= 0", "the model's own",
         setup=roberta_bpe_files('{"<s>": 0, "a": "zero"}', "#version: 0.2\n")),
    case("convert-bpe-merge-not-a-pair", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/merges.txt:3",
         "'a b ab' is not a merge", setup=roberta_bpe_files(BPE_VOCAB, "#version: 0.2\na b\na b ab\n")),
    case("convert-bpe-merge-outside-the-vocab", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/merges.txt:2",
         "the merge 'b a' needs 'ba'", "hf/vocab.json lacks", "not of one tokenizer",
         setup=roberta_bpe_files(BPE_VOCAB, "#version: 0.2\nb a\n")),
    # a folder of a BPE family (RoBERTa, ModernBERT) without its tokenizer: its own files named
    case("convert-roberta-no-tokenizer", "convert hf:{tmp}/hf {tmp}/out", 1, "hf: no tokenizer files",
         "byte-level BPE tokenizer is tokenizer.json, or vocab.json and merges.txt",
         setup=copy_of("hf", hf_config(model_type="roberta"), as_roberta_weights, remove("vocab.txt"),
                       remove("tokenizer.json"))),
    case("convert-roberta-vocab-json-without-merges", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf: no tokenizer files", "(vocab.json is here without merges.txt)",
         setup=copy_of("hf", hf_config(model_type="roberta"), as_roberta_weights, remove("vocab.txt"),
                       remove("tokenizer.json"), replace("vocab.json", BPE_VOCAB))),
    case("convert-modernbert-no-tokenizer", "convert hf:{tmp}/hf {tmp}/out", 1, "hf: no tokenizer files",
         "tokenizer.json, or vocab.json and merges.txt",
         setup=copy_of("hf", hf_config(model_type="modernbert"), remove("vocab.txt"),
                       remove("tokenizer.json"))),
    case("convert-bpe-merges-not-utf8", "convert hf:{tmp}/hf {tmp}/out", 1, "hf/merges.txt:2",
         "not UTF-8", setup=roberta_bpe_files(BPE_VOCAB, b"#version: 0.2\na \xff\n")),
    # tokenizer_config.json's switches are booleans (HF's BertTokenizer reads them so)
    case("convert-tokenizer-config-lowercase-not-a-boolean", "convert hf:{tmp}/hf {tmp}/out", 1,
         "hf/tokenizer_config.json: do_lower_case='yes', expected true or false",
         setup=copy_of("hf", replace("tokenizer_config.json", '{"do_lower_case": "yes"}'))),
    case("features-checkpoint-tokenizer-config-not-a-boolean", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1,
         "ckpt/tokenizer_config.json: tokenize_chinese_chars=1, expected true or false",
         setup=lambda t, c: (copy_of("ckpt", replace("tokenizer_config.json",
                                                     '{"tokenize_chinese_chars": 1}'))(t, c),
                             features_input()(t, c))),
    case("features-checkpoint-tokenizer-json-not-json", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1,
         "ckpt/tokenizer.json", "not valid JSON", "the model's own tokenizer.json",
         setup=lambda t, c: (tokenizer_json_only("\x00\x01 not json")(t, c), features_input()(t, c))),
    case("features-checkpoint-tokenizer-json-unreadable", FEATURES.replace("{ckpt}", "{tmp}/ckpt"), 1,
         "ckpt/tokenizer.json", "tokenizers library cannot read",
         setup=lambda t, c: (tokenizer_json_only('{"model": {"type": "Nope"}}')(t, c),
                             features_input()(t, c))),
]

A_FILE = files(f="a file", in_DOT_txt="the cat sat\n", corpus__a_DOT_txt=CORPUS * 3)
A_VOCAB = files(voc__vocab_DOT_txt="[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n")
A_FOLDER = files(d_DOT_npy__x="x", d_DOT_png__x="x", in_DOT_txt="the cat sat\n")
OUTPUT_PATH_CASES = [
    # every output the user names (paths.check_output, from the command table or convert's and
    # export's <out_dir>): a file where a folder must be written, or a folder where a file must
    # be, named before anything is read or computed
    case("convert-out-is-a-file", "convert hf:{hf} {tmp}/f", 1, "<out_dir>={tmp}/f is a file, not a "
         "folder", "choose another <out_dir>", setup=A_FILE),
    case("convert-out-inside-a-file", "convert hf:{hf} {tmp}/f/out", 1,
         "<out_dir>={tmp}/f/out is inside {tmp}/f, a file", setup=A_FILE),
    case("convert-source-miswritten-url", "convert hf:GS://b/hf {tmp}/out", 2, "<source>=GS://b/hf",
         "gs://b/hf"),
    case("convert-out-empty", "convert hf:{hf} ''", 2, "<out_dir> is empty"),
    case("export-out-is-a-file", "export {run} hf:{tmp}/f", 1, "<out_dir>={tmp}/f is a file",
         setup=A_FILE),
    case("export-st-out-inside-a-file", "export {run} st:{tmp}/f/st", 1,
         "<out_dir>={tmp}/f/st is inside {tmp}/f, a file", setup=A_FILE),
    case("export-source-other-scheme", "export s3://b/run hf:{tmp}/out", 2, "<source>=s3://b/run",
         "s3://"),
    case("vocab-out-is-a-file", "vocab --input {tmp}/corpus/a.txt --out {tmp}/f --size 50", 1,
         "--out={tmp}/f is a file, not a folder", "choose another --out", setup=A_FILE),
    case("prepare-out-inside-a-file", "prepare --config configs/bert_pretrain.py:tiny --out "
         "{tmp}/f/shards --config.data.tokenizer={vocab} --config.data.train_files={tmp}/corpus/a.txt",
         1, "--out={tmp}/f/shards is inside {tmp}/f, a file", setup=A_FILE),
    case("average-out-is-a-file", "average --workdir {run} --last 2 --out {tmp}/f", 1,
         "--out={tmp}/f is a file, not a folder", setup=A_FILE),
    case("sweep-workdir-is-a-file", "sweep --config configs/sweeps/glue.py:mrpc --workdir {tmp}/f", 1,
         "--workdir={tmp}/f is a file", setup=A_FILE),
    case("embed-output-is-a-folder", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/d.npy", 1, "--output={tmp}/d.npy is a directory, not a file", "choose another --output",
         setup=A_FOLDER),
    case("embed-output-inside-a-file", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/f/v.npy", 1, "--output={tmp}/f/v.npy is inside {tmp}/f, a file", setup=A_FILE),
    # a missing folder is made (test_an_output_file_in_a_missing_folder_gets_its_folder); one
    # that cannot be is named
    case("mine-output-inside-a-file", "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output "
         "{tmp}/f/new/m.jsonl", 1, "--output={tmp}/f/new/m.jsonl is inside {tmp}/f, a file",
         setup=lambda tmp, ctx: (A_FILE(tmp, ctx), BEIR_FILES(tmp, ctx))),
    case("features-output-folder-name-too-long", FEATURES.replace("{tmp}/out.jsonl",
         "{tmp}/" + "x" * 300 + "/out.jsonl"), 1, "--output={tmp}/" + "x" * 300, "name too long",
         setup=features_input()),
    case("embed-output-folder-name-too-long", "embed --checkpoint {ckpt} --input {tmp}/in.txt "
         "--output {tmp}/" + "x" * 300 + "/v.npy", 1, "--output={tmp}/" + "x" * 300, "name too long",
         setup=features_input()),
    case("embed-shards-into-a-file", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/f", 1, "--output={tmp}/f is a file, not a folder", setup=A_FILE),
    case("embed-npy-not-in-lowercase", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/v.NPY", 1, "--output={tmp}/v.NPY: ends like a .npy file but not in lowercase",
         "embed would write as a folder", "give '.npy' for one file"),
    # an output named like a kind of file the command does not write there (paths.output_kind):
    # a folder named v.npz, vectors' name for JSON lines, a figure format it cannot draw
    case("embed-output-named-npz", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/v.npz", 1, "--output={tmp}/v.npz: ends in .npz, which is not what embed writes there",
         "give a .npy file or a folder (a name without a file extension)", setup=features_input()),
    case("features-output-named-npy", FEATURES.replace("out.jsonl", "out.npy"), 1,
         "--output={tmp}/out.npy: ends in .npy", "give a .jsonl file or a .json file",
         setup=features_input()),
    case("mine-output-named-gz", "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output "
         "{tmp}/m.jsonl.gz", 1, "--output={tmp}/m.jsonl.gz: ends in .gz",
         "give a .jsonl file or a .json file"),
    case("translate-output-named-npy", "translate --checkpoint {ckpt} --input {tmp}/in.txt --output "
         "{tmp}/t.npy", 1, "--output={tmp}/t.npy: ends in .npy", "give a .txt file",
         setup=features_input()),
    case("plot-out-jpg", "plot --workdir {run} --out {tmp}/c.jpg", 1, "--out={tmp}/c.jpg: ends in .jpg",
         "give a .png file or a .svg file or a .pdf file"),
    case("attention-out-without-extension", "attention --checkpoint {ckpt} --text 'the cat' --out "
         "{tmp}/a", 1, "--out={tmp}/a: has no file extension", "or a .html file"),
    case("average-out-named-like-a-file", "average --workdir {run} --last 1 --out {tmp}/avg.json", 1,
         "--out={tmp}/avg.json: ends in .json, which is not what average writes there",
         "give a folder"),
    case("convert-out-named-like-a-file", "convert hf:{hf} {tmp}/c.safetensors", 1,
         "<out_dir>={tmp}/c.safetensors: ends in .safetensors", "give a folder"),
    case("embed-corpus-id-twice", "embed --checkpoint {ckpt} --input {tmp}/c.jsonl --output {tmp}/v",
         1, "c.jsonl:2: field '_id': 'a' twice (first on line 1)",
         setup=files(c_DOT_jsonl='{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n')),
    case("embed-into-a-folder-of-other-files", "embed --checkpoint {ckpt} --input {tmp}/in.txt "
         "--output {tmp}/notes", 1, "--output={tmp}/notes: a folder with files but no embed.json",
         setup=files(notes__x="keep me", in_DOT_txt="the cat sat\n")),
    case("plot-out-is-a-folder", "plot --workdir {run} --out {tmp}/d.png", 1,
         "--out={tmp}/d.png is a directory, not a file", setup=A_FOLDER),
    case("attention-out-inside-a-file", "attention --checkpoint {ckpt} --text 'the cat' --out "
         "{tmp}/f/a.png", 1, "--out={tmp}/f/a.png is inside {tmp}/f, a file", setup=A_FILE),
    # a folder a command fills (paths.check_new_folder) that holds other files: a user's vocab
    # would be replaced by the model's, or kept beside weights it does not fit
    case("convert-out-holds-a-vocab", "convert hf:{hf} {tmp}/voc", 1,
         "<out_dir>={tmp}/voc: not empty (holds vocab.txt)", "choose a new output folder",
         setup=A_VOCAB),
    case("convert-st-out-holds-other-files", "convert st:{tmp}/st {tmp}/voc", 1,
         "<out_dir>={tmp}/voc: not empty (holds vocab.txt)",
         setup=lambda tmp, ctx: (st_folder()(tmp, ctx), A_VOCAB(tmp, ctx))),
    case("average-out-holds-a-vocab", "average --workdir {run} --last 1 --out {tmp}/voc", 1,
         "--out={tmp}/voc: not empty (holds vocab.txt)", setup=A_VOCAB),
    # a workdir holding another tokenizer's files than data.tokenizer (tokenizer.copy_tokenizer)
    case("train-workdir-holds-another-tokenizer", PRETRAIN.replace("{tmp}/w", "{tmp}/voc")
         + " --config.data.tokenizer={vocab}", 1,
         "{tmp}/voc: already holds tokenizer files of another tokenizer than {vocab} (vocab.txt",
         setup=A_VOCAB),
    # an output file the user names never replaces one (paths.check_new_file), nor do the data
    # files written beside it: a run's summary.json, a sweep's results.csv
    case("attention-out-exists", "attention --checkpoint {ckpt} --text 'the cat' --out {tmp}/a.png",
         1, "--out={tmp}/a.png: already exists; attention never overwrites a file",
         setup=files(a_DOT_png="a figure")),
    case("attention-data-over-a-runs-summary", "attention --checkpoint {ckpt} --text 'the cat' "
         "--out {tmp}/r/summary.png", 1, "--out={tmp}/r/summary.png: {tmp}/r/summary.json already "
         "exists", "choose a new --out", setup=files(r__summary_DOT_json='{"step": 2}')),
    case("plot-data-over-a-sweeps-results", "plot --workdir {run} --out {tmp}/sw/results.png", 1,
         "--out={tmp}/sw/results.png: {tmp}/sw/results.csv already exists",
         "plot never overwrites a file", setup=files(sw__results_DOT_csv="setting,seed\n")),
]

MLM_ONLY = PRETRAIN + " --config.model.nsp=false --config.data.instances=full_rows"
MLM_ONLY_CASES = [
    # masked LM only: the model's head and the data's rows must agree, and the
    # masking rates fit the prediction slots, before anything compiles
    case("nsp-model-with-mlm-only-rows", PRETRAIN + " --config.data.instances=full_rows", 1,
         "data.instances='full_rows'", "model.nsp=True", "--config.model.nsp=False",
         "--config.data.instances=pairs"),
    case("mlm-only-model-with-nsp-pairs", PRETRAIN + " --config.model.nsp=false", 1,
         "model.nsp=False", "data.instances='pairs'", "--config.data.instances=packed"),
    case("instances-unknown", MLM_ONLY.replace("=full_rows", "=full_sentences"), 1,
         "data.instances='full_sentences'", "['pairs', 'packed', 'full_rows']"),
    case("mlm-rate-above-the-prediction-slots", MLM_ONLY + " --config.data.masked_lm_prob=0.3", 1,
         "data.max_predictions_per_seq=3", "data.masked_lm_prob=0.3", "data.max_seq_length=16",
         ">= 5"),
    case("eval-rate-above-the-prediction-slots", MLM_ONLY + " --config.data.eval_masked_lm_prob=0.5",
         1, "data.max_predictions_per_seq=3", "data.eval_masked_lm_prob=0.5", ">= 8"),
    case("phase-predictions-below-the-rate", MLM_ONLY
         + " --config.data.phases=\"((0, 16, 3), (1, 32, 4))\"", 1,
         "data.phases[1] predictions=4", "data.phases[1] length=32", ">= 5"),
    case("eval-rate-out-of-range", MLM_ONLY + " --config.data.eval_masked_lm_prob=1.5", 1,
         "data.eval_masked_lm_prob=1.5", "(0, 1]"),
    case("full-rows-packed", MLM_ONLY + " --config.data.pack=true", 1,
         "data.pack=True", "data.instances='full_rows'", "--config.data.pack=false"),
    case("synthetic-rows-packed-mlm-only", MLM_ONLY.replace("=full_rows", "=packed"), 1,
         "data.instances='packed'", "data.name='synthetic'", "--config.data.instances=full_rows"),
    case("nsp-not-read-by-a-classifier", "info --config configs/glue.py:sst2,tiny "
         "--config.model.nsp=false", 2, "nsp", "'bert_classification'", "does not read"),
]
MODERN = "info --config configs/modernbert.py:tiny"
MODERN_ENCODER_CASES = [
    # the modern encoder's switches, refused when the config is read
    case("rope-theta-zero", MODERN + " --config.model.rope_theta=0", 1,
         "model.rope_theta=0.0", "> 0"),
    case("rmsnorm-with-bias", MODERN + " --config.model.normalization=rmsnorm "
         "--config.model.norm_bias=true", 1, "model.normalization=rmsnorm", "model.norm_bias=False"),
    case("mean-pooling-with-bert-pooler", "info --config configs/glue.py:sst2,tiny "
         "--config.model.pooling=mean", 1, "model.pooling=mean", "model.task_head=modernbert"),
    case("modern-window-not-below-the-length", "train --config configs/modernbert.py:tiny "
         "--workdir {tmp}/w --config.data.name=synthetic --config.data.instances=full_rows "
         "--config.data.max_seq_length=64 --config.data.max_predictions_per_seq=20", 1,
         "model.attention_window=64", "sequence length 64"),
    case("rope-base-phase-on-a-learned-position-model", PRETRAIN
         + " --config.data.phases=\"((0, 16, 3, 0, 1000.0),)\"", 1,
         "data.phases[0]", "model.positions='learned'"),
    case("unknown-encoder-size", "info --config configs/glue.py:sst2,modernbert-huge", 2,
         "'huge'", "modernbert"),
    # a field Hugging Face's ModernBERT fixes, on a model declaring that family: refused before
    # training, not first at export
    case("modernbert-with-token-types", MODERN + " --config.model.type_vocab_size=2", 1,
         "model.type_vocab_size=2 with model.hf_family='modernbert'", "type_vocab_size=0",
         "--config.model.type_vocab_size=0"),
    # a rope model declares its context in model.max_len (its checkpoint, an export): rows longer
    case("rope-rows-longer-than-max-len", "train --config configs/modernbert.py:tiny --workdir "
         "{tmp}/w --config.model.max_len=64", 1, "data.max_seq_length=128",
         "the context the model declares (model.max_len=64)", "use at most 64"),
]

def modernbert_checkpoint(**changes):
    """A setup saving a tiny ModernBERT-like classifier with `changes` into tmp/mb."""
    def setup(tmp: Path, ctx: dict) -> None:
        model_cfg = models.model_section("bert_classification", {
            **models.modernbert_model_fields("tiny"), "vocab_size": 64, "num_layers": 1, **changes})
        save_model(tmp / "mb", models.create_model(model_cfg), {"model": model_cfg})
    return setup


MODERNBERT = "convert hf:{tmp}/hf {tmp}/out"
MODERNBERT_HF_CASES = [
    # HF ModernBERT config.json switches our BERT family cannot express (the shared HF folder,
    # relabelled: the config is refused before any weight is read)
    case("convert-modernbert-layer-pattern", MODERNBERT, 1, "hf: config.json: layer_types=",
         "cannot be expressed", "model.attention_global_every",
         setup=copy_of("hf", hf_config(model_type="modernbert", num_hidden_layers=3, layer_types=[
             "sliding_attention", "full_attention", "sliding_attention"]))),
    case("convert-modernbert-bias-switches", MODERNBERT, 1,
         "config.json: mlp_bias=True but attention_bias=False, classifier_bias=False", "model.use_bias",
         setup=copy_of("hf", hf_config(model_type="modernbert", mlp_bias=True))),
    case("convert-modernbert-classifier-activation", MODERNBERT, 1,
         "config.json: classifier_activation='relu' differs from hidden_activation='gelu'",
         setup=copy_of("hf", hf_config(model_type="modernbert", classifier_activation="relu"))),
    case("convert-modernbert-rope-theta", MODERNBERT, 1,
         "config.json: rope_parameters.sliding_attention.rope_theta=-1", "> 0",
         setup=copy_of("hf", hf_config(model_type="modernbert", rope_parameters={
             "sliding_attention": {"rope_type": "default", "rope_theta": -1}}))),
    case("convert-modernbert-rope-scaling", MODERNBERT, 1,
         "config.json: rope_parameters.full_attention.rope_type='yarn'", "'default'",
         setup=copy_of("hf", hf_config(model_type="modernbert", rope_parameters={
             "full_attention": {"rope_type": "yarn", "factor": 4.0}}))),
    # a local window wider than the model's positions (stored as a window no run accepts)
    case("convert-modernbert-window-past-the-positions", MODERNBERT, 1,
         "config.json: local_attention=100000 exceeds max_position_embeddings=", "came with the weights",
         setup=copy_of("hf", hf_config(model_type="modernbert", layer_types=["sliding_attention"],
                                     local_attention=100000))),
    # export of what HF's ModernBERT classes cannot express, naming the field
    case("export-modernbert-rmsnorm", "export {tmp}/mb hf:{tmp}/out", 1,
         "Hugging Face ModernBERT", "model.normalization='rmsnorm' (HF ModernBERT: 'layernorm')",
         setup=modernbert_checkpoint(normalization="rmsnorm")),
    case("export-modernbert-learned-positions", "export {tmp}/mb hf:{tmp}/out", 1,
         "Hugging Face ModernBERT", "model.positions='learned' (HF ModernBERT: 'rope')",
         setup=modernbert_checkpoint(positions="learned")),
]

def st_folder(*changes: Callable[[Path], None]):
    """A setup exporting the shared converted checkpoint as a sentence-transformers folder
    tmp/st, then changing it."""
    def setup(tmp: Path, ctx: dict) -> None:
        from bert_jax.interop import sentence_models

        sentence_models.export_st(ctx["ckpt"], tmp / "st")
        for change in changes:
            change(tmp / "st")
    return setup


def json_file(name: str, content):
    return lambda folder: write(folder / name, json.dumps(content))


def st_module(kind: str, path: str) -> dict:
    """One entry of a sentence-transformers modules.json."""
    return {"name": kind, "path": path, "type": f"sentence_transformers.models.{kind}"}


BEIR_FILES = files(beir__corpus_DOT_jsonl='{"_id": "d1", "text": "the cat sat"}\n',
                   beir__queries_DOT_jsonl='{"_id": "q1", "text": "cat"}\n',
                   **{"beir__qrels__test_DOT_tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n"},
                   in_DOT_txt="the cat sat\n", empty_DOT_txt="",
                   pairs_DOT_jsonl='{"query": "the cat", "positive": "a dog"}\n')
PAIRS = ("train --config configs/embeddings.py:{loss},tiny" + FINETUNE
         + " --config.data.train_file=train.tsv --config.data.dev_file=train.tsv --config.train.steps=1")
SCORED = "sentence1\tsentence2\tscore\n" + "the cat\ta dog\t1.0\n" * 4 + "the cat\ta cat\t4.0\n" * 4
QUERIES = "query\tpositive\n" + "the cat\ta dog\n" * 8
EMBED = "embed --checkpoint {ckpt} --input {tmp}/in.txt --output {tmp}/v"


def embedded(*changes: Callable[[Path], None]):
    """A setup embedding tmp/in.txt (two texts) into the folder tmp/v, a shard per text, as
    `EMBED --shard_size=1` does (bulk_embed), then changing the folder."""
    def setup(tmp: Path, ctx: dict) -> None:
        from bert_jax.interop import bulk_embed

        write(tmp / "in.txt", "the cat sat\nthe dog\n")
        bulk_embed.embed_to_shards(str(ctx["ckpt"]), str(tmp / "in.txt"), str(tmp / "v"), shard_size=1)
        for change in changes:
            change(tmp / "v")
    return setup


def nan_shard(folder: Path) -> None:
    """Shard 1's vectors made NaN after embed wrote it (its CRC32 file left as written)."""
    import numpy as np

    with np.load(folder / "part-00001-of-00002.npz") as z:
        ids, vectors = z["ids"], z["vectors"]
    np.savez(folder / "part-00001-of-00002.npz", ids=ids, vectors=np.full_like(vectors, np.nan))


# Embedding training with its own dev file; 8 distinct pairs (QUERIES is one pair 8 times).
TRAIN_PAIRS = PAIRS.replace("dev_file=train.tsv", "dev_file=dev.tsv")
DISTINCT = "query\tpositive\n" + "".join(f"q{i} the cat\tp{i} a dog\n" for i in range(8))
SCORED_JSONL = "".join(json.dumps({"sentence1": f"the cat {i}", "sentence2": "a dog", "score": s}) + "\n"
                       for i, s in enumerate([1.0, 4.0, True, 2.0]))


def beir_with(**named: str | bytes) -> Callable[[Path, dict], None]:
    """BEIR_FILES, then `files(**named)` over them."""
    return lambda tmp, ctx: (BEIR_FILES(tmp, ctx), files(**named)(tmp, ctx))


EMBED_MANIFEST = {"format": 1, "checkpoint": "/x", "step": 0, "input": "/x/in.txt", "fingerprint": "0",
                  "rows": 1, "shard_size": 1, "shards": 1,
                  "sentence": {"normalize": False, "max_seq_length": 512, "do_lower_case": False}}
EMBED_CASES = [
    # the embeddings commands: a path the OS refuses names its flag; counts out of range are
    # refused before any work, never replaced by the default
    case("embed-input-missing", EMBED.replace("in.txt", "nope.txt"), 1,
         "--input={tmp}/nope.txt: no such file or directory (check the path)"),
    case("embed-input-a-folder", EMBED.replace("in.txt", "beir"), 1,
         "--input={tmp}/beir: is a directory (a folder where a file is needed)", setup=BEIR_FILES),
    case("embed-jsonl-into-a-npy", "embed --checkpoint {ckpt} --input {tmp}/c.jsonl --output {tmp}/v.npy",
         1, "--input={tmp}/c.jsonl: a corpus of JSON lines embeds into a folder of shards",
         setup=files(c_DOT_jsonl='{"_id": "a", "text": "x"}\n')),
    case("embed-empty-into-a-npy", "embed --checkpoint {ckpt} --input {tmp}/empty.txt --output "
         "{tmp}/v.npy", 1, "--input={tmp}/empty.txt: empty, no line to embed", setup=BEIR_FILES),
    case("embed-gz-not-gzip", "embed --checkpoint {ckpt} --input {tmp}/c.txt.gz --output {tmp}/v", 1,
         "{tmp}/c.txt.gz: not a readable gzip file", "drop the .gz suffix",
         setup=files(c_DOT_txt_DOT_gz="the cat sat\n")),
    case("embed-batch-zero", EMBED + " --batch_size=0", 1, "--batch_size=0 must be >= 1",
         setup=BEIR_FILES),
    case("embed-shard-size-negative", EMBED + " --shard_size=-3", 1, "--shard_size=-3 must be >= 1",
         setup=BEIR_FILES),
    # an output folder changed between a run and its resume: named by file and dotted key
    case("embed-resume-shard-made-nan", EMBED + " --shard_size=1", 1,
         "{tmp}/v/part-00001-of-00002.npz: not a whole shard (changed since embed wrote it",
         "remove that file and run the same `bert-jax embed` again", setup=embedded(nan_shard)),
    case("embed-json-nested-key-removed", EMBED, 1,
         "{tmp}/v/embed.json: no key 'sentence.pooling' (a string)", "restore it, or choose a new --output",
         setup=files(in_DOT_txt="the cat sat\n", v__embed_DOT_json=json.dumps(EMBED_MANIFEST))),
    case("eval-embeddings-split-missing", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir "
         "--split dev", 1, "--beir={tmp}/beir: {tmp}/beir/qrels/dev.tsv: no such file or directory",
         setup=BEIR_FILES),
    case("eval-embeddings-beir-a-file", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/in.txt", 1,
         "--beir={tmp}/in.txt is a file, not a BEIR folder", setup=BEIR_FILES),
    case("eval-embeddings-beir-other-scheme", "eval-embeddings --checkpoint {ckpt} --beir s3://b/x", 2,
         "--beir=s3://b/x", "s3://"),
    case("eval-embeddings-qrels-of-another-corpus", "eval-embeddings --checkpoint {ckpt} --beir "
         "{tmp}/beir --split other", 1, "{tmp}/beir/qrels/other.tsv: none of its relevant corpus-ids "
         "is in {tmp}/beir/corpus.jsonl (e.g. 'd9')", setup=lambda tmp, ctx: (BEIR_FILES(tmp, ctx), write(
             tmp / "beir" / "qrels" / "other.tsv", "query-id\tcorpus-id\tscore\nq1\td9\t1\n"))),
    case("eval-embeddings-qrels-without-header", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir",
         1, "{tmp}/beir/qrels/test.tsv:1: 'q1\\td1\\t1' is not the header a qrels file starts with",
         "add that line", setup=lambda tmp, ctx: (BEIR_FILES(tmp, ctx), write(
             tmp / "beir" / "qrels" / "test.tsv", "q1\td1\t1\nq1\td2\t1\n"))),
    case("eval-embeddings-beir-title-a-number", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir",
         1, "{tmp}/beir/corpus.jsonl:1: field 'title' is not a string (found 5)", setup=lambda tmp, ctx: (
             BEIR_FILES(tmp, ctx), write(tmp / "beir" / "corpus.jsonl",
                                         '{"_id": "d1", "title": 5, "text": "the cat sat"}\n'))),
    case("eval-embeddings-bootstrap-zero", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir "
         "--bootstrap=0", 1, "--bootstrap=0 must be >= 40", setup=BEIR_FILES),
    case("eval-embeddings-squad-without-paragraphs", "eval-embeddings --checkpoint {ckpt} --squad "
         "{tmp}/sq.json", 1, "sq.json: data[0].paragraphs is missing",
         setup=files(sq_DOT_json='{"data": [{"title": "t"}]}')),
    case("mine-pairs-empty", "mine --checkpoint {ckpt} --input {tmp}/empty.txt --output {tmp}/m.jsonl",
         1, "{tmp}/empty.txt: empty (or blank); expected a pair file", setup=BEIR_FILES),
    case("mine-negatives-zero", "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output "
         "{tmp}/m.jsonl --negatives=0", 1, "--negatives=0 must be >= 1", setup=BEIR_FILES),
    case("mine-corpus-missing", "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output "
         "{tmp}/m.jsonl --corpus {tmp}/nope.txt", 1, "--corpus={tmp}/nope.txt: no such file",
         setup=BEIR_FILES),
    case("mine-corpus-empty", "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output "
         "{tmp}/m.jsonl --corpus {tmp}/empty.txt", 1, "--corpus={tmp}/empty.txt: no passage",
         setup=BEIR_FILES),
    # the pair file's kind and the objective agree, said before anything compiles
    case("pairs-cosent-on-unscored", PAIRS.replace("{loss}", "cosent"), 1,
         "data/train.tsv: pairs without a score, but train.objective='cosent' trains on scored pairs",
         setup=files(data__train_DOT_tsv=DISTINCT)),
    case("pairs-contrastive-on-scored", PAIRS.replace("{loss}", "contrastive"), 1,
         "data/train.tsv: scored pairs, but train.objective='contrastive' trains on queries with "
         "positives", setup=files(data__train_DOT_tsv=SCORED)),
    # sentence-transformers folders in: each module file's values by key and type
    case("convert-st-pooling-flag-a-string", "convert st:{tmp}/st {tmp}/out", 1,
         "st/1_Pooling/config.json: key 'pooling_mode_cls_token' is \"false\", expected true or false",
         setup=st_folder(json_file("1_Pooling/config.json", {"pooling_mode_cls_token": "false",
                                                             "pooling_mode_mean_tokens": True}))),
    case("convert-st-pooling-dimension", "convert st:{tmp}/st {tmp}/out", 1,
         "word_embedding_dimension=768", "hidden_size=32",
         setup=st_folder(json_file("1_Pooling/config.json", {"word_embedding_dimension": 768,
                                                             "pooling_mode_mean_tokens": True}))),
    case("convert-st-length-negative", "convert st:{tmp}/st {tmp}/out", 1,
         "st/sentence_bert_config.json: key 'max_seq_length' is -4, expected an integer >= 3",
         setup=st_folder(json_file("sentence_bert_config.json", {"max_seq_length": -4}))),
    # its modules: a Transformer, then Pooling and Normalize, each once and in that order
    case("convert-st-pooled-twice", "convert st:{tmp}/st {tmp}/out", 1,
         "st/modules.json: modules ['Transformer', 'Pooling', 'Pooling']", "each once, in that order",
         setup=st_folder(json_file("modules.json", [st_module("Transformer", ""),
                                                    st_module("Pooling", "1_Pooling"),
                                                    st_module("Pooling", "1_Pooling")]))),
    case("convert-st-normalized-before-pooling", "convert st:{tmp}/st {tmp}/out", 1,
         "st/modules.json: modules ['Transformer', 'Normalize', 'Pooling']",
         setup=st_folder(json_file("modules.json", [st_module("Transformer", ""),
                                                    st_module("Normalize", "2_Normalize"),
                                                    st_module("Pooling", "1_Pooling")]))),
    case("convert-st-settings-a-list", "convert st:{tmp}/st {tmp}/out", 1,
         "st/sentence_bert_config.json: found a JSON list, expected an object",
         setup=st_folder(json_file("sentence_bert_config.json", [512]))),
    # a file a command reads outside a run's config: its bad row's hint is no data.* key
    case("mine-row-without-positive", "mine --checkpoint {ckpt} --input {tmp}/p.jsonl --output "
         "{tmp}/m.jsonl", 1, "p.jsonl:1: field 'positive'", "expected a non-empty string",
         "Fix that row of the file", setup=files(p_DOT_jsonl='{"query": "the cat"}\n')),
    case("eval-embeddings-sts-score-a-word", "eval-embeddings --checkpoint {ckpt} --sts {tmp}/sts.tsv",
         1, "sts.tsv:2: score column 'score': found 'high'", "Fix that row of the file",
         setup=files(sts_DOT_tsv=STSB_ROWS.format("high"))),
    # scored pairs whose scores do not differ: no correlation to report, no ranking to learn
    case("eval-embeddings-sts-one-score", "eval-embeddings --checkpoint {ckpt} --sts {tmp}/sts.tsv",
         1, "{tmp}/sts.tsv: 2 pair(s), every score 3.0", "must differ",
         setup=files(sts_DOT_tsv=STSB_ROWS.format(3) + STSB_ROWS.format(3).splitlines(True)[1])),
    case("pairs-cosent-one-score", PAIRS.replace("{loss}", "cosent"), 1,
         "data/train.tsv: 8 pair(s), every score 1.0", "must differ",
         setup=files(data__train_DOT_tsv="sentence1\tsentence2\tscore\n" + "the cat\ta dog\t1.0\n" * 8)),
    case("embed-beir-row-a-list", "embed --checkpoint {ckpt} --input {tmp}/c.jsonl --output {tmp}/v", 1,
         "{tmp}/c.jsonl:1: a JSON list, expected an object (a BEIR record has _id and text)",
         setup=files(c_DOT_jsonl='["d1", "the cat"]\n')),
    # a resume from another input is named as such; qrels that contradict themselves; mine's input
    # is a pair file, and what it cannot mine is said, not written short
    case("embed-resume-another-input", EMBED + " --shard_size=1", 1,
         "{tmp}/v/embed.json: the shards there were made from another input", "whose ids or texts differ",
         setup=embedded(lambda v: write(v.parent / "in.txt", "the cat sat\nthe bird\n"))),
    case("eval-embeddings-qrels-pair-scored-twice", "eval-embeddings --checkpoint {ckpt} --beir "
         "{tmp}/beir", 1, "{tmp}/beir/qrels/test.tsv:3: query-id 'q1' and corpus-id 'd1' again with "
         "score '2' (line 2: 1)", setup=lambda tmp, ctx: (BEIR_FILES(tmp, ctx), write(
             tmp / "beir" / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n"))),
    case("mine-input-a-beir-folder", "mine --checkpoint {ckpt} --input {tmp}/beir --output {tmp}/m.jsonl",
         1, "{tmp}/beir: a BEIR folder or qrels file; mining reads a pair file", setup=BEIR_FILES),
    case("mine-input-a-qrels-file", "mine --checkpoint {ckpt} --input {tmp}/beir/qrels/test.tsv "
         "--output {tmp}/m.jsonl", 1, "test.tsv: a BEIR folder or qrels file", setup=BEIR_FILES),
    case("mine-fewer-than-asked", "mine --checkpoint {ckpt} --input {tmp}/p.jsonl --output {tmp}/m.jsonl "
         "--negatives=2", 1, "p.jsonl: 2 of 2 queries have fewer than 2 negatives", "--negatives=1",
         "nothing written", setup=files(p_DOT_jsonl='{"query": "the cat", "positive": "a dog"}\n'
                                                    '{"query": "the mat", "positive": "a hat"}\n')),
    # a contrastive batch with nothing to compare: refused before training, naming the keys
    case("pairs-one-distinct-pair", TRAIN_PAIRS.replace("{loss}", "contrastive"), 1,
         "data/train.tsv: 8 training pair(s) with 1 distinct query(ies) and 1 distinct positive(s)",
         "at least 2 distinct pairs", "data.train_file",
         setup=files(data__train_DOT_tsv=QUERIES, data__dev_DOT_tsv=DISTINCT)),
    case("pairs-gz-cut-to-one-pair", TRAIN_PAIRS.replace("{loss}", "contrastive").replace(
         "train.tsv", "train.tsv.gz") + " --config.data.max_train_examples=1", 1,
         "data/train.tsv.gz: 1 training pair(s) (data.max_train_examples=1)",
         setup=files(data__train_DOT_tsv_DOT_gz=gzip.compress(DISTINCT.encode()),
                     data__dev_DOT_tsv=DISTINCT)),
    case("pairs-batch-of-one", TRAIN_PAIRS.replace("{loss}", "contrastive").replace(
         "batch_size=8", "batch_size=1"), 1, "train.batch_size=1: train.objective='contrastive' takes "
         "a query's negatives from the other pairs of its batch", "set train.batch_size >= 2",
         setup=files(data__train_DOT_tsv=DISTINCT, data__dev_DOT_tsv=DISTINCT)),
    case("pairs-learned-scale-above-its-cap", TRAIN_PAIRS.replace("{loss}", "contrastive")
         + " --config.model.learn_scale=True --config.model.similarity_scale=200", 1,
         "model.similarity_scale=200 is above the learned scale's cap 100",
         setup=files(data__train_DOT_tsv=DISTINCT, data__dev_DOT_tsv=DISTINCT)),
    # cosent reads scored pairs only: negatives given to it are named, not dropped or blamed on rows
    case("pairs-cosent-num-negatives", PAIRS.replace("{loss}", "cosent") + " --config.data.num_negatives=1",
         1, "data.num_negatives=1: train.objective='cosent' trains on scored pairs and reads no "
         "negatives", setup=files(data__train_DOT_tsv=SCORED)),
    case("pairs-cosent-negative-column", PAIRS.replace("{loss}", "cosent"), 1,
         "data/train.tsv:2: negatives given, but train.objective='cosent'", "reads no negatives",
         setup=files(data__train_DOT_tsv="sentence1\tsentence2\tnegative\tscore\n" + "".join(
             f"the cat {i}\ta dog\ta hat\t{i}.0\n" for i in range(4)))),
    case("pairs-score-true", PAIRS.replace("{loss}", "cosent"), 1,
         "data/train.tsv:3: field 'score': found 'true', expected a finite number (a JSON number",
         setup=files(data__train_DOT_tsv=SCORED_JSONL)),
    # An empty BEIR query is refused by file, line, field (an empty document is not:
    # tests/unit/tasks/test_retrieval.py)
    case("eval-embeddings-beir-empty-query", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir "
         "--bootstrap=40", 1, "{tmp}/beir/queries.jsonl:1: field 'text' is empty: nothing to embed",
         setup=beir_with(beir__queries_DOT_jsonl='{"_id": "q1", "text": " "}\n')),
    # statistics that could not come out otherwise: refused, with the least that means something
    case("eval-embeddings-bootstrap-too-few", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir "
         "--bootstrap=39", 1, "--bootstrap=39 must be >= 40: a 95% interval's bounds", setup=BEIR_FILES),
    case("eval-embeddings-corpus-of-one", "eval-embeddings --checkpoint {ckpt} --beir {tmp}/beir "
         "--bootstrap=40", 1, "--beir={tmp}/beir: a corpus of 1 document(s)", "every @k metric is 1",
         setup=BEIR_FILES),
    case("eval-embeddings-sts-two-pairs-gz", "eval-embeddings --checkpoint {ckpt} --sts {tmp}/sts.tsv.gz",
         1, "{tmp}/sts.tsv.gz: 2 pairs; Pearson and Spearman of fewer than 3 pairs are +1 or -1",
         setup=files(sts_DOT_tsv_DOT_gz=gzip.compress(
             (STSB_ROWS.format(1.0) + STSB_ROWS.format(4.0).splitlines(True)[1]).encode()))),
    case("eval-embeddings-squad-no-questions", "eval-embeddings --checkpoint {ckpt} --squad {tmp}/sq.json",
         1, "{tmp}/sq.json: no question with a paragraph; nothing to retrieve",
         setup=files(sq_DOT_json='{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": []}]}]}')),
    case("mine-gz-input", "mine --checkpoint {ckpt} --input {tmp}/p.jsonl.gz --output {tmp}/m.jsonl "
         "--negatives=2", 1, "p.jsonl.gz: 2 of 2 queries have fewer than 2 negatives",
         setup=files(p_DOT_jsonl_DOT_gz=gzip.compress(b'{"query": "the cat", "positive": "a dog"}\n'
                                                      b'{"query": "the mat", "positive": "a hat"}\n'))),
]

# One list per area, so that a new area is a new list here and in test_the_table_covers_every_area.
CASES = (CONFIG_CASES + DATA_CASES + CHECKPOINT_CASES + CONVERT_CASES + FEATURES_CASES + EVAL_CASES
         + SWEEP_CASES + VOCAB_CASES + EXPORT_CASES + TRANSLATE_CASES + EVAL_TASK_CASES
         + SWEEP_TRIAL_CASES + AVERAGE_CASES + RUN_VALUE_CASES + TFDS_CASES + PLOT_CASES + INFO_CASES
         + PREPARE_CASES + LAUNCH_CASES + ATTENTION_CASES + OPTIM_CASES + MODERN_OPTIM_CASES
         + ROBERTA_CASES + PATTERN_CASES + ATTENTION_GPU_CASES + MODERNBERT_HF_CASES + MLM_ONLY_CASES
         + MODERN_ENCODER_CASES + TOKENIZER_JSON_CASES + OUTPUT_PATH_CASES + EMBED_CASES + FLAG_CASES)


# --- Shared runs and checkpoints --------------------------------------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """Shared runs: pretraining (steps 1, 2), its HF export and conversion, fine-tuning, pre-LN, LM."""
    root = tmp_path_factory.mktemp("shared")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "|", *WORDS,
              *"abcdefghijklmnopqrstuvwxyz", *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]
    write(root / "vocab" / "vocab.txt", "\n".join(tokens) + "\n")
    tokenizer_lib.load_tokenizer(root / "vocab").save(root / "vocab")

    run = root / "run"
    argv = shlex.split(PRETRAIN.format(tmp=root).replace(f"{root}/w", str(run)))
    overrides = [a.removeprefix("--config.") for a in argv if a.startswith("--config.")]
    train.train_and_evaluate(config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), [
        *overrides, "train.checkpoint_every=1", "train.eval_steps=1"]), str(run))
    tokenizer_lib.copy_tokenizer(root / "vocab", run)
    write(run / "eval" / "step_2.json", json.dumps({"step": 2, "eval/loss": 5.0}))

    export.export_hf(run, root / "hf")
    convert.convert_hf(root / "hf", root / "ckpt")

    ft = root / "ft"
    write(root / "glue" / "CoLA" / "dev.tsv", "src\t1\t\tthe cat sat\nsrc\t0\t*\tcat the sat\n")
    write(root / "glue" / "SST-2" / "dev.tsv", SST2)
    cfg = config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"), [
        *(a.removeprefix("--config.") for a in shlex.split(SMALL_MODEL)),
        f"data.tokenizer={root / 'vocab'}", f"data.data_dir={root / 'glue'}",
        "data.max_seq_length=16", "train.batch_size=8"])
    params = models.create_model(config_lib.model_config(cfg))
    save_model(ft, params, json.loads(cfg.to_json()))
    tokenizer_lib.copy_tokenizer(root / "vocab", ft)
    write(ft / "eval" / "step_0.json", json.dumps({"step": 0, "eval/accuracy": 0.5}))
    write(ft / "eval" / "step_0" / "SST-2.tsv", "index\tprediction\n0\t1\n")

    small = dict(vocab_size=64, emb_dim=16, num_layers=1, num_heads=2, head_dim=8, mlp_dim=32)
    preln = {"name": "bert", **small, "norm": "pre"}
    save_model(root / "preln", models.create_model(preln), {"model": preln})
    lm = {"name": "decoder_lm", **small}
    save_model(root / "lm", models.create_model(lm), {"model": lm})
    # A random-init encoder-decoder with the vocab: enough for translate's checks (no training).
    mt = models.model_section("transformer", {**models.transformer_model_fields("base", vocab_size=128),
                                              **small, "vocab_size": 128, "num_decoder_layers": 1})
    save_model(root / "mt", models.create_model(mt), {**config_lib.translation_defaults().to_dict(),
                                                      "model": mt})
    tokenizer_lib.copy_tokenizer(root / "vocab", root / "mt")
    return {"run": run, "ft": ft, "ckpt": root / "ckpt", "hf": root / "hf", "vocab": root / "vocab",
            "preln": root / "preln", "lm": root / "lm", "mt": root / "mt", "glue": root / "glue"}


def save_model(directory: Path, model, config: dict) -> None:
    checkpoint.save_params(directory, 0, nnx.to_pure_dict(nnx.state(model, nnx.Param)), config)


def snapshot(roots) -> dict[str, str]:
    """{file: sha256} of every file under the roots (the run lock aside)."""
    out = {}
    for root in roots:
        for f in sorted(Path(root).rglob("*")):
            if f.is_file() and f.name != "run.lock":
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_loses_nothing(case, shared, cli, tmp_path):
    ctx = {**{k: str(v) for k, v in shared.items()}, "tmp": str(tmp_path)}
    if case.setup:
        case.setup(tmp_path, {**ctx, **shared})
    roots = [*shared.values(), *(p.parent for p in tmp_path.glob("*/checkpoints"))]
    before = snapshot(roots)
    code, _, err = cli(shlex.split(case.argv.format(**ctx)))
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("bert-jax")]
    assert len(errors) == 1, f"expected one error line, got:\n{err}"
    line = errors[0]
    prefix = "bert-jax: bad flag: " if case.code == 2 else f"bert-jax {case.argv.split()[0]}: error: "
    assert (code, line[:len(prefix)]) == (case.code, prefix), line
    missing = [s.format(**ctx) for s in case.says if s.format(**ctx) not in line]
    assert not missing, f"{missing} not in: {line}"
    after = snapshot(roots)
    assert {k: after.get(k) for k in before} == before, "a checkpoint or result changed"


@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line_in_a_real_process(shared, tmp_path):
    # The reads a failed Orbax restore abandons report later, into a closed event loop: only a
    # real process, exiting, shows whether they reach the console.
    shutil.copytree(shared["run"], tmp_path / "run")
    truncate_arrays(tmp_path / "run")
    # Saved before checksums were written: Orbax's restore is what finds the damage (with
    # checksums, eval names the damaged file before reading any array).
    for checksums in (tmp_path / "run" / "checkpoints").glob("*/checksums.json"):
        checksums.unlink()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-m", "bert_jax", "eval", "--workdir", str(tmp_path / "run")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"bert-jax eval: error: {tmp_path}/run/checkpoints/2: its params cannot be read")


def test_a_step_that_looks_unfinished_is_named_by_every_command_that_restores(shared, cli, tmp_path,
                                                                               caplog):
    # Orbax reads a step without _CHECKPOINT_METADATA (an older Orbax or another tool wrote
    # none; a partial copy lacks it too) and only logs that the file is missing: each command
    # that restores one says so in one warning line, and reads it (exit 0).
    run = tmp_path / "run"
    shutil.copytree(shared["run"], run)
    (run / "checkpoints" / "1" / "_CHECKPOINT_METADATA").unlink()
    (run / "checkpoints" / "1" / "checksums.json").unlink()  # nor written by this project's save
    never_committed = run / "checkpoints" / "2" / "_CHECKPOINT_METADATA"  # as a renamed tmp folder
    never_committed.write_text(json.dumps({"init_timestamp_nsecs": 1}))
    write(tmp_path / "in.txt", "the cat sat\n")
    step1 = (f"checkpoint {run}/checkpoints/1 has no _CHECKPOINT_METADATA (every Orbax save writes "
             "one): it was copied in part, saved by another tool or an older Orbax, or its save did "
             "not finish; nothing shows that its save finished (it has no checksums.json either)")
    step2 = (f"checkpoint {run}/checkpoints/2 was never committed (its _CHECKPOINT_METADATA has no "
             "commit time): it was copied in part, saved by another tool or an older Orbax, or its "
             "save did not finish; its files match its checksums.json")
    commands = [
        (f"eval --workdir {run} --step 1", [step1]),
        (f"export {run} hf:{tmp_path}/hf", [step2]),
        (f"average --workdir {run} --last 2 --out {tmp_path}/avg", [step1, step2]),
        (f"features --checkpoint {run} --input {tmp_path}/in.txt --output {tmp_path}/o.jsonl "
         "--layers=-1", [step2]),
    ]
    for argv, says in commands:
        code, _, err = cli(shlex.split(argv))
        lines = err.splitlines()
        assert code == 0 and len(lines) == len(says), err
        for line, start in zip(lines, says):
            assert line.startswith(f"warning: {start}. Using it; ") and "another step" in line, line
    # init_from: the newest step
    config = state.sizes_from_init(config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"),
                                                   [f"init_from={run}"]))
    mesh = sharding.make_mesh(config.mesh)
    _, abstract, state_sh = state.abstract_state(config, mesh)
    caplog.clear()  # (the commands' lines above)
    with caplog.at_level("WARNING", logger="bert_jax"):
        found = state.pretrained(config, state.with_shardings(abstract["params"], state_sh["params"]),
                                 mesh)
    assert "embeddings" in found["bert"]
    [said] = [r.getMessage() for r in caplog.records if r.name.startswith("bert_jax")]
    assert said.startswith(f"warning: {step2}. Using it; ")


def test_translate_checks_flags_and_output_before_the_model_and_keeps_an_output(shared, cli, tmp_path,
                                                                               monkeypatch):
    from bert_jax.training import state

    write(tmp_path / "src.txt", "the cat sat\nhello world\n")
    argv = shlex.split(TRANSLATE.format(mt=shared["mt"], tmp=tmp_path))
    code, _, err = cli([*argv, "--beam=1", "--batch_size=8"])  # the checks pass a good command
    assert code == 0, err
    written = (tmp_path / "out.txt").read_text()
    assert len(written.splitlines()) == 2 and not list(tmp_path.glob("*.partial"))
    monkeypatch.setattr(state, "restore_params", lambda *a, **k: pytest.fail("the model loaded first"))
    for extra in (["--alpha=nan"], ["--beam=0"], ["--batch_size=0"], []):  # []: out.txt exists now
        code, _, err = cli([*argv, *extra])
        assert code == 1, err
    assert (tmp_path / "out.txt").read_text() == written


def test_an_output_file_in_a_missing_folder_gets_its_folder(shared, cli, tmp_path):
    # As every command that writes a folder (train, vocab, prepare, average, export) makes it
    # with its parents, every command that writes a file makes the file's folder: never a
    # "no such file" for the output. (Where it cannot be made, the table's rows name --output.)
    write(tmp_path / "in.txt", "the cat sat\nhello world\n")
    write(tmp_path / "pairs.jsonl", "".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in (
        ("the cat", "a cat sat"), ("the dog", "a dog sat"), ("hello", "hello world"))))
    commands = {
        "features": "features --checkpoint {ckpt} --input {tmp}/in.txt --output {out} --layers=-1",
        "embed": "embed --checkpoint {ckpt} --input {tmp}/in.txt --output {out}",
        "mine": "mine --checkpoint {ckpt} --input {tmp}/pairs.jsonl --output {out} --negatives=1",
        "translate": "translate --checkpoint {mt} --input {tmp}/in.txt --output {out} --beam=1",
    }
    for name, argv in commands.items():
        out = tmp_path / name / "new" / {"embed": "out.npy", "translate": "out.txt"}.get(name, "out.jsonl")
        code, _, err = cli(shlex.split(argv.format(**shared, tmp=tmp_path, out=out)))
        assert code == 0 and out.is_file() and out.stat().st_size > 0, (name, err)


def test_a_failing_sweep_trial_is_reported_failed_and_tried_again(tmp_path, monkeypatch):
    from bert_jax.commands import sweep

    def trial(code: str):  # a stand-in for the trial's `bert-jax train` process
        return lambda s, setting, workdir: [sys.executable, "-c", code.format(
            dir=Path(workdir) / sweep.trial_name(setting))]

    config = sweep.sweep_config("configs/glue.py:sst2,tiny", {"optimizer.learning_rate": (1e-3, 2e-3)})
    fail = ("import sys; print('loading'); print('bert-jax train: error: {dir}: data.data_dir is empty', "
            "file=sys.stderr); sys.exit(1)")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sweep, "command", trial(fail))
    for _ in range(2):  # a rerun tries it again, and reports it the same way (not "resume")
        with pytest.raises(sweep.TrialsFailed) as e:
            sweep.run_sweep(config, str(tmp_path))
        first = tmp_path / "learning_rate=0.001_seed=0"
        assert str(e.value).startswith(f"2 of 2 trial(s) failed: learning_rate=0.001_seed=0: {first}: "
                                       f"data.data_dir is empty (log: {first}/train.log); ")
        assert "resume" not in str(e.value)
        rows = (tmp_path / "results.csv").read_text().splitlines()
        assert rows[1].split(",")[-2:] == ["failed", f"{first}: data.data_dir is empty"]
    done = ("import json, pathlib; pathlib.Path('{dir}/summary.json').write_text(json.dumps("
            "{{'step': 2, 'steps': 2, 'best_metric': 'eval/accuracy'}}))")
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    monkeypatch.setattr(sweep, "command", lambda s, setting, workdir: trial(
        done if setting["optimizer.learning_rate"] == 1e-3 else killed)(s, setting, workdir))
    with pytest.raises(sweep.TrialsFailed, match=r"^1 trial\(s\) were interrupted: "
                       "learning_rate=0.002_seed=0; rerun the sweep to resume them$"):
        sweep.run_sweep(config, str(tmp_path))
    assert [r.split(",")[3] for r in (tmp_path / "results.csv").read_text().splitlines()[1:]] == [
        "finished", "unfinished"]


def test_a_dev_file_of_equal_scores_reports_nan_and_says_so_once(shared, cli, tmp_path):
    # Pearson and Spearman of constant gold scores (a one-row dev file, as the table's) are
    # undefined: nan (as scipy's), one warning line naming the file, and the run, `eval
    # --step best` and its result go on (no checkpoint outranks another by them).
    rows = "".join(STSB_ROWS.format(score).splitlines(True)[1] for score in (0.5, 2.0, 3.5, 5.0))
    glue(train=STSB_ROWS.format(1) + rows, dev=STSB_ROWS.format(1), task="STS-B")(tmp_path, {})
    argv = shlex.split(STSB.format(tmp=tmp_path, vocab=shared["vocab"])) + [
        "--config.train.steps=2", "--config.train.eval_every=1", "--config.train.checkpoint_every=1"]
    code, out, err = cli(argv)
    dev = tmp_path / "data" / "STS-B" / "dev.tsv"
    said = (f"warning: {dev}: every gold score is 1 (1 pair(s)); Pearson and Spearman of constant "
            "scores are undefined: reported as nan")
    assert code == 0 and [line[:len(said)] for line in err.splitlines()] == [said], err
    evals = [r for r in metrics_lib.read_metrics(tmp_path / "w" / "metrics.jsonl") if "eval/pearson" in r]
    assert len(evals) == 2 and all(np.isnan(r[k]) for r in evals for k in ("eval/pearson", "eval/corr"))
    assert all(np.isfinite(r["eval/loss"]) for r in evals)
    code, out, err = cli(["eval", f"--workdir={tmp_path / 'w'}", "--step=best"])
    assert code == 0 and [line[:len(said)] for line in err.splitlines()] == [said], err
    [result] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # All nan: the latest; written as metrics.jsonl writes it, strict JSON (no bare NaN).
    assert result["step"] == 2 and result["eval/spearman"] == "nan", out
    stored = (tmp_path / "w" / "eval" / "step_2.json").read_text()
    assert json.loads(stored)["eval/pearson"] == "nan" and "NaN" not in stored
    assert "eval/pearson is nan (undefined) at every checkpoint" in out


def test_eval_embeddings_says_when_every_pair_has_the_same_cosine(shared, cli, tmp_path):
    # Three copies of one pair with different gold scores: one cosine for all, nan correlations.
    rows = "".join(STSB_ROWS.format(score).splitlines(True)[1] for score in (1.0, 2.0, 3.0))
    sts = write(tmp_path / "sts.tsv", STSB_ROWS.format(4.0) + rows)
    code, out, err = cli(["eval-embeddings", f"--checkpoint={shared['ckpt']}", f"--sts={sts}",
                          "--bootstrap=40"])
    assert code == 0 and err.startswith(f"warning: --sts={sts}: the model predicts ") and (
        "for every one of its 4 pair(s)" in err) and len(err.splitlines()) == 1, err
    got = json.loads(out.splitlines()[-1])["sts"]
    assert got["spearman_cosine"] == got["pearson_cosine"] == "nan", got  # strict JSON
    assert got["spearman_cosine_ci95"] == ["nan", "nan"], got


def test_a_sweep_ranks_an_undefined_metric_below_every_number(tmp_path, monkeypatch):
    # A correlation of constant predictions is nan ("nan" in metrics.jsonl): a trial's best
    # evaluation is its best defined one, and a trial with none is no setting's best.
    from bert_jax.commands import sweep

    evals = {1e-3: ["nan", 0.25, 0.5, 0.5, "nan"], 2e-3: ["nan", "nan"]}

    def trial(s, setting, workdir):  # a stand-in for the trial's `bert-jax train` process
        folder = Path(workdir) / sweep.trial_name(setting)
        lines = "".join(json.dumps({"step": i + 1, "eval/pearson": v}) + "\n"
                        for i, v in enumerate(evals[setting["optimizer.learning_rate"]]))
        summary = {"step": 5, "steps": 5, "best_metric": "eval/pearson"}
        return [sys.executable, "-c", f"import pathlib; d = pathlib.Path({str(folder)!r}); "
                f"(d / 'metrics.jsonl').write_text({lines!r}); "
                f"(d / 'summary.json').write_text({json.dumps(summary)!r})"]

    config = sweep.sweep_config("configs/glue.py:stsb,tiny", {"optimizer.learning_rate": (1e-3, 2e-3)})
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sweep, "command", trial)
    out = sweep.run_sweep(config, str(tmp_path))
    [(step1, value1), (step2, value2)] = [(r["best_step"], r["eval/pearson"]) for r in out["rows"]]
    assert (step1, value1) == (4, 0.5)  # the later of the tied best, not a nan step
    assert step2 == 2 and value2 != value2  # none defined: the latest, nan
    markdown = (tmp_path / "results.md").read_text()
    assert "| 1 | 0.5000 | 0.5000 |" in markdown and "learning_rate=0.001 (0.5000)" in markdown
    assert "| nan |" in markdown and "| 0.002 | 1 (1 nan) | nan | nan |" in markdown


def test_a_setting_whose_seeds_are_mostly_nan_ranks_below_one_whose_seeds_are_defined():
    # Over seeds, a nan trial counts below every number: 0.90 on one seed of three (the other
    # two undefined) is not a better setting than 0.85 on all three.
    from bert_jax.commands import sweep

    config = sweep.sweep_config(f"{REPO}/configs/glue.py:stsb,tiny",
                                {"optimizer.learning_rate": (1e-3, 2e-3), "seed": (1, 2, 3)})
    groups = {(1e-3,): [0.90, math.nan, math.nan], (2e-3,): [0.85, 0.85, 0.85]}
    markdown = sweep._markdown(config, [], "eval/pearson", groups)
    assert "| 0.001 | 3 (2 nan) | nan | 0.9000 |" in markdown, markdown
    assert "| 0.002 | 3 | 0.8500 | 0.8500 |" in markdown, markdown
    assert "Best setting by median eval/pearson: optimizer.learning_rate=0.002 (0.8500)" in markdown


def test_an_empty_workdir_writes_nothing_in_the_current_directory(cli, tmp_path, monkeypatch):
    # The table's snapshot covers runs and results; an empty --workdir would mean "here".
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(PRETRAIN.replace("configs/", f"{REPO}/configs/").replace("{tmp}/w", "''"))
    code, _, err = cli(argv)
    assert code == 2 and "--workdir is empty" in err and list(tmp_path.iterdir()) == []


def test_the_table_covers_every_area():
    areas = {"config": CONFIG_CASES, "data": DATA_CASES, "checkpoint": CHECKPOINT_CASES,
             "conversion": CONVERT_CASES, "features": FEATURES_CASES, "eval": EVAL_CASES,
             "sweep": SWEEP_CASES, "vocab": VOCAB_CASES, "export and features": EXPORT_CASES,
             "translate": TRANSLATE_CASES, "eval of another task": EVAL_TASK_CASES,
             "sweep trials": SWEEP_TRIAL_CASES, "average": AVERAGE_CASES,
             "run values": RUN_VALUE_CASES, "tfds": TFDS_CASES, "plot": PLOT_CASES,
             "info": INFO_CASES, "prepare": PREPARE_CASES, "launch": LAUNCH_CASES,
             "attention": ATTENTION_CASES, "optimizer": OPTIM_CASES,
             "modern optimizer": MODERN_OPTIM_CASES, "RoBERTa": ROBERTA_CASES,
             "attention patterns": PATTERN_CASES, "attention on GPU": ATTENTION_GPU_CASES,
             "ModernBERT in and out": MODERNBERT_HF_CASES,
             "MLM only": MLM_ONLY_CASES, "modern encoder": MODERN_ENCODER_CASES,
             "tokenizer.json": TOKENIZER_JSON_CASES, "output paths": OUTPUT_PATH_CASES,
             "embeddings": EMBED_CASES}
    assert len(CASES) > 100 and all(areas.values())
    assert len({c.id for c in CASES}) == len(CASES)


# --- Folders the user cannot write ----------------------------------------------------------

@pytest.fixture
def locked(tmp_path):
    """A folder of the test nobody may write into: chmod 555 (a user's own folder shared
    read-only), or, as root (whom permission bits do not stop), the immutable attribute; the
    errors differ (EACCES, EPERM) and so does the advice. Skips where neither can be set."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder, "not writable by you"
        folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("running as root where `chattr +i` is refused: no folder can be made unwritable")
    try:
        yield folder, "the system does not allow it there"
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


UNWRITABLE = [  # (id, argv: {locked} is the folder; the error line names the path given)
    ("vocab-out", "vocab --input {tmp}/in.txt --size 60 --type wordpiece --out {locked}/vocab"),
    ("average-out", "average --workdir {run} --last 1 --out {locked}/avg"),
    ("export-hf", "export {run} hf:{locked}/hf"),
    ("convert-out", "convert hf:{hf} {locked}/converted"),
    ("features-output", FEATURES.replace("{tmp}/out.jsonl", "{locked}/f.jsonl")),
    ("embed-output", "embed --checkpoint {ckpt} --input {tmp}/in.txt --output {locked}/e.npy"),
    ("plot-out", "plot --workdir {run} --out {locked}/p.png"),
    ("translate-output", "translate --checkpoint {mt} --input {tmp}/in.txt --output {locked}/t.txt"),
    ("train-workdir", PRETRAIN.replace("{tmp}/w", "{locked}/w")),
]


@pytest.mark.parametrize("argv", [a for _, a in UNWRITABLE], ids=[i for i, _ in UNWRITABLE])
def test_an_unwritable_output_is_one_line_and_loses_nothing(argv, locked, shared, cli, tmp_path):
    folder, says = locked
    write(tmp_path / "in.txt", "the cat sat on the mat\nhello world good movie\n" * 20)
    before = snapshot(shared.values())
    code, _, err = cli(shlex.split(argv.format(**{k: str(v) for k, v in shared.items()},
                                               tmp=tmp_path, locked=folder)))
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("bert-jax")]
    assert (code, line.split(": error: ")[0]) == (1, f"bert-jax {argv.split()[0]}"), line
    # (the OS's reason with its advice, or the command's own words for the same)
    assert str(folder) in line and any(s in line for s in (says, "cannot write", "not writable")), line
    assert list(folder.iterdir()) == [] and snapshot(shared.values()) == before


@pytest.mark.parametrize("err, argv, says", [
    # what a user's own read-only folder gives (EACCES; root is not stopped by it, so the test
    # above meets it only when not run as root): a flag's output, an input, a positional path
    (errno.EACCES, "vocab --input {tmp}/in.txt --out {tmp}/v", "--out={tmp}/v: permission denied "
     "(not writable by you; choose a folder you can write to, or change its permissions)"),
    (errno.EACCES, "embed --checkpoint {tmp}/c --input {tmp}/in.txt --output {tmp}/v",
     "--output={tmp}/v: permission denied (not writable by you"),
    (errno.EACCES, "vocab --input {tmp}/v --out {tmp}/x", "--input={tmp}/v: permission denied "
     "(not readable by you)"),
    (errno.EACCES, "export {tmp}/run hf:{tmp}/v", "{tmp}/v: permission denied (not readable or "
     "not writable by you; check its permissions)"),
    (errno.EROFS, "vocab --input {tmp}/in.txt --out {tmp}/v", "--out={tmp}/v: read-only file system "
     "(a read-only file system; choose a folder on a writable one)"),
    # the flag whose path holds the file most closely: --out inside --workdir is --out's
    (errno.EACCES, "plot --workdir {tmp} --out {tmp}/v", "--out={tmp}/v: permission denied (not "
     "writable by you"),
    # a run's own files are read and written (a resume): no side guessed
    (errno.EACCES, "plot --workdir {tmp}", "--workdir={tmp}: {tmp}/v: permission denied (not "
     "readable or not writable by you"),
])
def test_an_os_refusal_is_named_with_what_to_do(err, argv, says, tmp_path):
    """The line an OS error on a path becomes (commands._named) for the errors a locked folder
    gives, by whether the command writes that path."""
    from absl import flags

    from bert_jax import commands
    args = shlex.split(argv.format(tmp=tmp_path))
    flags.FLAGS(["bert-jax", *args[1:]])
    try:
        error = OSError(err, os.strerror(err), str(tmp_path / "v"))
        assert commands._named(error, commands.COMMANDS[args[0]]).startswith(says.format(tmp=tmp_path))
    finally:
        flags.FLAGS.unparse_flags()
