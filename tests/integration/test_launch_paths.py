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
    # train's own refusals of the keys naming the data (a dry run reads no gs:// path)
    ("configs/bert_pretrain.py:base", [], "data.tokenizer is empty"),
    ("configs/bert_pretrain.py:base", ["data.tokenizer=gs://b/vocab", "data.train_files= , "],
     "data.train_files=' , ': no files given"),
    ("configs/bert_pretrain.py:base", ["data.name=array_record", "data.tokenizer=gs://b/vocab"],
     "data.train_files='': no files given"),
    ("configs/glue.py:mrpc", ["init_from=gs://b/bert_base"], "data.data_dir is empty"),
    ("configs/glue.py:mrpc", ["init_from=/tmp/bert", "data.data_dir=gs://b/glue"], "init_from=/tmp/bert"),
])
def test_paths_the_workers_cannot_read_are_refused(spec, overrides, said):
    config = config_lib.load(str(REPO / spec), overrides)
    with pytest.raises((ValueError, FileNotFoundError), match=said.replace("[", r"\[").replace("]", r"\]")):
        launch.check_worker_paths(config, REPO)


def test_gs_and_repository_paths_pass():
    config = config_lib.load(str(REPO / "configs/glue.py:mrpc"), [
        "init_from=gs://b/bert_base", "data.data_dir=gs://b/glue",
        "data.tokenizer=tests/fixtures/tf_bert_tiny"])
    launch.check_worker_paths(config, REPO)
    launch.check_worker_paths(config_lib.load(str(REPO / "configs/bert_pretrain.py:base"),
                                              ["data.name=synthetic"]), REPO)


class _Planned(Exception):
    """Raised where plan would start checking and compiling: the config it would compile."""


@pytest.mark.parametrize("overrides, layers, width", [
    ([], 1, 32),  # the checkpoint's sizes, as training takes them
    (["model.num_layers=1"], 1, 32),  # set to the checkpoint's own value: fine
])
def test_plan_compiles_the_model_init_from_gives(monkeypatch, overrides, layers, width):
    from bert_jax.cloud import plan

    def stop(config, **_):
        raise _Planned(config)
    monkeypatch.setattr(plan.tpu, "compile_only_devices", lambda s: [None] * s.chips)
    monkeypatch.setattr(plan.setup, "check", stop)
    config = config_lib.load(str(REPO / "configs/glue.py:sst2,tiny"),
                             ["init_from=tests/fixtures/bert_tiny_a208b4f", *overrides])
    config.init_from = str(REPO / config.init_from)
    with pytest.raises(_Planned) as e:
        plan.plan(config, "v5litepod-8", set_by_user={o.partition("=")[0] for o in overrides})
    model = e.value.args[0].model
    assert (model.num_layers, model.emb_dim) == (layers, width)


@pytest.mark.parametrize("version", ["tpu-ubuntu2204-base", "v2-alpha-tpuv6e", "v2-alpha-tpuv5-lite",
                                     "v2-alpha-tpuv5", "tpu-vm-tf-2.16.1-pod-pjrt"])
def test_real_runtime_versions_pass(version):
    launch.check_flags("bert-1", "us-central2-b", "v4-8", 0, 30.0, runtime_version=version)


@pytest.mark.parametrize("version", ["", "TPU-Ubuntu2204-Base", "tpu ubuntu", "v2-alpha-tpuv6e-",
                                     "tpu_ubuntu2204_base", "v2-alpha/tpuv6e", "-v2"])
def test_a_runtime_version_gcloud_would_reject_is_refused(version):
    with pytest.raises(ValueError, match=r"--runtime_version=.*lowercase letters, digits, dots and hyphens"):
        launch.check_flags("bert-1", "us-central2-b", "v4-8", 0, 30.0, runtime_version=version)


def test_a_workdir_holding_another_runs_checkpoint_is_refused_before_renting(tmp_path):
    import json
    import shutil

    from helpers import FIXTURES

    from bert_jax.cloud import bringup
    from bert_jax.config import ConfigError
    from bert_jax.training import checkpoint

    run = tmp_path / "run"
    bringup.check_workdir(str(run), dry_run=False, config={"model": {"name": "bert"}})  # none yet
    shutil.copytree(FIXTURES / "bert_tiny_a208b4f", run, dirs_exist_ok=True)
    own = checkpoint.read_config(run)
    bringup.check_workdir(str(run), dry_run=False, config=own)
    with pytest.raises(ConfigError) as e:
        bringup.check_workdir(str(run), dry_run=False,
                              config={**own, "model": {**own["model"], "num_layers": 3}})
    assert str(e.value).startswith(f"checkpoint {run}/checkpoints/2 holds a different model than "
                                   "this config (model.num_layers: 1 in the checkpoint, 3 here)")
    other = json.loads(config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny")).to_json())
    with pytest.raises(ConfigError, match="model.emb_dim: 32 in the checkpoint, 128 here"):
        bringup.check_workdir(str(run), dry_run=False, config=other)


def test_a_dry_run_reads_no_gs_init_from(cli, monkeypatch):
    from bert_jax.training import checkpoint

    def no_network(*args, **kwargs):
        raise AssertionError("a dry run read a checkpoint")
    monkeypatch.setattr(checkpoint, "read_config", no_network)
    code, _, err = cli(["launch", "--config", "configs/glue.py:sst2,tiny", "--topology", "v4-8",
                        "--workdir", "gs://b/run", "--name", "bert-tiny", "--zone", "us-central2-b",
                        "--repo", "https://example.org/bert_jax.git", "--dry_run", "--skip_plan",
                        "--config.data.data_dir=gs://b/glue", "--config.init_from=gs://b/bert"])
    assert code == 0, err
    assert "warning: dry run: init_from=gs://b/bert is not read (no network)" in err
