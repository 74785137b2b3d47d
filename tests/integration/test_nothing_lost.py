"""Nothing lost: a busy or unwritable workdir, a changed config, unreadable checkpoints,
inputs checked before step 1, saving before the final evaluation, eval without --config
and never over a good result. Tiny BERT on synthetic data, in-process."""

import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import REPO, xla_flags

from bert_jax import config as config_lib
from bert_jax import models, paths
from bert_jax.training import checkpoint, evaluate, metrics, state, train

CONFIG = str(REPO / "configs/bert_pretrain.py:tiny")
SMALL = ["data.name=synthetic", "train.batch_size=8", "data.max_seq_length=16",
         "data.max_predictions_per_seq=3", "model.vocab_size=128", "model.num_layers=1",
         "train.log_every=2", "schedule.warmup_steps=1", "train.eval_steps=1"]


def small(*overrides: str):
    return config_lib.load(CONFIG, [*SMALL, "train.steps=4", "train.checkpoint_every=2",
                                    "train.eval_every=4", *overrides])


def steps_on_disk(workdir) -> list[str]:
    folder = workdir / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run (checkpoints 2 and 4) to copy from."""
    workdir = tmp_path_factory.mktemp("trained")
    train.train_and_evaluate(small(), str(workdir))
    return workdir


def test_a_busy_workdir_stops_at_once_naming_the_other_run(tmp_path):
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "since": "2026-11-23 10:00:00"}
    (tmp_path / paths.LOCK_NAME).write_text(json.dumps(holder))
    with pytest.raises(paths.WorkdirBusy, match=rf"pid {os.getppid()} on {socket.gethostname()}"):
        train.train_and_evaluate(small(), str(tmp_path))
    assert steps_on_disk(tmp_path) == []


def test_a_lock_left_by_a_dead_run_is_taken_over(trained, tmp_path):
    # The run `trained` made, its lock left by a process that is gone: the rerun takes the lock
    # over (train_and_evaluate holds it from its start), resumes at step 4 and lets it go.
    shutil.copytree(trained, tmp_path / "run")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = {"pid": dead.pid, "host": socket.gethostname(), "since": "2026-11-23 10:00:00"}
    (tmp_path / "run" / paths.LOCK_NAME).write_text(json.dumps(holder))
    summary = train.train_and_evaluate(small(), str(tmp_path / "run"))
    assert summary["step"] == 4 and not (tmp_path / "run" / paths.LOCK_NAME).exists()


def test_a_workdir_inside_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError, match=r"--workdir=.*/file/run is inside .*/file, a file; choose another"):
        train.train_and_evaluate(small(), str(tmp_path / "file" / "run"))


def assert_only_expected(warnings: list[str], stderr: str) -> None:
    """Besides the error line: the resume's line naming the steps raised (train.steps 6 -> 8:
    checkpoint.say_setting_changes), and at most one pointing to Orbax's details file."""
    steps = [w for w in warnings if "with settings changed since it was saved (train.steps:" in w]
    others = [w for w in warnings if w not in steps]
    assert len(steps) == 1 and len(others) <= 1, stderr
    assert all("their details are in" in w for w in others), stderr


@pytest.mark.slow
def test_a_failed_save_is_one_error_in_a_real_process_and_keeps_the_good_checkpoints(trained, tmp_path):
    # A real failing file system (writes over 100 kB fail: EFBIG, as a full disk fails with
    # ENOSPC) and a real process: Orbax's threads report the failure many times over, at
    # exit too; the console must show one error (and a warning naming the details file).
    shutil.copytree(trained, tmp_path / "run")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest()
              for p in (tmp_path / "run/checkpoints").rglob("*") if p.is_file()}

    small_files_only = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000)); "
                        "sys.argv[0] = 'bert-jax'; runpy.run_module('bert_jax', run_name='__main__')")
    overrides = [f"--config.{o}" for o in [*SMALL, "train.steps=8", "train.checkpoint_every=2",
                                           "train.eval_every=4"]]
    proc = subprocess.run(
        [sys.executable, "-c", small_files_only, "train", "--config", CONFIG, "--workdir",
         str(tmp_path / "run"), *overrides], cwd=REPO, capture_output=True, text=True, timeout=300,
        # Its own compilation cache (the default under $XDG_CACHE_HOME), whose writes fail too:
        # the probe (1 MiB, a program's size) finds it before the run, said in one line.
        env={**{k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"},
             "XDG_CACHE_HOME": str(tmp_path / "cache"),
             "XLA_FLAGS": xla_flags(8, few_steps=True)})
    assert proc.returncode == 1, proc.stderr
    cache, *warnings, error = proc.stderr.splitlines()
    assert cache == (f"warning: the compilation cache {tmp_path}/cache/bert_jax/jit cannot be used (File "
                     "too large); running without it (every program compiles; "
                     "--compilation_cache_required refuses instead)"), proc.stderr
    assert error.startswith(f"bert-jax train: error: cannot write a checkpoint in {tmp_path}/run/checkpoints "
                            "(File too large)") and error.endswith("it resumes from step 4"), proc.stderr
    assert_only_expected(warnings, proc.stderr)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in before}
    assert after == before and steps_on_disk(tmp_path / "run")[:2] == ["2", "4"]


@pytest.mark.slow
def test_a_checkpoints_folder_lost_mid_run_ends_the_process_at_once(trained, tmp_path):
    # After the run's first save its checkpoints/ takes no new folder (made read-only, or gone:
    # here moved aside and a file put in its place, which stops root too). The one-line error
    # must come and the process end at once, not when Orbax's writer threads give up waiting
    # for the step's folders (5 minutes); the steps saved before are kept, metrics flushed.
    shutil.copytree(trained, tmp_path / "run")
    folder = tmp_path / "run/checkpoints"
    before = {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in folder.rglob("*") if p.is_file()}
    lose_the_folder_before_step_8 = textwrap.dedent("""
        import os, runpy, sys
        from bert_jax.training import checkpoint
        save = checkpoint.TrainCheckpointer.save
        def save_in_a_lost_folder(self, step, *args, **kwargs):
            if step == 8:  # this run saved step 6; now its folder goes
                self.manager.wait_until_finished()
                os.rename(self.path, f"{self.path}.kept")
                self.path.write_text("")
            return save(self, step, *args, **kwargs)
        checkpoint.TrainCheckpointer.save = save_in_a_lost_folder
        sys.argv[0] = "bert-jax"
        runpy.run_module("bert_jax", run_name="__main__")""")
    overrides = [f"--config.{o}" for o in [*SMALL, "train.steps=8", "train.checkpoint_every=2",
                                           "train.eval_every=4"]]
    proc = subprocess.Popen(
        [sys.executable, "-c", lose_the_folder_before_step_8, "train", "--config", CONFIG,
         "--workdir", str(tmp_path / "run"), *overrides], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, XLA_FLAGS=xla_flags(8, few_steps=True)))
    watchdog = threading.Timer(600, proc.kill)  # the test ends even if the process would not
    watchdog.start()
    try:
        lines, error_at = [], None
        for line in proc.stderr:  # till the process closes it, at its exit
            lines.append(line.rstrip("\n"))
            if error_at is None and line.startswith("bert-jax train: error:"):
                error_at = time.monotonic()
        proc.wait()
        exited_at = time.monotonic()
    finally:
        watchdog.cancel()
        proc.kill()
    stderr = "\n".join(lines)
    assert proc.returncode == 1 and error_at is not None, stderr
    assert exited_at - error_at < 60, f"the process ended {exited_at - error_at:.0f}s after its error"
    *warnings, error = lines
    assert error == (f"bert-jax train: error: cannot write a checkpoint in {folder} (Not a directory); "
                     "fix the storage (space, permissions, quota) and rerun: it resumes from step 6"
                     ), stderr
    assert_only_expected(warnings, stderr)
    kept = folder.with_name("checkpoints.kept")
    assert {p: hashlib.sha256((kept / p).read_bytes()).hexdigest() for p in before} == before
    assert sorted(p.name for p in kept.iterdir()) == ["2", "4", "6"]
    assert checkpoint.verify(kept / "6", collective=False)
    rows = metrics.read_metrics(tmp_path / "run/metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6, 8]


@pytest.mark.parametrize("override, message", [
    ("optimizer.name=adam", "optimizer.name: 'adamw' in the checkpoint, 'adam' here"),
    ("optimizer.name=lamb", "optimizer.name: 'adamw' in the checkpoint, 'lamb' here"),
    # a run saved with adamw (the BERT configs' default before adam_weight_decay) resumed
    # under the new default: the flag that resumes it
    ("optimizer.name=adam_weight_decay", r"optimizer.name: 'adamw' in the checkpoint, "
     r"'adam_weight_decay' here\); to resume it pass --config\.optimizer\.name=adamw, or train in a "
     r"new --workdir$"),
    ("model.activation=relu", "model.activation: 'gelu' in the checkpoint, 'relu' here"),
])
def test_a_changed_config_is_an_error_not_a_corrupt_checkpoint(trained, tmp_path, override, message):
    import shutil

    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    extra = ["optimizer.weight_decay=0.0"] if override == "optimizer.name=adam" else []
    with pytest.raises(config_lib.ConfigError, match=message):
        train.train_and_evaluate(small("train.steps=8", override, *extra), str(tmp_path))
    assert steps_on_disk(tmp_path) == ["2", "4"]  # nothing renamed, nothing trained over


def test_no_readable_checkpoint_left_never_restarts_from_zero(trained, tmp_path):
    import shutil

    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    for step in ("2", "4"):  # truncate every array file
        for f in (tmp_path / "checkpoints" / step / "params").rglob("*"):
            if f.is_file() and f.stat().st_size > 100 and f.suffix != ".json":
                f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(config_lib.ConfigError, match="refusing to start over from step 0"):
        train.train_and_evaluate(small("train.steps=8"), str(tmp_path))
    assert steps_on_disk(tmp_path) == ["2.unreadable", "4.unreadable"]
    with pytest.raises(config_lib.ConfigError, match="refusing to start over"):  # and again
        train.train_and_evaluate(small("train.steps=8"), str(tmp_path))


def test_sequence_longer_than_the_position_table_fails_before_anything(tmp_path):
    with pytest.raises(config_lib.ConfigError, match=r"data.max_seq_length=600 exceeds .*max_len=512"):
        train.train_and_evaluate(small("data.max_seq_length=600"), str(tmp_path))
    with pytest.raises(config_lib.ConfigError, match=r"data.phases\[1\] length=1024 exceeds .*max_len=512"):
        train.train_and_evaluate(small("data.phases=((0, 128, 20), (2, 1024, 80))"), str(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_missing_eval_files_fail_before_step_1(tmp_path, shared_data):
    from bert_jax.data import tokenizer as tokenizer_lib

    book = shared_data / "text" / "gutenberg" / "austen-emma.txt"
    tokenizer_lib.train_vocab(book.read_text().splitlines()[:2000], size=500, kind="wordpiece",
                              out_dir=tmp_path / "vocab")
    config = small("data.name=text", f"data.tokenizer={tmp_path / 'vocab'}", f"data.train_files={book}",
                   f"data.eval_files={tmp_path / 'nope*.txt'}", "model.vocab_size=500")
    with pytest.raises(FileNotFoundError, match="nope"):
        train.train_and_evaluate(config, str(tmp_path / "run"))
    assert steps_on_disk(tmp_path / "run") == [] and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_last_checkpoint_is_saved_before_the_final_evaluation(tmp_path, monkeypatch):
    def broken(self, params, config=None, out_dir=None):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(evaluate.ObjectiveEvaluator, "run", broken)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        train.train_and_evaluate(small("train.checkpoint_every=100"), str(tmp_path))
    assert steps_on_disk(tmp_path) == ["4"]


def test_eval_needs_no_config_and_never_writes_a_non_finite_result(trained, monkeypatch):
    [stored] = evaluate.evaluate_checkpoints(None, str(trained), "latest")
    [given] = evaluate.evaluate_checkpoints(small(), str(trained), "latest")
    assert stored == given and stored["step"] == 4 and math.isfinite(stored["eval/loss"])
    result = trained / "eval" / "step_4.json"
    good = result.read_text()
    monkeypatch.setattr(evaluate.ObjectiveEvaluator, "run",
                        lambda self, params, config=None, out_dir=None: {"eval/loss": math.nan})
    with pytest.raises(ValueError, match=r"eval/loss not finite .* left as it was"):
        evaluate.evaluate_checkpoints(None, str(trained), "latest")
    assert result.read_text() == good


def test_eval_of_another_model_names_the_parameters(trained):
    with pytest.raises(config_lib.ConfigError, match="model.num_layers"):
        train.train_and_evaluate(small("model.num_layers=2", "train.steps=8"), str(trained))
    # eval takes the model from the checkpoint, whatever --config says
    [result] = evaluate.evaluate_checkpoints(small("model.num_layers=2"), str(trained), "latest")
    assert result["step"] == 4


def test_fine_tuning_takes_model_sizes_from_init_from(tmp_path):
    source = dict(models.model_section("bert", models.bert_model_fields("tiny")), num_layers=1,
                  emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, vocab_size=300, dtype="float32")
    model = models.create_model(source)
    from flax import nnx

    checkpoint.save_params(tmp_path / "ckpt", 0, nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                           {"model": source})
    config = config_lib.load(str(REPO / "configs/glue.py:sst2,base"), [f"init_from={tmp_path / 'ckpt'}"])
    got = state.sizes_from_init(config)
    for k in ("num_layers", "emb_dim", "num_heads", "head_dim", "mlp_dim", "vocab_size"):
        assert got.model[k] == source[k], k
    assert config.model.num_layers == 12  # the given config is not changed
    kept = state.sizes_from_init(config, {"model.num_layers"})
    assert kept.model.num_layers == 12 and kept.model.emb_dim == 32


def flip_bytes(folder, n: int = 64) -> str:
    """Inverts `n` bytes in the middle of the largest file under `folder` (a silent disk or
    copy error: the file keeps its size); returns its path relative to the step folder."""
    biggest = max((f for f in folder.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(biggest.read_bytes())
    middle = len(data) // 2
    data[middle:middle + n] = bytes(b ^ 0xFF for b in data[middle:middle + n])
    biggest.write_bytes(bytes(data))
    return biggest.relative_to(folder.parent).as_posix()


def test_a_damaged_checkpoint_is_set_aside_and_refused_by_name(trained, tmp_path, cli):
    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    damaged = flip_bytes(tmp_path / "checkpoints" / "4" / "params")
    where, why = f"checkpoint {tmp_path}/checkpoints/4", f"{damaged} differs from when it was saved"
    named = f"{where} is damaged: {why}"
    # Commands that read checkpoints refuse it by name, and write nothing.
    code, _, err = cli(["average", f"--workdir={tmp_path}", "--last=2", f"--out={tmp_path / 'avg'}"])
    assert code == 1 and named in err and "restore the folder from a copy" in err, err
    assert not (tmp_path / "avg" / "checkpoints" / "4").exists()
    code, _, err = cli(["eval", f"--workdir={tmp_path}"])
    assert code == 1 and named in err, err
    assert not (tmp_path / "eval").exists()
    [result] = evaluate.evaluate_checkpoints(None, str(tmp_path), "2")  # the good one still reads
    assert math.isfinite(result["eval/loss"])
    # Training sets it aside, as an unreadable one, and resumes from the one before (which,
    # without Orbax's _CHECKPOINT_METADATA, as copied in part, it names and uses).
    (tmp_path / "checkpoints" / "2" / "_CHECKPOINT_METADATA").unlink()
    code, out, err = cli(["train", f"--config={CONFIG}", f"--workdir={tmp_path}",
                          *[f"--config.{o}" for o in (*SMALL, "train.steps=6", "train.checkpoint_every=2",
                                                        "train.eval_every=100")]])
    assert code == 0, err
    assert f"warning: {where} cannot be restored, it is damaged: {why}" in err, err
    assert f"renamed to {tmp_path}/checkpoints/4.unreadable, trying the previous one" in err, err
    assert f"warning: checkpoint {tmp_path}/checkpoints/2 has no _CHECKPOINT_METADATA" in err, err
    assert f"resumed from {tmp_path}/checkpoints/2" in out
    assert steps_on_disk(tmp_path) == ["2", "4", "4.unreadable", "6"]


def test_checkpoints_saved_before_checksums_still_load(trained, tmp_path):
    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    for step in ("2", "4"):
        (tmp_path / "checkpoints" / step / "checksums.json").unlink()
    assert checkpoint.read_config(tmp_path)["model"]["num_layers"] == 1
    [result] = evaluate.evaluate_checkpoints(None, str(tmp_path), "latest")
    assert result["step"] == 4 and math.isfinite(result["eval/loss"])
    assert train.train_and_evaluate(small("train.steps=6"), str(tmp_path))["step"] == 6
    assert steps_on_disk(tmp_path) == ["2", "4", "6"]


def test_a_read_only_checkpoints_folder_fails_before_step_1(trained, tmp_path, monkeypatch):
    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    folder = tmp_path / "checkpoints"
    # chmod 555 binds no root (as tests may run): refuse writes there as a read-only folder does.
    from etils import epath

    local = type(epath.Path(folder))
    write_text = local.write_text

    def read_only(self, *args, **kwargs):
        if str(self.parent) == str(folder):
            raise PermissionError(13, "Permission denied")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(local, "write_text", read_only)
    message = rf"cannot write to the checkpoints folder {folder} \(Permission denied\)"
    with pytest.raises(OSError, match=message):
        train.train_and_evaluate(small("train.steps=8"), str(tmp_path))
    assert steps_on_disk(tmp_path) == ["2", "4"] and not (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / paths.LOCK_NAME).exists()
