"""`eval --config ... --config.model.<key>=...`: the checkpoint decides the model, so a key it
decides (its size, its architecture) set on the command line to another value is refused
naming it, where it used to be dropped without a word; a key of how the model runs
(attention_kernel, scan_layers) applies, and is checked as in training."""

import shutil

import pytest
from helpers import FIXTURES

EVAL = ["eval", "--config", "configs/bert_pretrain.py:tiny", "--config.data.name=synthetic",
        "--config.model.vocab_size=128", "--config.data.max_seq_length=32",
        "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=8"]


@pytest.fixture
def run(tmp_path):
    """A tiny BERT pretraining run (1 layer, width 32) with a checkpoint at step 2."""
    shutil.copytree(FIXTURES / "bert_tiny_a208b4f", tmp_path / "run")
    return tmp_path / "run"


def test_a_model_key_the_checkpoint_decides_is_refused(cli, run):
    code, _, err = cli([*EVAL, "--workdir", str(run), "--config.model.num_layers=3"])
    assert code == 1
    assert "--config.model.num_layers=3: the checkpoint in" in err and "decides model.num_layers (1)" in err


def test_a_run_key_applies_and_is_checked(cli, run):
    code, _, err = cli([*EVAL, "--workdir", str(run), "--config.model.attention_kernel=nope"])
    assert code == 1 and "'nope'" in err and "attention" in err, err
