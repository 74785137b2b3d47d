"""Where a training job's wall time goes, across its restarts: `goodput`, the share of the
wall time that trained steps whose work was kept.

Categories (seconds of wall time, as process 0 sees them; they never overlap, so their sum
is at most the wall time):

  init     the CLI's start to the first train step, less the compiling in it: imports,
           mesh, restoring or initialising the state, data pipeline, eval file checks
  compile  lowering and compiling the train step (each sequence-length phase; each new row
           count of packed batches); from the persistent compilation cache when it holds it
  data     the host getting batches while the device had no step to run (see below)
  train    train steps: the time between reads of consecutive steps' metrics, less the above
  eval     evaluations (their first compile included)
  save     checkpoint saves: the host's part (Orbax writes in the background) and the wait for
           the last one
  redone   the train time of steps done again after a restart: the previous attempt's steps
           after the checkpoint the restart resumed from (counted in `train` when first done)

  goodput = (train - redone) / wall,  wall = the wall time of every attempt so far.

The loop never waits for the device inside a step (step t+1 is dispatched before step t's
metrics are read), so a step's time is measured between metric reads, where the host waits
anyway. The host's own work between two reads (getting the next batch, writing a metrics
line) ran while the device computed, unless the device had finished before the host asked
for the metrics (`jax.Array.is_ready()` at the read, which does not wait): then the host was
the bottleneck and that work is counted as data (batches) or left out (writing) rather than
as train. This charges all of the host's time to the host in that case, so `train` and
goodput are lower bounds there; when the device is the bottleneck they are exact.

The totals persist in `<workdir>/goodput.json` (process 0 writes it at saves, every
PERSIST_SECONDS at metrics lines, and at the end; a run killed with SIGKILL loses what
followed the last write) as one record per attempt (process start), so a resumed run goes on
from them and `bert-jax launch` reports them per restart. Each metrics line carries the
running totals (`goodput`, `goodput/<category>_s`, `goodput/redone_steps`,
`goodput/restarts`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from time import perf_counter
from time import time as unix_time
from typing import Any

from bert_jax.paths import is_remote, workdir_path

log = logging.getLogger(__name__)

FILE = "goodput.json"
CATEGORIES = ("init", "compile", "data", "train", "eval", "save")
PERSIST_SECONDS = 30.0  # at most this long between writes of goodput.json at metrics lines
_KEEP_MARKS = 64  # (step, train seconds) of the newest saves kept for resumes


def read(workdir: str | os.PathLike) -> dict[str, Any] | None:
    """The workdir's goodput.json ({"attempts": [...], "saves": [[step, train_s], ...]}), or
    None if it has none (or an unreadable one: accounting never stops a run)."""
    path = workdir_path(workdir) / FILE
    try:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning(f"warning: {path} cannot be read ({e}); goodput starts over")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
        return None
    return data


def totals(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """Summed seconds per category, wall, redone steps and goodput over `attempts`."""
    out: dict[str, Any] = {f"{c}_s": sum(a.get(f"{c}_s", 0.0) for a in attempts)
                           for c in (*CATEGORIES, "redone", "wall")}
    out["redone_steps"] = sum(a.get("redone_steps", 0) for a in attempts)
    out["goodput"] = goodput(out)
    return out


def goodput(t: dict[str, float]) -> float:
    """(train - redone) / wall of a totals or attempt record (0 before any wall time)."""
    return max(t["train_s"] - t["redone_s"], 0.0) / t["wall_s"] if t["wall_s"] > 0 else 0.0


class Clock:
    """One attempt's time per category, on top of the workdir's earlier attempts.

    The training loop tells it what the host does: `timing(category)` around a segment that
    excludes the device (compile, eval, save), `host(category)` around host work that may run
    while the device computes (batches, metrics lines), `dispatched()` after each step call,
    `read(ready)` after reading a step's metrics. Before `loop_started()` everything but
    compiling is init."""

    def __init__(self, workdir: str | os.PathLike, *, start_step: int, started: float | None = None,
                 enabled: bool = True):
        self.workdir, self.enabled = str(workdir), enabled
        self.started = unix_time() if started is None else started  # unix time
        # perf_counter of the start (a steady clock from here on)
        self._t0 = perf_counter() - max(unix_time() - self.started, 0.0)
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.first_step_s: float | None = None
        self.step = start_step
        previous = read(workdir) if enabled else None
        self.previous: list[dict[str, Any]] = list(previous["attempts"]) if previous else []
        saves = {int(s): float(t) for s, t in (previous or {}).get("saves", [])}
        self.redone_steps, self.redone_s = self._redone(start_step, saves)
        # Saves after the resumed checkpoint belong to lost work (or checkpoints set aside);
        # the job's train time so far is the checkpoint's or redone, so a later restart from
        # the same checkpoint redoes only what this attempt trained.
        self.saves = {s: t for s, t in saves.items() if s < start_step}
        self.saves[start_step] = totals(self.previous)["train_s"]
        self.start_step = start_step
        self._in_loop = False
        self._mark = 0.0  # start of the open train interval (perf_counter)
        self._excluded = 0.0  # seconds of that interval spent outside train steps
        self._pending: dict[str, float] = {}  # host work in the interval, not yet classified
        self._in_flight = 0  # dispatched steps whose metrics are unread
        self._persisted = -1e9

    def _redone(self, start_step: int, saves: dict[int, float]) -> tuple[int, float]:
        """(steps, train seconds) of the previous attempts' work after `start_step`, lost."""
        if not self.previous:
            return 0, 0.0
        steps = max(self.previous[-1].get("step", 0) - start_step, 0)
        if not steps:
            return 0, 0.0
        before = totals(self.previous)["train_s"]
        if start_step in saves:
            at_save = saves[start_step]
        elif start_step == 0:
            at_save = 0.0
        else:  # a checkpoint with no record (goodput.json older than it): the mean step time
            a = self.previous[-1]
            done = a.get("step", 0) - a.get("start_step", 0)
            at_save = before - steps * a.get("train_s", 0.0) / done if done > 0 else before
        return steps, max(before - at_save, 0.0)

    # What the loop reports.

    @contextlib.contextmanager
    def timing(self, category: str):
        """A segment in which the device has nothing to do (compile, eval, save)."""
        t0 = perf_counter()
        try:
            yield
        finally:
            dt = perf_counter() - t0
            if self._in_loop or category == "compile":
                self.seconds[category] += dt
            if self._in_loop:
                self._excluded += dt

    @contextlib.contextmanager
    def host(self, category: str | None):
        """Host work that may overlap a running step: classified at the next `read`, or at once
        when no step is running. category None: not counted anywhere (metrics lines)."""
        t0 = perf_counter()
        try:
            yield
        finally:
            dt = perf_counter() - t0
            if not self._in_loop:
                pass  # init
            elif self._in_flight:
                self._pending[category] = self._pending.get(category, 0.0) + dt
            else:
                self._exposed(category, dt)

    def _exposed(self, category: str | None, dt: float) -> None:
        if category is not None:
            self.seconds[category] += dt
        self._excluded += dt

    def loop_started(self) -> None:
        """The first train step is next: what is not compiling so far was init."""
        now = perf_counter()
        self.seconds["init"] = max(now - self._t0 - self.seconds["compile"], 0.0)
        self._in_loop, self._mark, self._excluded = True, now, 0.0

    def dispatched(self) -> None:
        self._in_flight += 1

    def read(self, step: int, ready: bool) -> None:
        """Step `step`'s metrics were read; `ready`: they were before the read (the host, not
        the device, was the slower)."""
        now = perf_counter()
        if ready:
            for category, dt in self._pending.items():
                self._exposed(category, dt)
        self._pending = {}
        self.seconds["train"] += max(now - self._mark - self._excluded, 0.0)
        self._mark, self._excluded = now, 0.0
        self._in_flight = max(self._in_flight - 1, 0)
        self.step = step
        if self.first_step_s is None:
            self.first_step_s = now - self._t0

    def saved(self, step: int) -> None:
        """Checkpoint `step` was saved: what a resume from it will count as redone."""
        self.saves[step] = sum(a.get("train_s", 0.0) for a in self.previous) + self.seconds["train"]
        self.persist()

    # What it reports.

    def attempt(self) -> dict[str, Any]:
        """This attempt's record (as in goodput.json)."""
        record = {"started": round(self.started, 3), "start_step": self.start_step,
                  "step": self.step,
                  "wall_s": perf_counter() - self._t0,
                  **{f"{c}_s": v for c, v in self.seconds.items()},
                  "redone_steps": self.redone_steps, "redone_s": self.redone_s,
                  "first_step_s": self.first_step_s}
        if not self._in_loop:  # ended before its first step: all but compiling was init
            record["init_s"] = max(record["wall_s"] - self.seconds["compile"], 0.0)
        return record

    def fields(self) -> dict[str, float]:
        """The running totals over every attempt, for a metrics line."""
        t = totals([*self.previous, self.attempt()])
        out = {"goodput": t["goodput"]}
        out.update({f"goodput/{c}_s": t[f"{c}_s"] for c in ("wall", *CATEGORIES, "redone")})
        out.update({"goodput/redone_steps": t["redone_steps"],
                    "goodput/restarts": len(self.previous)})
        return out

    def persist(self, force: bool = True) -> None:
        """Writes goodput.json (process 0; unless not `force`, the workdir is remote and it
        was written less than PERSIST_SECONDS ago)."""
        now = perf_counter()
        if not self.enabled or (not force and is_remote(self.workdir)
                                and now - self._persisted < PERSIST_SECONDS):
            return
        self._persisted = now
        keep = sorted(self.saves)[-_KEEP_MARKS:]
        data = {"attempts": [*self.previous, self.attempt()],
                "saves": [[s, round(self.saves[s], 3)] for s in keep]}
        text = json.dumps(_rounded(data), indent=1) + "\n"
        path = workdir_path(self.workdir) / FILE
        try:
            if is_remote(self.workdir):
                path.write_text(text)  # an object is replaced whole
            else:
                tmp = path.with_name(FILE + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
        except OSError as e:  # accounting never stops a run; said once, not at every line
            self.enabled = False
            log.warning(f"warning: cannot write {path} ({e.strerror or e}); goodput is not recorded "
                        "for the rest of this run")


def _rounded(x):
    if isinstance(x, float):
        return round(x, 3)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def summarize(data: Any) -> dict[str, Any] | None:
    """The goodput of a goodput.json's content over all attempts and per attempt (None if it
    holds none). An attempt's goodput counts its steps that the next attempt redid
    (`lost_steps`, `lost_s`) as not kept."""
    attempts = data.get("attempts") if isinstance(data, dict) else None
    if not attempts or not isinstance(attempts, list):
        return None
    keys = ("wall_s", *(f"{c}_s" for c in CATEGORIES))
    per = []
    for i, a in enumerate(attempts):
        after = attempts[i + 1] if i + 1 < len(attempts) else {}
        lost = {"lost_steps": after.get("redone_steps", 0), "lost_s": after.get("redone_s", 0.0)}
        record = {"train_s": a.get("train_s", 0.0), "redone_s": lost["lost_s"],
                  "wall_s": a.get("wall_s", 0.0)}
        per.append({"steps": f"{a.get('start_step', 0)}-{a.get('step', 0)}",
                    "goodput": round(goodput(record), 4),
                    **{k: round(a.get(k, 0.0), 1) for k in keys},
                    "lost_steps": lost["lost_steps"], "lost_s": round(lost["lost_s"], 1)})
    t = totals(attempts)
    return {"goodput": round(t["goodput"], 4),
            **{k: round(t[k], 1) for k in (*keys, "redone_s")}, "redone_steps": t["redone_steps"],
            "restarts": len(attempts) - 1, "attempts": per}
