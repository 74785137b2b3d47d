"""Goodput (where a training job's wall time goes, across restarts) and the persistent
compilation cache the CLI sets up."""

import json
import logging
import re
import resource
import shutil
import signal

import jax
import pytest
from helpers import compile_new_program, jax_cache_of_the_test

from bert_jax.training import compilation_cache, goodput

CATEGORIES = [f"{c}_s" for c in goodput.CATEGORIES]


class FakeTime:
    """time.time and time.perf_counter that move only when told to."""

    def __init__(self, monkeypatch, now=1000.0):
        self.now = now
        monkeypatch.setattr(goodput, "unix_time", lambda: self.now)
        monkeypatch.setattr(goodput, "perf_counter", lambda: self.now)

    def __call__(self, seconds):
        self.now += seconds


def run_attempt(clock, tick, steps, *, start, saves=(), device_bound=True):
    """A loop as train_loop drives the clock: 3 s of compile before it; per step a 0.5 s
    batch and a 2 s step, its metrics read after the next dispatch; saves take 1 s."""
    with clock.timing("compile"):
        tick(3)
    tick(2)  # restoring, data pipeline: init
    clock.loop_started()
    with clock.host("data"):  # nothing running yet: waited for
        tick(0.5)
    clock.dispatched()
    for step in range(start + 1, start + steps + 1):
        last = step == start + steps
        if not last:
            with clock.host("data"):  # while step `step` runs
                tick(0.5)
            clock.dispatched()
        tick(1.5 if device_bound else 0)  # the rest of the 2 s step
        clock.read(step, ready=not device_bound)
        if step in saves:
            with clock.timing("save"):
                tick(1)
            clock.saved(step)


def test_clock_splits_the_wall_time_and_a_resume_goes_on(monkeypatch, tmp_path):
    tick = FakeTime(monkeypatch)
    clock = goodput.Clock(tmp_path, start_step=0)
    run_attempt(clock, tick, 6, start=0, saves=(4,))
    clock.persist()
    first = clock.attempt()
    assert first["compile_s"] == 3 and first["init_s"] == 2 and first["save_s"] == 1
    # Only the first batch was waited for; the others loaded while a step ran.
    assert first["data_s"] == 0.5
    assert sum(first[c] for c in CATEGORIES) == pytest.approx(first["wall_s"])
    assert first["first_step_s"] == pytest.approx(3 + 2 + 0.5 + 2)
    fields = clock.fields()
    assert 0 < fields["goodput"] <= 1 and fields["goodput/restarts"] == 0
    assert fields["goodput"] == pytest.approx(first["train_s"] / first["wall_s"])

    # Killed after step 6; restarts from checkpoint 4: steps 5 and 6 are redone.
    tick(100)  # waiting for capacity: no process, not the job's wall time here
    clock2 = goodput.Clock(tmp_path, start_step=4)
    assert clock2.redone_steps == 2
    train_at_4 = json.loads((tmp_path / goodput.FILE).read_text())["saves"][-1][1]
    assert clock2.redone_s == pytest.approx(first["train_s"] - train_at_4)
    run_attempt(clock2, tick, 4, start=4, saves=(8,))
    clock2.persist()
    f = clock2.fields()
    assert f["goodput/restarts"] == 1 and f["goodput/redone_steps"] == 2
    assert f["goodput/wall_s"] == pytest.approx(first["wall_s"] + clock2.attempt()["wall_s"])
    assert sum(f[f"goodput/{c}"] for c in CATEGORIES) <= f["goodput/wall_s"] + 1e-9
    assert f["goodput"] == pytest.approx(
        (f["goodput/train_s"] - f["goodput/redone_s"]) / f["goodput/wall_s"])
    assert 0 < f["goodput"] < clock2.attempt()["train_s"] / clock2.attempt()["wall_s"]

    summary = goodput.summarize(goodput.read(tmp_path))
    assert [a["steps"] for a in summary["attempts"]] == ["0-6", "4-8"]
    assert summary["attempts"][0]["lost_steps"] == 2 and summary["restarts"] == 1
    assert summary["goodput"] == pytest.approx(f["goodput"], abs=1e-3)

    # Killed again at step 8 before checkpoint 8 was written: back to 4 a second time. Only
    # the second attempt's steps 5-8 are lost now (the first's were counted already).
    data = json.loads((tmp_path / goodput.FILE).read_text())
    data["saves"] = [s for s in data["saves"] if s[0] != 8]
    (tmp_path / goodput.FILE).write_text(json.dumps(data))
    clock3 = goodput.Clock(tmp_path, start_step=4)
    assert clock3.redone_steps == 4
    assert clock3.redone_s == pytest.approx(clock2.attempt()["train_s"])


def test_host_bound_steps_count_the_batches_as_waiting(monkeypatch, tmp_path):
    tick = FakeTime(monkeypatch)
    clock = goodput.Clock(tmp_path, start_step=0, enabled=False)
    run_attempt(clock, tick, 5, start=0, device_bound=False)
    a = clock.attempt()
    # Each read found the step done: the host's batches were the bottleneck.
    assert a["data_s"] == pytest.approx(0.5 * 5) and a["train_s"] == pytest.approx(0)
    assert not (tmp_path / goodput.FILE).exists()  # not process 0: writes nothing


def test_an_unreadable_goodput_file_starts_over(monkeypatch, tmp_path):
    (tmp_path / goodput.FILE).write_text("{not json")
    clock = goodput.Clock(tmp_path, start_step=10)
    assert clock.previous == [] and clock.redone_steps == 0
    assert goodput.summarize(None) is None and goodput.summarize({"attempts": []}) is None


def test_an_unwritable_goodput_file_is_said_once_and_the_run_goes_on(tmp_path, caplog):
    (tmp_path / goodput.FILE).mkdir()  # a folder in its place: every write fails
    clock = goodput.Clock(tmp_path, start_step=0)
    for _ in range(3):
        clock.persist()
    said = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert said == [f"warning: cannot write {tmp_path / goodput.FILE} (Is a directory); goodput is not "
                    "recorded for the rest of this run"]


def test_compilation_cache_location(monkeypatch):
    env = {"XDG_CACHE_HOME": "/home/u/.cache"}
    where = compilation_cache.compilation_cache_dir
    assert where("auto", "train", "/runs/a", env) == "/home/u/.cache/bert_jax/jit"
    assert where("auto", "train", "gs://b/run/", env) == "gs://b/run/compilation_cache"
    assert where("auto", "eval", "gs://b/run", env) == "gs://b/run/compilation_cache"
    assert where("auto", "translate", None, env) == "/home/u/.cache/bert_jax/jit"
    assert where("auto", "train", "gs://b/run", {"JAX_COMPILATION_CACHE_DIR": "/mine"}) == "/mine"
    assert where("off", "train", "gs://b/run", {"JAX_COMPILATION_CACHE_DIR": "/mine"}) is None
    assert where("gs://c/jit", "train", "/runs/a", env) == "gs://c/jit"
    monkeypatch.chdir("/tmp")
    assert where("cache", "train", None, env) == "/tmp/cache"


def test_compilation_cache_flag_sets_jax_config():
    keys = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    before = {k: getattr(jax.config, k) for k in keys}
    try:
        compilation_cache.setup_compilation_cache("/tmp/some_cache", "train", None)
        assert jax.config.jax_compilation_cache_dir == "/tmp/some_cache"
        assert jax.config.jax_enable_compilation_cache
        compilation_cache.setup_compilation_cache("off", "train", None)
        assert not jax.config.jax_enable_compilation_cache
        # auto leaves what the user (here: the test session's JAX_COMPILATION_CACHE_DIR) set.
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", "/tmp/session")
        compilation_cache.setup_compilation_cache("auto", "train", "gs://b/run")
        assert jax.config.jax_compilation_cache_dir == "/tmp/session"
    finally:
        for k, v in before.items():
            jax.config.update(k, v)



@pytest.fixture
def jax_cache_config():
    """JAX's cache settings restored after the test (a command in-process changes them)."""
    keys = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
    before = {k: getattr(jax.config, k) for k in keys}
    yield
    for k, v in before.items():
        jax.config.update(k, v)


@pytest.mark.parametrize("required", [False, True], ids=["turned_off", "refused"])
def test_an_unusable_compilation_cache_is_turned_off_or_refused(cli, tmp_path, jax_cache_config, required):
    """A cache folder that cannot be made (a file in its place): by default the command goes on
    without a cache after one line saying why; with --compilation_cache_required it stops first."""
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "jit"
    code, _, err = cli(["translate", f"--checkpoint={tmp_path / 'none'}", "--input=/dev/null",
                        f"--output={tmp_path / 'out.txt'}", f"--compilation_cache={cache}",
                        *(["--compilation_cache_required"] if required else [])])
    said = f"the compilation cache {cache} cannot be used (Not a directory)"
    assert code == 1
    if required:
        assert err.splitlines() == [f"bert-jax translate: error: {said}; fix it, or choose another with "
                                    "--compilation_cache=<dir> (or off), or run without it: drop "
                                    "--compilation_cache_required"]
    else:  # the line, then the command's own error (no checkpoint there): it went on
        assert err.splitlines()[0] == (f"warning: {said}; running without it (every program compiles; "
                                       "--compilation_cache_required refuses instead)")
        assert len(err.splitlines()) == 2 and "checkpoint" in err.splitlines()[1], err
        assert not jax.config.jax_enable_compilation_cache


def test_a_cache_too_full_for_a_program_is_found_before_the_run(tmp_path):
    """A disk with room for an empty file but not for a program (here: files over 512 KiB
    refused, EFBIG, as a full disk refuses with ENOSPC, and as it stops root too): the probe,
    1 MiB, finds it before the run; its partial probe is removed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 10, hard))
    try:
        reason = compilation_cache.unusable(str(tmp_path / "jit"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert reason == "File too large"
    assert list((tmp_path / "jit").iterdir()) == []
    assert compilation_cache.unusable(str(tmp_path / "jit")) is None  # room again
    assert list((tmp_path / "jit").iterdir()) == []


@pytest.fixture
def own_cache(tmp_path):
    with jax_cache_of_the_test():
        yield tmp_path / "jit"


def _silence_warnings(how: str, monkeypatch) -> None:
    """JAX's warnings as a user or a library may leave them: `shown` (as Python shows them),
    `ignored` (filtered to "ignore"), `unchained` (a showwarning hook that calls no other);
    `shown_by_an_older_jax`: shown, by a JAX without get_file_cache (the cache watched through
    its warnings)."""
    import warnings

    if how == "ignored":
        warnings.simplefilter("ignore")  # (pytest puts the filters back after the test)
    elif how == "unchained":
        monkeypatch.setattr(warnings, "showwarning", lambda *args, **kwargs: None)


WARNINGS = pytest.mark.parametrize("warnings_are", ["shown", "ignored", "unchained", "shown_by_an_older_jax"])


@WARNINGS
@pytest.mark.parametrize("required", [False, True], ids=["turned_off", "stops"])
def test_a_cache_that_fails_mid_run_is_turned_off_or_stops_the_command(own_cache, required, warnings_are,
                                                                        monkeypatch):
    """A cache that passed the probe and then fails while the command runs (its folder replaced
    by a file, a fault that stops root too: JAX can write no entry). JAX alone warns at each
    program and goes on, paying the storage at each; here the first failed write turns the
    cache off with one line naming it and the error (a later program writes nothing, though
    the folder is back), or, with --compilation_cache_required, ends the command in one line.
    Seen at the cache itself: the same whether JAX's warnings are shown, ignored, or taken by a
    hook installed after the cache's (one that passes them on to no one)."""
    records = []
    logger = logging.getLogger(compilation_cache.__name__)
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger.addHandler(handler)
    if warnings_are == "shown_by_an_older_jax":
        from jax._src import compilation_cache as jax_internal

        opens = jax_internal.get_file_cache  # JAX's own, unwrapped by an earlier test's watch
        monkeypatch.setattr(jax_internal, "get_file_cache", getattr(opens, "__wrapped__", opens))
        monkeypatch.setattr(compilation_cache, "_watch_jax_caches", lambda: False)
    try:
        compilation_cache.setup_compilation_cache(str(own_cache), "translate", None, required)
        _silence_warnings(warnings_are, monkeypatch)
        compile_new_program(3.5)
        assert any(f.name.endswith("-cache") for f in own_cache.iterdir())  # written there
        shutil.rmtree(own_cache)
        own_cache.write_text("")
        said = (rf"the compilation cache {re.escape(str(own_cache))} failed writing a compiled program "
                r"\(NotADirectoryError: \[Errno 20\] Not a directory: .*'\); ")
        if required:
            with pytest.raises(OSError) as stopped:
                compile_new_program(5.5)
            assert re.fullmatch(said + re.escape(
                "fix it, or choose another with --compilation_cache=<dir> (or off), or run without "
                "it: drop --compilation_cache_required"), str(stopped.value)), str(stopped.value)
            assert records == [] and jax.config.jax_enable_compilation_cache
            compilation_cache._watch(None, False)  # the next command's: JAX's setting as it was
            assert jax.config.jax_raise_persistent_cache_errors is False
            return
        compile_new_program(5.5)
        assert jax.config.jax_enable_compilation_cache is False
        own_cache.unlink()
        own_cache.mkdir()
        compile_new_program(7.5)
        assert list(own_cache.iterdir()) == []  # off: nothing written, nothing read
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert re.fullmatch("warning: " + said + re.escape(
        "running on without it (every program compiles from now on; --compilation_cache_required "
        "stops the command instead)"), records[0].getMessage()), records[0].getMessage()



def test_a_cache_jax_opened_before_the_watch_is_watched_too(own_cache, monkeypatch):
    """JAX opened the cache before the command set it up (a program compiled first, under the
    user's own JAX settings): its get and put are wrapped then, so its failure mid-run turns it
    off with warnings filtered to "ignore" as well."""
    import warnings

    warned = []
    monkeypatch.setattr(logging.getLogger(compilation_cache.__name__), "warning", warned.append)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(own_cache))
    compile_new_program(2.75)  # JAX opens the cache here
    assert any(f.name.endswith("-cache") for f in own_cache.iterdir())
    compilation_cache.setup_compilation_cache(str(own_cache), "translate", None)
    warnings.simplefilter("ignore")
    shutil.rmtree(own_cache)
    own_cache.write_text("")
    compile_new_program(6.75)
    assert jax.config.jax_enable_compilation_cache is False
    assert len(warned) == 1 and warned[0].startswith(f"warning: the compilation cache {own_cache} failed "
                                                     "writing a compiled program (NotADirectoryError"), warned


def test_a_lock_not_had_in_time_leaves_the_cache_on(own_cache):
    """JAX's LRU cache raises filelock.Timeout (a TimeoutError, so an OSError) when other
    processes hold its lock past 10 s: contention, not the storage failing. The error goes back
    to JAX, which warns and compiles that program; the cache stays on."""
    compilation_cache.setup_compilation_cache(str(own_cache), "translate", None, True)

    class Busy:
        def get(self, key, *value):
            raise TimeoutError(f"The file lock '{own_cache}/lock' could not be acquired.")

        put = get

    busy = Busy()
    compilation_cache._wrap(busy)
    for call in (lambda: busy.get("k"), lambda: busy.put("k", b"")):
        with pytest.raises(TimeoutError):
            call()
    assert jax.config.jax_enable_compilation_cache is True


def _stopping_midway(monkeypatch, folder, midway) -> None:
    """Every file opened for writing in `folder` (but an access time's) writes half of what it
    is given, calls `midway()`, then the rest: an entry's write caught in the middle, as
    another process (or a full disk) would catch it."""
    import builtins
    import io

    opens = builtins.open

    class Halting:
        def __init__(self, file):
            self.file = file

        def write(self, data):
            data = bytes(data)
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            midway()
            return self.file.write(data[len(data) // 2:]) + len(data) // 2

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

    def open_(file, mode="r", *args, **kwargs):
        opened = opens(file, mode, *args, **kwargs)
        if (any(m in mode for m in "wxa") and str(file).startswith(str(folder))
                and not str(file).endswith("-atime")):
            return Halting(opened)
        return opened

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)


def _watched_lru_cache(folder, max_size, monkeypatch):
    """JAX's LRU cache of `folder` as the watch wraps it (no cache in use: errors go back to JAX)."""
    from jax._src.lru_cache import LRUCache

    monkeypatch.setattr(compilation_cache, "_IN_USE", [None])
    cache = LRUCache(str(folder), max_size=max_size)
    compilation_cache._wrap(cache)
    return cache


@pytest.mark.parametrize("max_size", [-1, 1 << 20], ids=["no_eviction", "eviction"])
def test_an_entry_whose_write_fails_midway_is_not_left_behind(tmp_path, max_size, monkeypatch):
    """A disk that fills (or a process killed) in the middle of an entry leaves no part of it
    for the next process to read: JAX writes the entry in place; the watch writes it beside
    and moves it into place."""
    import errno
    import os

    folder = tmp_path / "jit"
    cache = _watched_lru_cache(folder, max_size, monkeypatch)

    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    _stopping_midway(monkeypatch, folder, full)
    with pytest.raises(OSError, match="No space left on device"):
        cache.put("jit_f-0123", bytes(range(256)) * 8)
    assert sorted(f.name for f in folder.iterdir() if f.name != ".lockfile") == []
    assert cache.get("jit_f-0123") is None


def test_a_reader_never_sees_part_of_an_entry(tmp_path, monkeypatch):
    """Another process reading an entry while it is written (JAX reads without a lock when
    eviction is off, as under an explicit JAX_COMPILATION_CACHE_DIR) finds no entry, then the
    whole entry; never its first half."""
    folder = tmp_path / "jit"
    cache = _watched_lru_cache(folder, -1, monkeypatch)
    read = []
    _stopping_midway(monkeypatch, folder, lambda: read.append(cache.get("jit_f-0123")))
    value = bytes(range(256)) * 8
    cache.put("jit_f-0123", value)
    assert read == [None]
    assert cache.get("jit_f-0123") == value
    assert [f.name for f in folder.iterdir()] == ["jit_f-0123-cache"]


def test_whole_entries_keep_jax_cache_rules(tmp_path, monkeypatch):
    """As JAX's own put: an entry there is kept (not overwritten); with eviction on, each entry
    has its access time and the least recently used goes first when the folder is full (JAX's
    eviction reads the access times the put wrote)."""
    cache = _watched_lru_cache(tmp_path / "jit", 3000, monkeypatch)
    cache.put("jit_a-1", b"a" * 1000)
    cache.put("jit_a-1", b"b" * 1000)
    assert cache.get("jit_a-1") == b"a" * 1000
    cache.put("jit_b-2", b"b" * 1000)
    (tmp_path / "jit" / "jit_b-2-atime").write_bytes(bytes(8))  # b: the least recently used
    cache.put("jit_c-3", b"c" * 1500)
    assert sorted(f.name for f in (tmp_path / "jit").iterdir()) == [
        ".lockfile", "jit_a-1-atime", "jit_a-1-cache", "jit_c-3-atime", "jit_c-3-cache"]


def test_temporary_entries_of_killed_processes_are_swept_when_the_cache_opens(tmp_path, monkeypatch):
    """A .entry-*.tmp left by a process killed mid-write is removed by the next process to open
    the cache once it is an hour old (by its modification time); a younger one may be another
    live process's write in flight and stays, as do entries and other files."""
    import os
    import time

    folder = tmp_path / "jit"
    folder.mkdir()
    now = time.time()
    ages = {".entry-old.tmp": 3601, ".entry-young.tmp": 3599, ".entry-future.tmp": -60,
            "jit_a-1-cache": 10 * 3600, "old.tmp": 10 * 3600, ".entry-old.txt": 10 * 3600}
    for name, age in ages.items():
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (now - age, now - age))
    assert compilation_cache.sweep_stale_parts(str(folder), now=now) == [".entry-old.tmp"]
    assert sorted(f.name for f in folder.iterdir()) == sorted(set(ages) - {".entry-old.tmp"})
    # Opening the cache sweeps, at the current time: the young one made two hours old goes.
    os.utime(folder / ".entry-young.tmp", (now - 7200, now - 7200))
    cache = _watched_lru_cache(folder, -1, monkeypatch)
    assert sorted(f.name for f in folder.iterdir()) == sorted(
        [".entry-future.tmp", "jit_a-1-cache", "old.tmp", ".entry-old.txt"])
    assert compilation_cache.sweep_stale_parts(str(tmp_path / "missing")) == []
    cache.put("jit_b-2", b"b")  # (its own temporary file is gone once the entry is in place)
    assert (folder / "jit_b-2-cache").read_bytes() == b"b"
    assert [f.name for f in folder.glob(".entry-*.tmp")] == [".entry-future.tmp"]


def train_argv(workdir, *overrides):
    """`bert-jax train` of test_nothing_lost's tiny run (its tests compile the same programs)."""
    from test_nothing_lost import CONFIG, SMALL

    return ["train", f"--config={CONFIG}", f"--workdir={workdir}",
            *(f"--config.{o}" for o in [*SMALL, "train.steps=4", "train.checkpoint_every=2",
                                        "train.eval_every=4", "train.log_every=1", *overrides])]


def test_every_metrics_line_holds_the_goodput_totals(cli, tmp_path):
    from bert_jax.training import metrics
    from bert_jax.viz import plots

    code, out, err = cli(train_argv(tmp_path, "train.steps=2"))
    assert code == 0, err
    assert "goodput: train steps" in out and "  goodput " in out  # the progress line shows it
    rows = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["goodput"] <= 1 and r["goodput/restarts"] == 0
        assert sum(r[f"goodput/{c}"] for c in CATEGORIES) <= r["goodput/wall_s"] + 1e-6
        assert r["goodput/compile_s"] > 0 and r["goodput/init_s"] > 0
        assert r["goodput/train_s"] > 0 and r["goodput/redone_steps"] == 0
    attempts = goodput.read(tmp_path)["attempts"]
    assert len(attempts) == 1 and attempts[0]["step"] == 2 and attempts[0]["save_s"] > 0
    assert attempts[0]["first_step_s"] < attempts[0]["wall_s"]
    assert sum(attempts[0][c] for c in CATEGORIES) <= attempts[0]["wall_s"] + 1e-6
    # The plot draws it (as logged, not smoothed) and reports the seconds behind it.
    run = plots.load_run(str(tmp_path))
    fig, data = plots.plot_runs([run])
    curve = [(d["step"], d["value"], d["smoothed"]) for d in data if d["series"] == "goodput"]
    assert curve == [(r["step"], r["goodput"], r["goodput"]) for r in rows]
    assert not any(d["series"].startswith("goodput/") for d in data)
    assert plots.goodput_breakdown(run)["train_s"] == rows[-1]["goodput/train_s"]


@pytest.mark.slow
def test_a_resume_continues_the_totals_and_counts_redone_steps(cli, tmp_path):
    from bert_jax.training import metrics

    code, _, err = cli(train_argv(tmp_path))
    assert code == 0, err
    first = goodput.read(tmp_path)["attempts"]
    # Checkpoint 4 lost (the process died before it was written): resume from 2.
    shutil.rmtree(tmp_path / "checkpoints" / "4")
    code, out, err = cli(train_argv(tmp_path))
    assert code == 0, err
    assert "steps 3-4 are done again" in out
    rows = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    last = rows[-1]
    assert last["goodput/restarts"] == 1 and last["goodput/redone_steps"] == 2
    assert last["goodput/wall_s"] > first[0]["wall_s"]  # goes on from the first attempt
    assert 0 < last["goodput/redone_s"] < last["goodput/train_s"]
    assert 0 < last["goodput"] <= 1
    assert sum(last[f"goodput/{c}"] for c in CATEGORIES) <= last["goodput/wall_s"] + 1e-6
    summary = goodput.summarize(goodput.read(tmp_path))
    assert [a["steps"] for a in summary["attempts"]] == ["0-4", "2-4"]
    assert summary["attempts"][0]["lost_steps"] == 2
