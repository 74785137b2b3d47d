"""`bert-jax launch` against a fake `gcloud` on PATH that records every call and plays the
states of a queued resource (waiting, active, suspended by preemption, failed). The checkout it
launches from is a small git repository whose remote (an https URL that git rewrites to a local
bare repository) the checks before creating capacity ask with `git ls-remote`; a fake worker
(python3, uv, git as shell scripts) runs the real setup script."""

import json
import os
import re
import shutil
import stat
import subprocess

import pytest
from helpers import REPO

from bert_jax.cloud import bringup, launch, tpu
from bert_jax.commands import cloud as cloud_commands

URL = "https://example.org/bert_jax.git"
SMALL = ["--config.model.vocab_size=128", "--config.model.num_layers=1",
         "--config.train.batch_size=32", "--config.data.max_seq_length=16",
         "--config.data.max_predictions_per_seq=3", "--config.mesh.data=-1",
         "--config.data.tokenizer=gs://bucket/vocab", "--config.data.train_files=gs://bucket/text/*.txt"]
FAKE = '''#!{python}
import json, os, subprocess, sys
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
    command = [a for a in args if a.startswith("--command=")][0][len("--command="):]
    if "bert-jax train" not in command and script.get("worker"):  # the setup, on a fake worker
        home = script["worker"]
        env = dict(os.environ, HOME=home, PATH=home + "/bin:" + os.environ["PATH"])
        sys.exit(subprocess.run(["bash", "-c", command], cwd=home, env=env).returncode)
    sys.exit(pop("train_exit" if "bert-jax train" in command else "setup_exit"))
elif args[:2] == ["storage", "cat"]:  # the workdir's goodput.json, if the script has one
    print(json.dumps(script["goodput"])) if script.get("goodput") else sys.exit(1)
'''
# A TPU VM stand-in: python3 reports the image's version; `python3 -m venv`, `python3 -m pip
# install --user uv` and `uv venv --python V` make what they would (a .venv whose python reports
# its version); every call is logged to ~/calls.
WORKER = {
    "mkvenv": '''#!/bin/bash
mkdir -p "$1/bin"
printf '#!/bin/bash\\necho "Python %s"\\n' "$2" > "$1/bin/python"
printf '#!/bin/bash\\necho "pip $*" >> "$HOME/calls"\\n' > "$1/bin/pip"
chmod +x "$1/bin/python" "$1/bin/pip"
''',
    "python3": '''#!/bin/bash
echo "python3 $*" >> "$HOME/calls"
if [ "$1" = --version ]; then echo "Python $(cat "$HOME/image_python")"
elif [ "$1 $2" = "-m venv" ]; then mkvenv "$3" "$(cat "$HOME/image_python")"
elif [ "$1 $2" = "-m pip" ]; then
  mkdir -p "$HOME/.local/bin"; cp "$HOME/bin/uv_from_pip" "$HOME/.local/bin/uv"
fi
''',
    "uv_from_pip": '''#!/bin/bash
echo "uv $*" >> "$HOME/calls"
v=$(echo "$*" | sed -n 's/.*--python \\([0-9.]*\\).*/\\1/p')
mkvenv "${@: -1}" "$v.9"
''',
    "git": '''#!/bin/bash
echo "git $*" >> "$HOME/calls"
if [ "$1" = clone ]; then mkdir -p "${@: -1}/.git"; fi
''',
    "sudo": '''#!/bin/bash
echo "sudo $*" >> "$HOME/calls"
''',
}


def git(cwd, *args) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """The repository launch runs from (cloud_commands.ROOT): pyproject.toml and the config, committed
    and pushed to URL (git rewrites URL to a bare repository here); returns its path."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "checkout"
    (root / "configs").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copy(REPO / "configs/bert_pretrain.py", root / "configs")
    for key, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                       "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull,
                       "GIT_CONFIG_COUNT": "1",
                       "GIT_CONFIG_KEY_0": f"url.file://{tmp_path}/remote.git.insteadOf",
                       "GIT_CONFIG_VALUE_0": URL}.items():
        monkeypatch.setenv(key, value)
    git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "config")
    git(tmp_path, "clone", "--quiet", "--bare", str(root), str(tmp_path / "remote.git"))
    monkeypatch.setattr(cloud_commands, "ROOT", root)
    return root


@pytest.fixture
def workdirs(monkeypatch):
    """The gs:// workdirs probed for writing (a stand-in bucket: a name with 'readonly' in it
    refuses writes as GCS would)."""
    probed, real = [], bringup.check_workdir

    def check(workdir, dry_run, config=None):
        if dry_run:  # names the check, touches nothing
            return real(workdir, dry_run, config)
        probed.append(workdir)
        if "readonly" in workdir:
            raise bringup.PreflightError(f"cannot write to the workdir {workdir} (Forbidden: 403)")
    monkeypatch.setattr(bringup, "check_workdir", check)
    return probed


@pytest.fixture
def gcloud(tmp_path, monkeypatch, checkout, workdirs):
    """Installs the fake gcloud; returns (set its script, read its calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gcloud"
    fake.write_text(FAKE.format(python=os.path.realpath(os.sys.executable)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GCLOUD_DIR", str(tmp_path))

    def script(states=("ACTIVE",), train_exit=(0,), setup_exit=(0,), worker=None, goodput=None):
        (tmp_path / "script.json").write_text(json.dumps(
            {"states": list(states), "train_exit": list(train_exit), "setup_exit": list(setup_exit),
             "worker": worker and str(worker), "goodput": goodput}))

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


def launch_argv(*extra, commit=None):
    root = cloud_commands.ROOT  # the checkout fixture's
    return ["launch", "--config", str(root / "configs/bert_pretrain.py:tiny"), *SMALL, "--topology",
            "v4-8", "--workdir", "gs://bucket/run", "--name", "bert-tiny", "--zone", "us-central2-b",
            "--repo", URL, "--commit", commit or git(root, "rev-parse", "HEAD"), "--poll_seconds", "0.001",
            "--skip_plan", *extra]


def fake_worker(path, image_python: str):
    """A TPU VM's home folder whose python3 reports `image_python`."""
    (path / "bin").mkdir(parents=True)
    for name, text in WORKER.items():
        (path / "bin" / name).write_text(text)
        (path / "bin" / name).chmod(0o755)
    (path / "image_python").write_text(image_python)
    return path


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
    commit = git(cloud_commands.ROOT, "rev-parse", "HEAD")
    assert f"git checkout --quiet --force {commit}" in out and "rm -f /tmp/libtpu_lockfile" in out
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
    # The setup it shows: this machine's Python (uv where the image's differs), the locked versions.
    import importlib.metadata
    here = bringup.default_python()
    assert f"uv venv --quiet --seed --python {here} .venv" in out and "python3 -m venv .venv" in out
    assert f"jax=={importlib.metadata.version('jax')}" in out and "-c ../bert_jax.lock -e " in out
    # What it did not run: the remote and the bucket are named.
    assert f"dry run: a launch checks here that {URL} has" in out
    assert "dry run: a launch checks here that gs://bucket/run is writable" in out


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
    argv[argv.index("us-central2-b")] = "europe-west4-a"  # a zone with v3 TPUs
    code, out, err = cli(argv)
    assert code == 1 and "does not fit v3-8 (plan above); refusing to launch" in err, err
    assert "exceeds available HBM" in out and calls() == []


def test_the_python_version_is_the_one_pyproject_requires():
    import tomllib
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == ">=" + ".".join(map(str, bringup.PYTHON_MIN))


def test_a_worker_with_python_3_10_gets_this_python_from_uv_and_the_locked_versions(cli, gcloud, tmp_path):
    script, calls = gcloud
    worker = fake_worker(tmp_path / "worker", "3.10.12")  # Ubuntu 22.04's python3
    script(worker=worker)
    code, out, err = cli(launch_argv())
    assert code == 0, err
    assert calls() == ["create", "describe", "setup", "train", "delete"]
    ran = (worker / "calls").read_text().splitlines()
    here = bringup.default_python()
    assert "python3 -m pip install --quiet --user uv" in ran
    assert f"uv venv --quiet --seed --python {here} .venv" in ran
    assert "pip install --quiet -c ../bert_jax.lock -e .[tpu]" in ran
    assert not any(line.startswith("python3 -m venv") for line in ran)
    pins = (worker / "bert_jax.lock").read_text().splitlines()
    import importlib.metadata
    assert f"jax=={importlib.metadata.version('jax')}" in pins and "torch" not in str(pins).lower()
    assert f"workers: Python {here}, bert_jax[tpu] with {len(pins)} packages pinned" in out

    # Set up again (a retry, a restart on the same VM): the virtualenv of that version is kept.
    (worker / "calls").unlink()
    assert subprocess.run(["bash", "-c", launch.setup_script(launch.Launch(
        "n", "z", "v4-8", "gs://b/r", [], URL, "c0ffee", lock=("jax==1",)))], cwd=worker,
        env=dict(os.environ, HOME=str(worker), PATH=f"{worker}/bin:{os.environ['PATH']}")).returncode == 0
    ran = (worker / "calls").read_text()
    assert "uv venv" not in ran and "pip install --user" not in ran and "-c ../bert_jax.lock" in ran


def test_a_worker_whose_python3_is_this_version_uses_it(cli, gcloud, tmp_path):
    script, _ = gcloud
    worker = fake_worker(tmp_path / "worker", f"{bringup.default_python()}.4")
    script(worker=worker)
    code, _, err = cli(launch_argv())
    assert code == 0, err
    ran = (worker / "calls").read_text()
    assert "python3 -m venv .venv" in ran and "uv" not in ran


def test_a_commit_missing_from_the_remote_is_refused_before_any_call(cli, gcloud, checkout, workdirs):
    _, calls = gcloud
    (checkout / "notes.txt").write_text("not pushed\n")
    git(checkout, "add", "notes.txt")
    git(checkout, "commit", "--quiet", "-m", "local only")
    code, _, err = cli(launch_argv())
    commit = git(checkout, "rev-parse", "HEAD")
    assert code == 1 and calls() == [] and workdirs == []
    assert f"commit {commit[:12]} is on no branch or tag of {URL}" in err and "git push" in err
    git(checkout, "push", "--quiet", URL, "HEAD:refs/heads/main")  # pushed: it launches
    code, _, err = cli(launch_argv())
    assert code == 0, err
    # An older commit of a pushed branch is there too (the workers' clone has it).
    code, _, err = cli(launch_argv(commit=git(checkout, "rev-parse", "HEAD~1")))
    assert code == 0, err


@pytest.mark.parametrize("repo", ["/home/me/bert_jax", "file:///home/me/bert_jax", "../bert_jax"])
def test_a_remote_on_this_machine_is_refused_even_in_a_dry_run(cli, gcloud, repo):
    _, calls = gcloud
    argv = launch_argv("--dry_run")
    argv[argv.index(URL)] = repo
    code, _, err = cli(argv)
    assert code == 1 and calls() == []
    assert f"--repo {repo} is a path on this machine: the workers clone the repository" in err


def test_an_uncommitted_config_or_an_unwritable_workdir_is_refused_before_any_call(
        cli, gcloud, checkout, workdirs):
    _, calls = gcloud
    config = checkout / "configs/bert_pretrain.py"
    config.write_text(config.read_text() + "# tried here\n")
    code, _, err = cli(launch_argv())
    assert code == 1 and calls() == []
    assert "configs/bert_pretrain.py differs from its copy in commit" in err and "commit it" in err
    git(checkout, "commit", "--quiet", "-am", "tried")
    git(checkout, "push", "--quiet", URL, "HEAD:refs/heads/main")
    code, _, err = cli([a if a != "gs://bucket/run" else "gs://readonly/run" for a in launch_argv()])
    assert code == 1 and calls() == [] and workdirs == ["gs://readonly/run"]
    assert "cannot write to the workdir gs://readonly/run" in err


def test_unknown_commit_or_old_python_is_refused(cli, gcloud):
    _, calls = gcloud
    code, _, err = cli(launch_argv(commit="0123abc"))
    assert code == 1 and "--commit 0123abc is not a commit of the checkout" in err
    code, _, err = cli(launch_argv("--python", "3.10"))
    assert code == 1 and "--python=3.10: bert_jax needs Python >= 3.11" in err
    assert calls() == []


def test_without_git_a_dry_run_shows_placeholders_and_a_launch_needs_repo_and_commit(
        tmp_path, cli, monkeypatch):
    """Launched from a folder that is no git checkout: --repo and --commit are a usage error
    (exit 2) before anything is checked; a dry run shows REPO_URL/COMMIT and says so."""
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs/bert_pretrain.py", tmp_path / "configs")
    monkeypatch.setattr(cloud_commands, "ROOT", tmp_path)
    argv = ["launch", "--config", str(tmp_path / "configs/bert_pretrain.py:tiny"), "--topology",
            "v4-8", "--workdir", "gs://bucket/run", "--name", "bert-tiny", "--zone", "us-central2-b"]
    code, out, err = cli(argv)
    assert code == 2 and "launch needs --repo and --commit (no git checkout here" in err and not out
    src = launch.source(tmp_path, f"{tmp_path}/configs/bert_pretrain.py:tiny", None, None, True)
    assert src == launch.Source("configs/bert_pretrain.py:tiny", "REPO_URL", "COMMIT", True)
    assert launch.check_source(tmp_path, src, True) is src  # placeholders: nothing to ask git
    with pytest.raises(ValueError, match="the workers have only the repository"):
        launch.source(tmp_path, str(REPO / "configs/bert_pretrain.py"), "u", "c", True)


def test_the_workdir_probe_writes_and_deletes(tmp_path):
    bringup.check_workdir(str(tmp_path / "run"), dry_run=False)
    assert list((tmp_path / "run").iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(bringup.PreflightError, match=r"cannot write to the workdir .*/file/run"):
        bringup.check_workdir(str(tmp_path / "file" / "run"), dry_run=False)


def test_the_lock_pins_the_runtime_closure_of_bert_jax_tpu():
    pins, _ = bringup.lock(REPO / "pyproject.toml")
    names = {re.split("==", p)[0].lower().replace("_", "-") for p in pins}
    assert {"jax", "jaxlib", "flax", "orbax-checkpoint", "numpy"} <= names
    if tpu.libtpu_installed():
        assert "libtpu" in names
    assert not names & {"torch", "pytest", "transformers", "ruff", "bert-jax", "matplotlib"}
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^+ ]+", p) for p in pins), pins


def test_every_generation_has_its_zones_and_the_documented_launches_pass():
    assert set(tpu.ZONES) == set(tpu.GENERATIONS)
    for topology, zone in (("v4-8", "us-central2-b"), ("v3-32", "europe-west4-a"),
                           ("v5litepod-16", "us-west4-a"), ("v6e-16", "us-east5-b")):
        launch.check_flags("bert-base", zone, topology, max_restarts=0, poll_seconds=0.5)
    # A zone missing from the table (Google adds zones) passes with any_zone; a malformed one never.
    with pytest.raises(ValueError, match="--any_zone"):
        launch.check_flags("bert-base", "us-central1-ai1a", "v6e-16", 0, 0.5)
    launch.check_flags("bert-base", "us-central1-ai1a", "v6e-16", 0, 0.5, any_zone=True)
    with pytest.raises(ValueError, match="not a Cloud zone name"):
        launch.check_flags("bert-base", "us central", "v6e-16", 0, 0.5, any_zone=True)
