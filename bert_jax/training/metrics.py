"""What the training loop reports: metrics.jsonl, TensorBoard scalars, console progress and MFU.

metrics.jsonl holds one JSON object per write, `{"step": N, name: value, ..., "time": unix
seconds}` ("time": when it was written, for plots against wall time; a training line also
holds the job's running `goodput` and its wall time by category, `goodput/<category>_s`, see
goodput.py). Non-finite values are written as the strings "nan", "inf", "-inf" so every line
stays strict JSON; `read_metrics` turns them back into floats. Keys starting with "eval/" are
evaluation results and share the file and the TensorBoard run with the training scalars.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import jax
import numpy as np

from bert_jax import chips, paths
from bert_jax.paths import is_remote

METRICS_FILE = "metrics.jsonl"
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_BAR_WIDTH = 24


def _encode(value: Any) -> int | float | str:
    """A JSON-safe scalar: ints stay ints, non-finite floats become "nan"/"inf"/"-inf"."""
    if isinstance(value, int | np.integer):
        return int(value)
    x = float(value)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def json_dumps(value: Any, **kwargs) -> str:
    """json.dumps of `value` (dicts, lists and tuples of scalars) with each non-finite float
    written as metrics.jsonl writes it ("nan", "inf", "-inf"): strict JSON (a bare NaN, Python's
    default, is refused by most other readers). `kwargs` go to json.dumps (indent, ...)."""
    return json.dumps(_json_safe(value), allow_nan=False, **kwargs)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return _encode(value)
    return value


def _rows(text: str, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(line, parsed row) for each line of a metrics.jsonl text."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no newline after it: a write cut short by a crash
                return
            raise ValueError(f"{where}:{i + 1}: not a JSON line: {line[:80]!r}") from None
        if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
            raise ValueError(f"{where}:{i + 1}: not a metrics row (a JSON object with an integer "
                             f"\"step\", as bert-jax train writes): {line[:80]!r}; remove or fix "
                             "the line")
        row = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in row.items()}
        if bad := next((k for k, v in row.items()
                        if not isinstance(v, int | float) or isinstance(v, bool)), None):
            raise ValueError(f"{where}:{i + 1}: {bad!r} is {json.dumps(row[bad])[:40]}, not a number "
                             "(bert-jax train writes numbers, and \"nan\", \"inf\" or \"-inf\"); "
                             "remove or fix the line")
        yield line, row


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (local or gs://), with "nan"/"inf"/"-inf" turned back into
    floats."""
    path = paths.path(path)
    return [row for _, row in _rows(path.read_text(encoding="utf-8"), str(path))]


def _rewrite(path: Path, max_step: int | None) -> None:
    """Keeps the complete lines of `path` with step <= max_step (all if None), atomically."""
    text = path.read_text(encoding="utf-8")
    keep = [line for line, row in _rows(text, str(path)) if max_step is None or row["step"] <= max_step]
    new = "".join(line + "\n" for line in keep)
    if new == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(new)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: a crash leaves the old file or the new one, never neither


class MetricsWriter:
    """Writes each step's scalars to metrics.jsonl, TensorBoard and the console."""

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True,
                 total_steps: int | None = None, resume_step: int | None = None,
                 stream: TextIO | None = None):
        # stream=None means sys.stdout as it is now (not at import), so redirections apply.
        self.enabled = enabled
        self.total_steps = total_steps
        self._file = self._tb = None
        self._bar_len = 0  # characters of progress bar now on screen; 0: none
        if not enabled:  # other processes of a multi-host run: no files, no output
            return
        self._remote = None
        if is_remote(workdir):
            # Object stores (gs://) have no appends: write to a local mirror and copy the
            # files over after each write (they are small). A fresh mirror per run, so no
            # event files of an earlier run (or another process) get copied over.
            self._remote = paths.path(str(workdir))
            workdir = Path(tempfile.mkdtemp(prefix="bert_jax_metrics_"))
            if (self._remote / METRICS_FILE).exists():
                (workdir / METRICS_FILE).write_text((self._remote / METRICS_FILE).read_text())
        # Imported here: slow to import, and only the writing process (process 0) needs it.
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self.stream = stream if stream is not None else sys.stdout
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.path = Path(workdir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            # Lines after the resumed checkpoint come from work that was lost: drop them.
            # Without a resume step only a partial last line (a crash mid-write) goes.
            _rewrite(self.path, resume_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = EventFileWriter(str(workdir))
        if resume_step is not None:
            # TensorBoard drops earlier events with step >= a START event's step (its
            # "orphaned data" purge), so N + 1 hides the lost steps and keeps step N.
            log = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=resume_step + 1,
                                               session_log=log))
        self._clock = (time.perf_counter(), resume_step or 0)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Appends `{"step": step, **metrics}` to metrics.jsonl and TensorBoard, and shows it."""
        if not self.enabled:
            return
        if "step" in metrics or "time" in metrics:
            raise ValueError("metrics may not contain a 'step' or 'time' key; the writer adds them")
        row = {"step": int(step), **{k: _encode(v) for k, v in metrics.items()},
               "time": round(time.time(), 3)}
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        values = [self._summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._tb.add_event(self._event_pb2.Event(wall_time=time.time(), step=int(step),
                                                 summary=self._summary_pb2.Summary(value=values)))
        self._tb.flush()  # writes come every log_every steps: cheap, and TensorBoard stays live
        self._sync()
        train = {k: float(v) for k, v in metrics.items() if not k.startswith("eval/")}
        evals = {k: float(v) for k, v in metrics.items() if k.startswith("eval/")}
        if train:
            self._show_train(int(step), train)
        if evals:
            self._print(f"eval step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in evals.items()))

    def _rate(self, step: int, m: dict[str, float]) -> float | None:
        """Steps per second: the loop's own measure if it gave one, else ours since the last write."""
        now, (then, last) = time.perf_counter(), self._clock
        self._clock = (now, step)
        if m.get("steps_per_sec", 0) > 0:
            return m["steps_per_sec"]
        return (step - last) / (now - then) if step > last and now > then else None

    def _show_train(self, step: int, m: dict[str, float]) -> None:
        rate, total = self._rate(step, m), self.total_steps
        eta = datetime.timedelta(seconds=round(max(total - step, 0) / rate)) if total and rate else None
        at = f"{step}/{total}" if total else f"{step}"
        if self._tty:
            done = min(max(step / total, 0.0), 1.0) if total else 0.0
            bar = f"[{'#' * round(done * _BAR_WIDTH):<{_BAR_WIDTH}}] " if total else "step "
            parts = [bar + at]
            parts += [f"loss {m['loss']:.4f}"] if "loss" in m else []
            parts += [f"{rate:.2f} steps/s"] if rate else []
            parts += [f"goodput {100 * m['goodput']:.0f}%"] if "goodput" in m else []
            parts += [f"eta {eta}"] if eta is not None else []
            text = "  ".join(parts)
            # \r redraws in place; padding erases what a longer previous bar left behind.
            self.stream.write("\r" + text.ljust(self._bar_len))
            self.stream.flush()
            self._bar_len = len(text)
            return
        lr = m.get("learning_rate", m.get("lr"))
        parts = [f"step {at}"]
        parts += [f"loss {m['loss']:.4f}"] if "loss" in m else []
        parts += [f"lr {lr:.2e}"] if lr is not None else []
        parts += [f"tokens/s {m['tokens_per_sec']:,.0f}"] if "tokens_per_sec" in m else []
        parts += [f"mfu {100 * m['mfu']:.1f}%"] if "mfu" in m else []
        parts += [f"goodput {100 * m['goodput']:.0f}%"] if "goodput" in m else []
        parts += [f"eta {eta}"] if eta is not None else []
        self._print("  ".join(parts))

    def _print(self, line: str) -> None:
        """A whole line, below the progress bar (which the next train write redraws)."""
        if self._bar_len:
            self.stream.write("\n")
            self._bar_len = 0
        self.stream.write(line + "\n")
        self.stream.flush()

    def _sync(self) -> None:
        """Copies metrics.jsonl and the event files to a remote workdir."""
        if self._remote is None:
            return
        self._remote.mkdir(parents=True, exist_ok=True)
        for f in self.path.parent.iterdir():
            if f.name == METRICS_FILE or f.name.startswith("events.out.tfevents"):
                (self._remote / f.name).write_bytes(f.read_bytes())

    def close(self) -> None:
        """Flushes and closes the files; ends the progress bar's line."""
        if self._file is None:
            return
        if self._bar_len:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_len = 0
        self._file.close()
        self._tb.close()
        self._sync()
        if self._remote is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)
        self._file = self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_MEASURED: dict[str, float] = {}  # platform:device_kind -> FLOP/s, measured once per process


def _measure_matmul(device: jax.Device, n: int = 1024, seconds: float = 0.3) -> float:
    """Best-of-repeats FLOP/s of a jitted float32 n x n matmul on `device`."""
    a = jax.device_put(np.random.default_rng(0).standard_normal((n, n), np.float32), device)
    f = jax.jit(lambda x, y: x @ y)
    for _ in range(3):  # compile, then let caches and thread pools settle
        f(a, a).block_until_ready()
    best, spent, reps = math.inf, 0.0, 0
    while spent < seconds or reps < 3:
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return 2 * n**3 / best


def peak_flops_per_device(device: jax.Device | None = None) -> tuple[float, str]:
    """Peak dense FLOP/s of one device (default: the first local one) and where it comes from."""
    device = device if device is not None else jax.local_devices()[0]
    published = chips.peak_flops(device.device_kind)
    if published is not None:
        return published
    # CPUs and unlisted accelerators: no spec sheet to trust, so measure.
    key = f"{device.platform}:{device.device_kind}"
    if key not in _MEASURED:
        with jax.set_mesh(None):  # the caller's mesh (train.py's) would reject a 1-device array
            _MEASURED[key] = _measure_matmul(device)
    return _MEASURED[key], f"measured f32 matmul on {device.platform}"


def mfu(model_flops_per_step: float, step_seconds: float, num_devices: int, peak: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the peak of all devices (0.4 = 40%)."""
    if step_seconds <= 0 or num_devices <= 0 or peak <= 0:
        raise ValueError(f"mfu needs positive step_seconds ({step_seconds}), num_devices "
                         f"({num_devices}) and peak ({peak})")
    return model_flops_per_step / (step_seconds * num_devices * peak)
