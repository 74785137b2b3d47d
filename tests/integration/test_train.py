"""The training engine: meshes, gradient accumulation, kill -9 / SIGTERM resume, corrupt
checkpoints, NaN stops, config errors. Tiny BERT on synthetic data, 8 simulated devices."""

import concurrent.futures
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import REPO, xla_flags

from bert_jax import config as config_lib
from bert_jax.training import input as pipelines
from bert_jax.training import metrics, objectives, optim, sharding, train
from bert_jax.training import state as state_lib

CONFIG = "configs/bert_pretrain.py:tiny"
# Small and fast: ~0.1 s/step on 2 CPU cores.
SMALL = ["--config.data.name=synthetic", "--config.train.batch_size=16", "--config.data.max_seq_length=32",
         "--config.data.max_predictions_per_seq=5", "--config.model.vocab_size=256",
         "--config.train.log_every=1", "--config.schedule.warmup_steps=5"]


def small_config(*overrides: str):
    return config_lib.load(CONFIG, [a.removeprefix("--config.") for a in (*SMALL, *overrides)])


def cli(*args, devices: int = 8, check: bool = True, wait: bool = True, few_steps: bool = False):
    """`bert-jax` as a process of its own on `devices` CPU devices (helpers.xla_flags)."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices, few_steps))
    cmd = [sys.executable, "-m", "bert_jax", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"bert-jax {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def train_argv(workdir, *overrides) -> list[str]:
    return ["train", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL, *overrides]


def train_cli(workdir, *overrides, **kw):
    return cli(*train_argv(workdir, *overrides), **kw)


def train_here(cli, workdir, *overrides, code: int = 0) -> tuple[str, str]:
    """`bert-jax train` in-process (the `cli` fixture): (stdout, stderr), the exit code checked.
    A real process only where it is the point: killed, signalled, other device counts, pods."""
    got, out, err = cli(train_argv(workdir, *overrides))
    assert got == code, err[-3000:]
    return out, err


def losses(workdir) -> dict[int, float]:
    rows = metrics.read_metrics(Path(workdir) / "metrics.jsonl")
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def steps_on_disk(workdir) -> list[int]:
    d = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted 12-step run on the default mesh (data=8), via the CLI: its workdir,
    checkpoints 4, 8 and 12 (tests copy it, never change it)."""
    workdir = tmp_path_factory.mktemp("reference")
    train_cli(workdir, "--config.train.steps=12", "--config.train.checkpoint_every=4")
    return workdir


@pytest.fixture(scope="module")
def reference(reference_run) -> dict[int, float]:
    """The reference run's loss per step."""
    return losses(reference_run)


@pytest.mark.parametrize("mesh", [dict(fsdp=8, data=1), dict(data=2, fsdp=2, tensor=2)])
@pytest.mark.slow
def test_meshes_give_the_same_losses(reference, tmp_path, mesh):
    config = small_config("--config.train.steps=12")
    config.mesh.update(mesh)
    train.train_and_evaluate(config, str(tmp_path))
    got = losses(tmp_path)
    # Different meshes sum partial results in a different order: float32 rounding only.
    np.testing.assert_allclose([got[s] for s in range(1, 13)], [reference[s] for s in range(1, 13)],
                               rtol=2e-5)


@pytest.mark.slow
def test_single_device_gives_the_same_losses(reference, tmp_path):
    train_cli(tmp_path, "--config.train.steps=12", devices=1, few_steps=True)
    got = losses(tmp_path)
    np.testing.assert_allclose([got[s] for s in range(1, 13)], [reference[s] for s in range(1, 13)],
                               rtol=2e-5)


def two_processes(tmp_path, run, steps=("--config.train.steps=12", "--config.train.checkpoint_every=4")
                  ) -> list[subprocess.Popen]:
    """`bert-jax train` as 2 processes x 4 devices on this machine (a pod's hosts); process i
    started as `python <run[i]> train ...`, compiled as a run of few steps."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    procs = []
    for i in range(2):
        env = dict(os.environ, XLA_FLAGS=xla_flags(4, few_steps=True),
                   JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(i))
        procs.append(subprocess.Popen(
            [sys.executable, *run[i], "train", f"--config={CONFIG}", f"--workdir={tmp_path}",
             *SMALL, *steps],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.slow
def test_two_processes_give_the_same_losses(reference, tmp_path):
    """Multi-host as on a pod: 2 processes x 4 devices, each loading half of every batch (the
    packed path, where each packs the global batch: tests/unit/data/test_packing.py)."""
    procs = two_processes(tmp_path, run=(("-m", "bert_jax"),) * 2)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # (both pipes read at once)
        ended = list(pool.map(lambda proc: proc.communicate(timeout=600), procs))
    for proc, (_, err) in zip(procs, ended):
        assert proc.returncode == 0, err[-3000:]
    got = losses(tmp_path)
    np.testing.assert_allclose([got[s] for s in range(1, 13)], [reference[s] for s in range(1, 13)],
                               rtol=2e-5)
    assert steps_on_disk(tmp_path) == [4, 8, 12]


# `bert-jax` that kills itself (SIGKILL, as kill -9) when it asks for its first batch: its peer
# then waits in step 1's collective, which can never complete.
_KILLED_AT_STEP_1 = """
import os, signal, sys
from bert_jax import commands
from bert_jax.training import train
train.next_batch = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
sys.argv = ["bert-jax", *sys.argv[1:]]
commands.run()
"""


@pytest.mark.slow
def test_a_lost_process_stops_its_peer_with_one_line(tmp_path):
    """Process 1 killed at its first step: process 0 does not wait in the collective for JAX's heartbeat
    timeout (100 s, then an abort with every thread's stack); it exits 1 with one line naming
    the lost process."""
    procs = two_processes(tmp_path, run=(("-m", "bert_jax"), ("-c", _KILLED_AT_STEP_1)))
    _, err = procs[0].communicate(timeout=300)
    procs[1].wait(timeout=60)
    assert procs[1].returncode == -signal.SIGKILL
    lines = [line for line in err.splitlines() if not line.startswith("[Gloo]")]
    assert procs[0].returncode == 1 and lines == [
        f"bert-jax train: error: process 1 of 2 ({socket.gethostname()}, pid {procs[1].pid}) ended "
        "before finishing (killed, crashed, or stopped by an error of its own: its log says which); "
        "this process stops too. Rerun the job on every host: a training run resumes from its last "
        "checkpoint"], err[-3000:]


@pytest.mark.slow
def test_ctrl_c_to_one_of_two_processes_saves_one_step_in_both_and_exits_130(tmp_path):
    """A save is collective: the process given SIGINT does not save alone (the other would wait
    in its next step); both agree on a step (JAX's preemption sync point), save it, say so and
    exit 130, each telling the other it finished (no "ended before finishing"). The run is long
    and saves only on a stop, so that nothing but the Ctrl-C can end it."""
    procs = two_processes(tmp_path, run=(("-m", "bert_jax"),) * 2,
                          steps=("--config.train.steps=100000", "--config.train.checkpoint_every=100000"))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # (both pipes read at once)
        try:
            ending = [pool.submit(proc.communicate, timeout=600) for proc in procs]
            _wait_for_step(tmp_path, procs[0], 3)
            procs[1].send_signal(signal.SIGINT)
            ended = [e.result() for e in ending]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    [saved] = steps_on_disk(tmp_path)
    assert saved >= 3
    for proc, (_, err) in zip(procs, ended):
        lines = [line for line in err.splitlines() if line.startswith("bert-jax")]
        assert proc.returncode == 130 and lines == [
            f"bert-jax train: interrupted: saved checkpoint {tmp_path}/checkpoints/{saved}; run the "
            "same command to resume"], err[-3000:]


@pytest.mark.slow
def test_losses_fall_and_metrics_are_complete(tmp_path):
    config = small_config("--config.train.steps=40", "--config.train.eval_every=20",
                          "--config.train.checkpoint_every=20")
    summary = train.train_and_evaluate(config, str(tmp_path))
    rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
    first, last = rows[0], [r for r in rows if "loss" in r][-1]
    assert last["loss"] < first["loss"] - 0.5
    for key in ("masked_lm_loss", "masked_lm_accuracy", "next_sentence_loss",
                "next_sentence_accuracy", "learning_rate", "tokens_per_sec", "mfu", "grad_norm"):
        assert key in first and np.isfinite(first[key]), key
    evals = [r for r in rows if "eval/loss" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert summary["eval"]["eval/masked_lm_accuracy"] == evals[-1]["eval/masked_lm_accuracy"]
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert steps_on_disk(tmp_path) == [20, 40]


def _step_inputs(config, accum):
    config.train.grad_accum_steps = accum
    tx, schedule = optim.make_optimizer(config)
    mesh = sharding.make_mesh(config.mesh)
    graphdef, _, state_sh = state_lib.abstract_state(config, mesh, tx)
    step = functools.partial(
        train.train_step, graphdef=graphdef, objective=objectives.for_config(config),
        tx=tx, schedule=schedule, accum=accum, dropout_key=jax.random.key(0), mesh=mesh)
    return mesh, tx, state_sh, jax.jit(step)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
    # Dropout off: microbatches would otherwise draw different dropout masks than one batch.
    config = small_config("--config.model.dropout_rate=0.0",
                          "--config.model.attention_dropout_rate=0.0", "--config.train.batch_size=32")
    local = next(pipelines.make(config, "train"))
    results = []
    for accum in (1, 4):
        mesh, tx, state_sh, step = _step_inputs(config, accum)
        with jax.set_mesh(mesh):
            state = state_lib.init_state(config, tx, state_sh)
            new_state, m = step(state, sharding.global_batch(local, mesh, 1))
            results.append(jax.device_get((new_state["params"], m)))
    (p1, m1), (p4, m4) = results
    for key in ("loss", "masked_lm_accuracy", "next_sentence_loss", "grad_norm"):
        np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p4, p1)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_state():
    # The accumulation test's config: its float32 programs come from the compilation cache.
    config = small_config("--config.model.dropout_rate=0.0",
                          "--config.model.attention_dropout_rate=0.0", "--config.train.batch_size=32")
    local = next(pipelines.make(config, "train"))
    out = {}
    for dtype in ("float32", "bfloat16"):
        config.dtype = dtype
        mesh, tx, state_sh, step = _step_inputs(config, 1)
        with jax.set_mesh(mesh):
            state, m = step(state_lib.init_state(config, tx, state_sh), sharding.global_batch(local, mesh, 1))
        leaves = jax.tree.leaves((state["params"], state["opt_state"]))
        assert {x.dtype for x in leaves if x.ndim} == {np.dtype("float32")}, dtype
        assert m["loss"].dtype == np.float32
        out[dtype] = float(m["loss"])
    assert out["bfloat16"] != out["float32"]  # bf16 really was used ...
    np.testing.assert_allclose(out["bfloat16"], out["float32"], rtol=2e-2)  # ... to bf16 precision


def _wait_for_step(workdir, proc, step, timeout=300, checkpoint=None):
    """Until the run has logged `step` (and, if given, committed checkpoint `checkpoint`:
    saves are async, so under load a step can be logged long before the save ends)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        if ((Path(workdir) / "metrics.jsonl").exists() and max(losses(workdir), default=0) >= step
                and (checkpoint is None or checkpoint in steps_on_disk(workdir))):
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout}s")


@pytest.mark.slow
def test_kill_9_then_resume_gives_identical_losses(reference, tmp_path, cli):
    proc = train_cli(tmp_path, "--config.train.steps=12", "--config.train.checkpoint_every=4",
                     wait=False)
    _wait_for_step(tmp_path, proc, 5, checkpoint=4)  # killed somewhere in steps 5..11
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert steps_on_disk(tmp_path)[-1] in (4, 8)
    # Copy before resuming, to also resume the same interrupted run onto another mesh.
    shutil.copytree(tmp_path, tmp_path / "other_mesh")
    out, _ = train_here(cli, tmp_path, "--config.train.steps=12", "--config.train.checkpoint_every=4")
    assert "resumed from" in out
    got = losses(tmp_path)
    assert sorted(got) == list(range(1, 13))  # lost steps' lines are replaced, not duplicated
    assert [got[s] for s in range(1, 13)] == [reference[s] for s in range(1, 13)]  # bitwise

    other = tmp_path / "other_mesh"
    # ... on 4 devices instead of 8, as (data 2, fsdp 2) instead of data 8.
    train_cli(other, "--config.train.steps=12", "--config.mesh.fsdp=2", devices=4, few_steps=True)
    got = losses(other)
    np.testing.assert_allclose([got[s] for s in range(1, 13)],
                               [reference[s] for s in range(1, 13)], rtol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)],
                         ids=["sigterm", "ctrl-c"])
def test_a_signal_saves_and_exits_then_resumes(reference, tmp_path, cli, signum, code):
    # SIGTERM (a preemption) exits 0; Ctrl-C, a stop the user asked for, 130 with one line
    # naming the step saved. Either way the resumed run gives the uninterrupted run's losses.
    proc = train_cli(tmp_path, "--config.train.steps=12", "--config.train.checkpoint_every=100",
                     wait=False)
    _wait_for_step(tmp_path, proc, 3)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    saved = steps_on_disk(tmp_path)
    assert len(saved) == 1 and 3 <= saved[0] < 12
    if signum == signal.SIGINT:
        assert "Traceback" not in err and err.splitlines()[-1] == (
            f"bert-jax train: interrupted: saved checkpoint {tmp_path}/checkpoints/{saved[0]}; run "
            "the same command to resume"), err[-2000:]
    train_here(cli, tmp_path, "--config.train.steps=12", "--config.train.checkpoint_every=100")
    got = losses(tmp_path)
    assert [got[s] for s in range(1, 13)] == [reference[s] for s in range(1, 13)]


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_to_previous(reference_run, reference, tmp_path, cli):
    # The reference run's workdir (a copy), its latest checkpoint, 12, damaged: every data file
    # of its parameters truncated. Its metrics lines after step 8 are dropped, so that those
    # compared below are the resumed run's.
    shutil.copytree(reference_run, tmp_path, dirs_exist_ok=True)
    assert steps_on_disk(tmp_path) == [4, 8, 12]
    for f in (tmp_path / "checkpoints" / "12" / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 100 and f.suffix != ".json":
            f.write_bytes(f.read_bytes()[:50])
    metrics_file = tmp_path / "metrics.jsonl"
    kept = [line for line in metrics_file.read_text().splitlines(keepends=True)
            if json.loads(line).get("step", 0) <= 8]
    metrics_file.write_text("".join(kept))
    assert max(losses(tmp_path)) == 8
    out, err = train_here(cli, tmp_path, "--config.train.steps=12", "--config.train.checkpoint_every=4")
    assert "cannot be restored" in err and f"resumed from {tmp_path}/checkpoints/8" in out, out[-2000:]
    assert (tmp_path / "checkpoints" / "12.unreadable").is_dir()  # kept for inspection
    assert steps_on_disk(tmp_path) == [4, 8, 12]
    got = losses(tmp_path)
    assert [got[s] for s in range(9, 13)] == [reference[s] for s in range(9, 13)]


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_good_checkpoints(reference_run, tmp_path, cli):
    shutil.copytree(reference_run, tmp_path, dirs_exist_ok=True)  # checkpoints 4, 8 and 12
    # A config change that does not fit the checkpoint is an error, not a corrupt checkpoint.
    _, err = train_here(cli, tmp_path, "--config.train.steps=40", "--config.optimizer.name=sgd",
                        "--config.optimizer.weight_decay=0.0", code=1)
    assert "optimizer state does not fit" in err
    assert steps_on_disk(tmp_path) == [4, 8, 12]

    _, err = train_here(cli, tmp_path, "--config.train.steps=40", "--config.train.checkpoint_every=1",
                        "--config.optimizer.learning_rate=1e30", code=1)
    assert "not finite" in err and "Traceback" not in err
    bad_step = int(re.search(r"step (\d+): loss", err).group(1))
    assert 12 < bad_step <= 40
    assert 12 in steps_on_disk(tmp_path)  # the last good checkpoint before the run (5 are kept)
    assert max(steps_on_disk(tmp_path)) < bad_step


@pytest.mark.parametrize("override, message", [
    ("--config.train.stepz=3", "valid keys there"),
    ("--config.train.steps=abc", "train.steps"),
])
def test_bad_override_names_the_key(tmp_path, override, message, cli):
    # In-process: tests/integration/test_cli.py checks the real script's exit codes.
    _, err = train_here(cli, tmp_path, override, code=2)
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("overrides, message", [
    (["--config.mesh.data=16"], "needs 16 devices but 8 exist"),
    (["--config.train.batch_size=12"], "not divisible by the batch shards"),
    (["--config.optimizer.name=adagrad"], "optimizer.name='adagrad'; choose one of"),
    (["--config.train.grad_accum_steps=3"], "grad_accum_steps=3"),
])
def test_impossible_config_fails_before_compile(tmp_path, overrides, message, cli):
    _, err = train_here(cli, tmp_path, *overrides, code=1)
    assert message in err
    assert "Traceback" not in err and not (tmp_path / "checkpoints").exists()



def test_stage_end_checkpoints_are_kept_beside_the_newest(tmp_path):
    """The steps where a schedule stage ends (`kept`) stay, with the newest `keep`, and with
    the best one of a run that keeps it."""
    from bert_jax.training import checkpoint
    params, opt_state = {"w": np.zeros(2, np.float32)}, {"m": np.zeros(2, np.float32)}
    for best, want in ((None, [3, 5, 6]), ("eval/accuracy", [1, 3, 5, 6])):
        workdir = tmp_path / str(best)
        ckpt = checkpoint.TrainCheckpointer(workdir, keep=1, best_metric=best, kept=(3, 5))
        for step in range(1, 7):
            metrics = {"eval/accuracy": 1.0 if step == 1 else 0.5} if best else None
            ckpt.save(step, params, opt_state, {}, {}, metrics=metrics)
            ckpt.manager.wait_until_finished()
        ckpt.manager.close()
        assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == want


@pytest.mark.parametrize("keep,accuracies,kept,best", [
    (1, [0.5, 0.75, 0.6, 0.75, 0.7], [4, 5], 4),   # the best of two tied steps is the later
    (2, [0.5, 0.75, 0.6, 0.75, 0.75], [4, 5], 5),  # both kept and tied: the later one
    # nan (undefined: a correlation of constant predictions) ranks below every number
    (1, [float("nan"), 0.5, 0.4], [2, 3], 2),
    (1, [0.5, float("nan"), 0.4, float("nan")], [1, 4], 1),
    (1, [float("nan"), float("nan"), float("nan")], [3], 3),  # all undefined: the latest
])
def test_best_checkpoint_is_kept_and_ties_go_to_the_later_step(tmp_path, keep, accuracies, kept, best):
    """keep=K latest plus the best by the task metric: Orbax's BestN and `eval --step best`
    agree, also when evaluations tie (a CI run had 0.75 at both steps 300 and 375)."""
    from bert_jax.training import checkpoint, evaluate
    params, opt_state = {"w": np.zeros(2, np.float32)}, {"m": np.zeros(2, np.float32)}
    ckpt = checkpoint.TrainCheckpointer(tmp_path, keep=keep, best_metric="eval/accuracy")
    for step, acc in enumerate(accuracies, start=1):
        ckpt.save(step, params, opt_state, {}, {}, metrics={"eval/accuracy": acc})
        ckpt.manager.wait_until_finished()
    ckpt.manager.close()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == kept
    assert evaluate.chosen_steps(str(tmp_path), "best", "eval/accuracy") == [best]
    assert evaluate.chosen_steps(str(tmp_path), "latest") == [len(accuracies)]
    assert evaluate.chosen_steps(str(tmp_path), "all") == kept
