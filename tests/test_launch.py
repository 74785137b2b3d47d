"""`bert-jax launch` against a fake `gcloud` on PATH that records every call and plays the
states of a queued resource (waiting, active, suspended by preemption, failed)."""

import json
import os
import stat

import pytest
from conftest import REPO

from bert_jax.cloud import tpu

CONFIG = str(REPO / "configs/bert_pretrain.py:tiny")
SMALL = ["--config.model.vocab_size=128", "--config.model.num_layers=1",
         "--config.train.batch_size=32", "--config.data.max_seq_length=16",
         "--config.data.max_predictions_per_seq=3", "--config.mesh.data=-1"]
FAKE = '''#!{python}
import json, os, sys
d = os.environ["FAKE_GCLOUD_DIR"]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open(os.path.join(d, "script.json")) as f:
    script = json.load(f)

def pop(key):  # the next scripted answer; the last one repeats
    values = script[key]
    value = values.pop(0) if len(values) > 1 else values[0]
    with open(os.path.join(d, "script.json"), "w") as f:
        json.dump(script, f)
    return value

args = sys.argv[1:]
if args[2:4] == ["queued-resources", "describe"]:
    print(pop("states"))
elif "ssh" in args:
    command = [a for a in args if a.startswith("--command=")][0]
    sys.exit(pop("train_exit" if "bert-jax train" in command else "setup_exit"))
elif args[:2] == ["storage", "cat"]:  # the workdir's goodput.json, if the script has one
    print(json.dumps(script["goodput"])) if script.get("goodput") else sys.exit(1)
'''


@pytest.fixture
def gcloud(tmp_path, monkeypatch):
    """Installs the fake gcloud; returns (set its script, read its calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gcloud"
    fake.write_text(FAKE.format(python=os.path.realpath(os.sys.executable)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GCLOUD_DIR", str(tmp_path))

    def script(states=("ACTIVE",), train_exit=(0,), setup_exit=(0,), goodput=None):
        (tmp_path / "script.json").write_text(json.dumps(
            {"states": list(states), "train_exit": list(train_exit), "setup_exit": list(setup_exit),
             "goodput": goodput}))

    def calls() -> list[str]:
        """Each call on the capacity as 'verb' words: create, describe, setup, train, delete
        (reads of the workdir, `storage cat`, left out)."""
        path = tmp_path / "calls.jsonl"
        out = []
        for line in (path.read_text().splitlines() if path.exists() else []):
            args = json.loads(line)
            if args[:2] == ["storage", "cat"]:
                continue
            if "ssh" in args:
                out.append("train" if any("bert-jax train" in a for a in args) else "setup")
            else:
                out.append(args[3])
        return out

    script()
    return script, calls


def launch_argv(*extra):
    return ["launch", "--config", CONFIG, *SMALL, "--topology", "v4-8", "--workdir", "gs://bucket/run",
            "--name", "bert-tiny", "--zone", "us-central2-b", "--repo", "https://example.org/bert_jax.git",
            "--commit", "0123abc", "--poll_seconds", "0", "--skip_plan", *extra]


def test_waits_for_capacity_sets_up_trains_and_deletes(cli, gcloud):
    script, calls = gcloud
    script(states=["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
    code, out, err = cli(launch_argv("--spot"))
    assert code == 0, err
    assert calls() == ["create", "describe", "describe", "describe", "describe", "setup", "train", "delete"]
    for state in ("WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"):
        assert out.count(f"queued resource bert-tiny: {state}") == 1
    assert "--accelerator-type=v4-8" in out and "--spot" in out
    assert "--runtime-version=tpu-ubuntu2204-base" in out
    assert "git checkout --quiet --force 0123abc" in out and "rm -f /tmp/libtpu_lockfile" in out
    assert "bert-jax train --workdir gs://bucket/run --config configs/bert_pretrain.py:tiny" in out
    assert "gs://bucket/run/logs/worker_$W.log" in out
    assert json.loads(out.splitlines()[-1]) == {"restarts": 0}


def test_preemption_requeues_and_resumes(cli, gcloud):
    script, calls = gcloud
    script(states=["ACTIVE", "SUSPENDED", "ACTIVE"], train_exit=[255, 0])
    code, out, err = cli(launch_argv())
    assert code == 0, err
    assert calls() == ["create", "describe", "setup", "train", "describe", "delete",
                       "create", "describe", "setup", "train", "delete"]
    assert "preempted (SUSPENDED); requesting it again (restart 1 of 3)" in err
    assert json.loads(out.splitlines()[-1]) == {"restarts": 1}


def test_the_summary_reports_goodput_per_restart(cli, gcloud):
    script, calls = gcloud
    attempt = {"start_step": 0, "step": 47, "wall_s": 100.0, "init_s": 5.0, "compile_s": 10.0,
               "data_s": 1.0, "train_s": 80.0, "eval_s": 2.0, "save_s": 1.0, "redone_steps": 0,
               "redone_s": 0.0}
    resumed = {**attempt, "start_step": 40, "step": 100, "train_s": 60.0, "wall_s": 70.0,
               "redone_steps": 7, "redone_s": 12.0}
    script(states=["ACTIVE", "SUSPENDED", "ACTIVE"], train_exit=[255, 0],
           goodput={"attempts": [attempt, resumed], "saves": [[40, 68.0], [100, 140.0]]})
    code, out, err = cli(launch_argv())
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["restarts"] == 1
    g = summary["goodput"]
    assert g["goodput"] == round((140 - 12) / 170, 4) and g["redone_steps"] == 7
    assert [a["steps"] for a in g["attempts"]] == ["0-47", "40-100"]
    assert g["attempts"][0]["lost_steps"] == 7 and g["attempts"][0]["goodput"] == round(68 / 100, 4)
    assert "goodput 75.3% over 2 run(s): steps 0-47 68.0%; steps 40-100 85.7%" in out
    assert "storage cat gs://bucket/run/goodput.json" in out


def test_too_many_preemptions_stop_and_delete(cli, gcloud):
    script, calls = gcloud
    script(states=["ACTIVE", "SUSPENDED"] * 3, train_exit=[255])
    code, _, err = cli(launch_argv("--max_restarts", "1"))
    assert code == 1 and "preempted 2 times (--max_restarts=1)" in err
    assert calls().count("create") == 2 and calls()[-1] == "delete"


def test_failed_capacity_is_an_error_and_deleted(cli, gcloud):
    script, calls = gcloud
    script(states=["WAITING_FOR_RESOURCES", "FAILED"])
    code, _, err = cli(launch_argv())
    assert code == 1 and "queued resource bert-tiny FAILED" in err
    assert calls() == ["create", "describe", "describe", "delete"]


def test_setup_is_retried_and_a_failed_training_is_not_restarted(cli, gcloud):
    script, calls = gcloud
    script(setup_exit=[1, 0], train_exit=[1])
    code, _, err = cli(launch_argv())
    assert code == 1 and "training failed on bert-tiny (exit 1, slice ACTIVE)" in err
    assert "gs://bucket/run/logs/" in err and "attempt 1 of 3" in err
    assert calls() == ["create", "describe", "setup", "setup", "train", "describe", "delete"]


def test_keep_leaves_the_slice(cli, gcloud):
    _, calls = gcloud
    code, out, err = cli(launch_argv("--keep"))
    assert code == 0 and "delete" not in calls() and "--keep: bert-tiny is kept" in out


def test_dry_run_prints_every_command_and_runs_none(cli, gcloud):
    _, calls = gcloud
    code, out, err = cli(launch_argv("--dry_run"))
    assert code == 0, err
    assert calls() == []
    printed = [line for line in out.splitlines() if line.startswith("+ gcloud")]
    assert [line.split()[5] for line in printed] == ["create", "describe", "ssh", "ssh", "delete"]


def test_a_local_workdir_is_refused_before_any_call(cli, gcloud):
    _, calls = gcloud
    argv = [a if a != "gs://bucket/run" else "/tmp/run" for a in launch_argv()]
    code, _, err = cli(argv)
    assert code == 1 and "share a gs:// workdir" in err and calls() == []


@pytest.mark.skipif(not tpu.libtpu_installed(), reason="libtpu is not installed: launch plans with it")
@pytest.mark.slow
def test_a_config_that_does_not_fit_is_refused_before_any_call(cli, gcloud):
    _, calls = gcloud
    argv = [a for a in launch_argv("--config.train.batch_size=65536", "--config.data.max_seq_length=512",
                                   "--config.data.max_predictions_per_seq=20") if a != "--skip_plan"]
    argv[argv.index("v4-8")] = "v3-8"
    code, out, err = cli(argv)
    assert code == 1 and "does not fit v3-8 (plan above); refusing to launch" in err, err
    assert "exceeds available HBM" in out and calls() == []
