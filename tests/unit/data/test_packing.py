"""Packed fine-tuning batches (data/packing.pack_batch): every example is in the rows exactly
once, intact, with its own positions; the model gives each example the same outputs packed or
alone (classification, tagging, multiple choice); and a fine-tune with dropout off gives the
same losses and dev metric packed as unpacked, with and without gradient accumulation."""

import json
import os
import socket
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, xla_flags

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.data import finetune, packing
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import glue
from bert_jax.training import input as pipelines
from bert_jax.training import objectives, train

TINY = dict(vocab_size=97, emb_dim=32, num_layers=2, num_heads=4, head_dim=8, mlp_dim=64, max_len=64)


def random_batch(B, T, seed, choices=0, min_len=3):
    """A batch of B examples ([B, T] or [B, C, T]) of random lengths, with pair segments."""
    rng = np.random.default_rng(seed)
    shape = (B, choices, T) if choices else (B, T)
    lengths = rng.integers(min_len, T + 1, shape[:-1])
    lengths[rng.random(shape[:-1]) < 0.6] //= 4  # mostly short, as GLUE sentences
    lengths = np.maximum(lengths, min_len)
    pos = np.arange(T)
    mask = (pos < lengths[..., None]).astype(np.int32)
    ids = rng.integers(5, 97, shape).astype(np.int32) * mask
    segments = ((pos >= lengths[..., None] // 2) * mask).astype(np.int32)
    batch = {"input_ids": ids, "token_type_ids": segments, "attention_mask": mask,
             "label_ids": rng.integers(0, 2, B).astype(np.int32)}
    if not choices:
        batch["label_weights"] = (mask * (rng.random((B, T)) < 0.5)).astype(np.float32)
        batch["tag_ids"] = rng.integers(0, 3, (B, T)).astype(np.int32)  # tagging's label_ids
    return batch


@pytest.mark.parametrize("microbatches,choices", [(1, 0), (2, 0), (4, 0), (1, 4), (2, 4)])
def test_every_example_is_packed_once_intact_with_its_own_positions(microbatches, choices):
    B, T = 32, 40
    batch = random_batch(B, T, seed=microbatches + choices, choices=choices)
    batch.pop("tag_ids", None)
    packed = packing.pack_batch(batch, row_multiple=2, microbatches=microbatches,
                                 token_index=not choices)
    rows = len(packed["input_ids"])
    assert rows in [microbatches * r for r in packing.row_buckets(B * max(choices, 1) // microbatches, 2)]
    assert packed["segment_ids"].astype(bool).sum() == batch["attention_mask"].sum()  # nothing lost
    if microbatches < 4:  # (4 microbatches of 8 long-tailed examples may need all their rows)
        assert rows < B * max(choices, 1)  # short examples share rows
    np.testing.assert_array_equal(packed["label_ids"], batch["label_ids"])  # examples keep order
    seqs = {k: batch[k].reshape(-1, T) for k in packing.TOKENS}
    cls = packed["cls_index"].reshape(-1)
    for s in range(len(cls)):
        example = s // max(choices, 1)
        m = example % microbatches  # the train step gives microbatch m rows m, m+k, ...
        flat = {k: packed[k][m::microbatches].reshape(-1) for k in packing.ROW_KEYS}
        n = int(seqs["attention_mask"][s].sum())
        at = cls[s] + np.arange(n)
        np.testing.assert_array_equal(flat["input_ids"][at], seqs["input_ids"][s, :n])
        np.testing.assert_array_equal(flat["token_type_ids"][at], seqs["token_type_ids"][s, :n])
        np.testing.assert_array_equal(flat["positions"][at], np.arange(n))
        assert len(set(flat["segment_ids"][at])) == 1 and flat["segment_ids"][at][0] > 0
        assert cls[s] // T == (cls[s] + n - 1) // T  # within one row
        if not choices:
            np.testing.assert_array_equal(packed["token_index"][s, :n], at)
    for key in ("segment_ids",):  # packed-sequence ids are 1, 2, ... along each row
        for row in packed[key]:
            ids = row[row > 0]
            assert list(dict.fromkeys(ids)) == list(range(1, len(set(ids)) + 1))


def test_padding_examples_of_an_eval_batch_take_no_room():
    batch = finetune.pad_batch({k: v[:5] for k, v in random_batch(8, 16, seed=3).items()
                                if k != "tag_ids"}, 8)
    packed = packing.pack_batch(batch, row_multiple=1)
    assert packed["segment_ids"].astype(bool).sum() == batch["attention_mask"].sum()
    np.testing.assert_array_equal(packed["example_weight"], [1] * 5 + [0] * 3)


@pytest.mark.parametrize("name", ["bert_classification", "bert_tagging", "bert_choice"])
def test_each_example_has_the_same_outputs_packed_or_alone(name):
    """The packed forward equals the padded one for every example, to float rounding."""
    labels = {} if name == "bert_choice" else {"num_labels": 3}
    model_cfg = models.model_section(name, {**models.bert_model_fields("tiny"), **TINY}, **labels)
    model = models.create_model(model_cfg)
    objective = objectives.for_model(model_cfg)
    choices = 4 if name == "bert_choice" else 0
    batch = random_batch(12, 24, seed=5, choices=choices)
    tags = batch.pop("tag_ids", None)
    if name == "bert_tagging":
        batch["label_ids"] = tags
    else:
        batch.pop("label_weights", None)
    packed = packing.pack_batch(batch, row_multiple=1, token_index=name == "bert_tagging")
    assert len(packed["input_ids"]) < 12 * max(choices, 1)
    alone = objective.forward(model, {k: jnp.asarray(v) for k, v in batch.items()}, None)["logits"]
    together = objective.forward(model, {k: jnp.asarray(v) for k, v in packed.items()}, None)["logits"]
    assert together.shape == alone.shape
    if name == "bert_tagging":  # compare the real tokens (padding positions carry no loss)
        real = batch["attention_mask"].astype(bool)
        np.testing.assert_allclose(np.asarray(together)[real], np.asarray(alone)[real], atol=2e-5)
    else:
        np.testing.assert_allclose(together, alone, atol=2e-5)
    # And the loss terms and metrics, which the train step and evaluation use.
    loss_b = objective.loss({"logits": alone}, {k: jnp.asarray(v) for k, v in batch.items()})
    loss_p = objective.loss({"logits": together}, {k: jnp.asarray(v) for k, v in packed.items()})
    np.testing.assert_allclose(loss_p[0]["task"], loss_b[0]["task"], rtol=1e-5)


def _losses(workdir) -> dict[int, float]:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in lines if "loss" in m}


@pytest.fixture(scope="module")
def sst2_vocab(shared_data, tmp_path_factory):
    lines = [e.text_a for e in glue.read_glue("sst2", shared_data / "glue/SST-2/train.tsv")[:5000]]
    return tokenizer_lib.train_vocab(lines, size=2000, kind="wordpiece", lowercase=True,
                                     out_dir=tmp_path_factory.mktemp("sst2_vocab"))


def sst2_overrides(shared_data, sst2_vocab, *more: str) -> list[str]:
    """Real SST-2 sentences, dropout off, 12 steps, 8 devices (data 4 x fsdp 2)."""
    return [f"data.data_dir={shared_data / 'glue'}", f"data.tokenizer={sst2_vocab}",
            "model.vocab_size=2000", "model.dropout_rate=0.0", "model.attention_dropout_rate=0.0",
            "data.max_train_examples=640", "data.max_seq_length=64", "train.steps=12",
            "train.log_every=1", "train.eval_every=12", "train.batch_size=32", "mesh.data=4",
            "mesh.fsdp=2", *more]


@pytest.fixture(scope="module")
def padded_run(shared_data, sst2_vocab, tmp_path_factory):
    config = config_lib.load(str(REPO / "configs" / "glue.py:sst2,tiny"),
                             sst2_overrides(shared_data, sst2_vocab, "data.pack=false"))
    workdir = tmp_path_factory.mktemp("padded")
    return train.train_and_evaluate(config, str(workdir)), _losses(workdir)


def assert_same_run(packed, packed_losses, padded_run):
    padded, padded_losses = padded_run
    assert sorted(packed_losses) == list(range(1, 13))
    for step, loss in padded_losses.items():
        assert packed_losses[step] == pytest.approx(loss, rel=2e-4), step
    # (float rounding may tip a near-tied prediction: at most one of SST-2's 872 dev sentences)
    assert abs(packed["eval/accuracy"] - padded["eval"]["eval/accuracy"]) <= 1 / 872 + 1e-9
    assert packed["eval/loss"] == pytest.approx(padded["eval"]["eval/loss"], rel=2e-4)


@pytest.mark.slow
def test_a_fine_tune_gives_the_same_losses_and_dev_accuracy_packed_or_padded(
        shared_data, sst2_vocab, tmp_path, padded_run):
    """The same examples in each step, so packing changes only float rounding; here with 2
    microbatches per step (each packed on its own). One batch per step, packed, is the run of
    the two-process test below: it too must equal the single-process padded run."""
    config = config_lib.load(str(REPO / "configs" / "glue.py:sst2,tiny"), sst2_overrides(
        shared_data, sst2_vocab, "data.pack=true", "train.grad_accum_steps=2"))
    packed = train.train_and_evaluate(config, str(tmp_path))
    assert_same_run(packed["eval"], _losses(tmp_path), padded_run)


@pytest.mark.slow
def test_two_processes_pack_the_same_batches(shared_data, sst2_vocab, tmp_path, padded_run):
    """Multi-host as on a pod (2 processes x 4 devices): each packs the global batch and passes
    its examples and its rows; the run equals the single-process padded one (so packing one
    batch per step changes only float rounding, and so do a pod's hosts), and its checkpoints,
    written by both processes, are all committed."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    args = [f"--config.{o}" for o in sst2_overrides(shared_data, sst2_vocab, "data.pack=true",
                                                    "train.checkpoint_every=4",
                                                    "train.keep_checkpoints=3")]
    # Each process's stderr to a file: a pipe read only after the other process ends could
    # fill and stop its writer in the middle of a collective, and with it both processes.
    workdir, procs = tmp_path / "run", []
    for i in range(2):
        with (tmp_path / f"process{i}.stderr").open("w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "bert_jax", "train",
                 f"--config={REPO / 'configs/glue.py'}:sst2,tiny", f"--workdir={workdir}", *args],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
                env=dict(os.environ, XLA_FLAGS=xla_flags(4, few_steps=True),
                         JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                         JAX_PROCESS_ID=str(i))))
    for i, proc in enumerate(procs):
        proc.wait(timeout=600)
        assert proc.returncode == 0, (tmp_path / f"process{i}.stderr").read_text()[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert_same_run(summary["eval"], _losses(workdir), padded_run)
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [4, 8, 12]


def test_squad_is_not_packed_and_says_so_when_asked():
    config = config_lib.load(str(REPO / "configs" / "squad.py:v1,tiny"), [])
    assert pipelines.pack_options(config_lib.resolve(config), train=True) is None
    config.data.pack = True
    with pytest.raises(config_lib.ConfigError, match="data.pack=false"):
        pipelines.pack_options(config_lib.resolve(config), train=True)
