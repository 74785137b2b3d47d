"""launch refuses, before anything is compiled or rented, a config the slice's workers could not
read: a tokenizer or training files on this machine's disk, a fine-tuning run with no folder
for its files (each dry-ran with exit 0 and would have failed on every worker)."""

import pytest
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax.cloud import launch


@pytest.mark.parametrize("spec, overrides, said", [
    ("configs/bert_pretrain.py:base", ["data.tokenizer=/home/me/vocab",
                                       "data.train_files=gs://b/train-*"], "data.tokenizer=/home/me/vocab"),
    ("configs/bert_pretrain.py:base",
     ["data.tokenizer=gs://b/vocab", "data.train_files=gs://b/a.txt,/tmp/b.txt"],
     "data.train_files[1]=/tmp/b.txt"),
    ("configs/bert_pretrain.py:base", ["data.tokenizer=../vocab"], "data.tokenizer=../vocab"),
    ("configs/glue.py:mrpc", ["init_from=gs://b/bert_base"], "data.data_dir is empty"),
    ("configs/glue.py:mrpc", ["init_from=/tmp/bert", "data.data_dir=gs://b/glue"], "init_from=/tmp/bert"),
])
def test_paths_the_workers_cannot_read_are_refused(spec, overrides, said):
    config = config_lib.load(str(REPO / spec), overrides)
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        launch.check_worker_paths(config, REPO)


def test_gs_and_repository_paths_pass():
    config = config_lib.load(str(REPO / "configs/glue.py:mrpc"), [
        "init_from=gs://b/bert_base", "data.data_dir=gs://b/glue",
        "data.tokenizer=tests/fixtures/tf_bert_tiny"])
    launch.check_worker_paths(config, REPO)
    launch.check_worker_paths(config_lib.load(str(REPO / "configs/bert_pretrain.py:base"),
                                              ["data.name=synthetic"]), REPO)
