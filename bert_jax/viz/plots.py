"""Pictures of runs: `bert-jax plot` (training curves of one or more workdirs) and the
sweep figure (results.png beside a sweep's results.md). Each figure is written with its
data beside it (same name, .csv), so every point can be looked up or redrawn elsewhere.

Matplotlib is an extra (`pip install 'bert_jax[plot]'`; `make install` includes it).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax import paths
from bert_jax.config import MissingExtra
from bert_jax.paths import workdir_path
from bert_jax.training import metrics as metrics_lib

log = logging.getLogger(__name__)

X_AXES = {"step": "step", "time": "wall time (hours)", "tokens": "real (non-padding) tokens"}
# Bookkeeping columns of metrics.jsonl, not curves (steps/s: the time axis; tokens/s and MFU
# are drawn too).
_NOT_SERIES = {"step", "time", "steps_per_sec"}
# goodput/<category>_s: the seconds behind the goodput curve (in plot_workdirs' report).
_BOOKKEEPING = "goodput/"
# Curves drawn as they are: exact values or running ratios, not noisy per-step ones.
_NOT_SMOOTHED = {"learning_rate", "goodput"}
FORMATS = (".png", ".svg", ".pdf")


def new_figure(**kwargs):
    """A matplotlib Figure that draws without pyplot (no global backend or figure registry is
    touched, so a notebook's own plotting is left as it was)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingExtra("figures need matplotlib: pip install 'bert_jax[plot]' (or "
                           "`pip install matplotlib`)") from None
    return Figure(**kwargs)


@dataclasses.dataclass
class Run:
    """One workdir's metrics: train rows, eval rows, and the steps where phases start."""

    name: str
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    phase_starts: list[int]


def load_run(workdir: str, name: str | None = None) -> Run:
    """The metrics of a `bert-jax train` workdir (local or gs://)."""
    path = workdir_path(workdir) / metrics_lib.METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"--workdir={workdir}: no {metrics_lib.METRICS_FILE}; expected the "
                                "workdir of a `bert-jax train` run")
    rows = metrics_lib.read_metrics(str(path))
    train = [r for r in rows if any(not k.startswith("eval/") and k not in _NOT_SERIES for k in r)]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if not rows:
        raise ValueError(f"{path}: empty; the run has not logged a step yet")
    return Run(name or os.path.basename(str(workdir).rstrip("/")) or str(workdir), train, evals,
               _phase_starts(workdir))


def _phase_starts(workdir: str) -> list[int]:
    """Steps > 0 where a sequence-length phase starts (data.phases of the stored config)."""
    from bert_jax.training import checkpoint  # Orbax: slow to import, needed only here

    try:
        config = checkpoint.read_config(workdir)
    except (ValueError, OSError):  # no checkpoint yet: no phases to mark
        return []
    return sorted(int(p[0]) for p in (config.get("data", {}).get("phases") or ()) if int(p[0]) > 0)


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: a debiased exponential moving average (weight 0 = raw);
    non-finite values are passed through and skipped."""
    out, avg, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        avg, n = avg * weight + (1 - weight) * v, n + 1
        out.append(avg / (1 - weight ** n))
    return out


def x_values(run: Run, x: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, x) at the run's train rows: steps, hours since the first write, or cumulative
    real tokens (tokens/s over steps/s is the tokens per step of each logging window)."""
    steps = np.array([r["step"] for r in run.train], float)
    if x == "step":
        return steps, steps
    rate = np.array([r.get("steps_per_sec", math.nan) for r in run.train], float)
    delta = np.diff(steps, prepend=0.0)
    if x == "time":
        if all("time" in r for r in run.train):
            t = np.array([r["time"] for r in run.train], float)
            first = t[0] - delta[0] / rate[0] if math.isfinite(rate[0]) else t[0]
            return steps, (t - first) / 3600
        return steps, np.nancumsum(delta / rate) / 3600
    tokens = np.array([r.get("tokens_per_sec", math.nan) for r in run.train], float)
    if np.isnan(tokens).all():
        raise ValueError(f"run {run.name!r} logged no tokens_per_sec; plot it with --x=step")
    return steps, np.nancumsum(delta * tokens / rate)


def _x_at(step: int, steps: np.ndarray, xs: np.ndarray, x: str) -> float | None:
    """The x of `step` (an eval or a phase start): the step itself, or on the time and tokens
    axes interpolated between the logged train rows; None outside them (unknown)."""
    if x == "step":
        return float(step)
    if not len(steps) or not steps[0] <= step <= steps[-1]:
        return None
    return float(np.interp(step, steps, xs))


def _panels(runs: Sequence[Run]) -> list[tuple[str, str | None, str | None]]:
    """(title, train key, eval key) per panel: loss, learning rate, every train metric with
    its eval counterpart, then metrics only evaluation reports."""
    train_keys = {k for run in runs for r in run.train for k in r
                  if not k.startswith(("eval/", _BOOKKEEPING))}
    eval_keys = {k for run in runs for r in run.evals for k in r if k.startswith("eval/")}
    train_keys -= _NOT_SERIES
    first, last = ["loss", "learning_rate"], ["tokens_per_sec", "mfu", "goodput"]  # speed last
    order = first + sorted(train_keys - {*first, *last}) + last
    panels = [(k, k, f"eval/{k}" if f"eval/{k}" in eval_keys else None)
              for k in order if k in train_keys]
    panels += [(k, None, k) for k in sorted(eval_keys - {f"eval/{k}" for k in train_keys})]
    return panels


def _ylabel(key: str) -> str:
    name = key.removeprefix("eval/")
    if name == "learning_rate":
        return "learning rate"
    if name == "loss":
        return "loss (the objective's sum of terms)"
    if name == "goodput":
        return "goodput (kept train-step time / wall)"
    if name.endswith("loss"):
        return "cross-entropy (nats)"
    if name.endswith("loss_mse"):
        return "mean squared error"
    return name.replace("_", " ")


def plot_runs(runs: Sequence[Run], *, x: str = "step", smoothing: float = 0.6):
    """(matplotlib figure, data rows) of the runs' curves, one panel per metric: train values
    raw (thin) and smoothed, evaluations as points, phase starts as dotted lines."""
    if x not in X_AXES:
        raise ValueError(f"--x={x!r}; choose one of {list(X_AXES)}")
    if not 0 <= smoothing < 1:
        raise ValueError(f"--smoothing={smoothing} must be in [0, 1)")
    panels = _panels(runs)
    if not panels:
        raise ValueError("no metrics to plot in " + ", ".join(r.name for r in runs))
    cols = min(3, len(panels))
    rows_n = math.ceil(len(panels) / cols)
    fig = new_figure(figsize=(5.2 * cols, 3.6 * rows_n))
    axes = fig.subplots(rows_n, cols, squeeze=False)
    colors = [c["color"] for c in rc_cycle()]
    data: list[dict[str, Any]] = []
    for ax, (title, train_key, eval_key) in zip(axes.flat, panels):
        values_seen: list[float] = []
        for i, run in enumerate(runs):
            color = colors[i % len(colors)]
            steps, xs = x_values(run, x) if run.train else (np.zeros(0), np.zeros(0))
            at = lambda s, steps=steps, xs=xs: _x_at(s, steps, xs, x)  # noqa: E731
            if train_key:
                pts = [(xx, r["step"], float(r[train_key])) for xx, r in zip(xs, run.train)
                       if train_key in r]
                if pts:
                    px, ps, py = map(list, zip(*pts))
                    weight = 0.0 if train_key in _NOT_SMOOTHED else smoothing
                    sm = smooth(py, weight)
                    if weight:
                        ax.plot(px, py, color=color, alpha=0.25, linewidth=0.8,
                                gid=f"{run.name}|{train_key}|raw")
                    ax.plot(px, sm, color=color, linewidth=1.6, label=run.name,
                            gid=f"{run.name}|{train_key}|{'smoothed' if weight else 'raw'}")
                    values_seen += py
                    data += [{"run": run.name, "series": train_key, "step": s, "x": xx, "value": v,
                              "smoothed": m} for s, xx, v, m in zip(ps, px, py, sm)]
            if eval_key:
                pts = [(r["step"], at(r["step"]), float(r[eval_key])) for r in run.evals
                       if eval_key in r and at(r["step"]) is not None]
                if pts:
                    es, ex, ev = map(list, zip(*pts))
                    ax.plot(ex, ev, color=color, marker="o", markersize=4, linestyle="--",
                            linewidth=1, label=None if train_key else run.name,
                            gid=f"{run.name}|{eval_key}|eval")
                    values_seen += ev
                    data += [{"run": run.name, "series": eval_key, "step": s, "x": xx, "value": v,
                              "smoothed": ""} for s, xx, v in zip(es, ex, ev)]
            last = max([r["step"] for r in run.train + run.evals], default=0)
            for p, start in enumerate(run.phase_starts):
                if start > last or at(start) is None:  # not reached yet (or off this axis)
                    continue
                ax.axvline(at(start), color=color, linestyle=":", linewidth=1.2,
                           label=f"{run.name}: phase {p + 2} starts" if ax is axes.flat[0] else None)
        finite = [v for v in values_seen if math.isfinite(v)]
        if (finite and min(finite) > 0 and max(finite) / min(finite) > 30
                and title not in _NOT_SMOOTHED):
            ax.set_yscale("log")
        ax.set_title(title + ("  (train: line; eval: points)" if train_key and eval_key else
                              "  (eval)" if eval_key else ""), fontsize=10)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(_ylabel(title))
        ax.grid(alpha=0.3)
        if x == "step":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 5))
        if title == "learning_rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat[1:len(panels)]:  # runs that only have eval points, etc.
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(4, max(1, len(labels))),
               frameon=False, bbox_to_anchor=(0.5, 1.0))
    note = f"thin: raw; thick: smoothed (weight {smoothing:g})" if smoothing else "raw values"
    fig.text(0.99, 0.005, note, ha="right", va="bottom", fontsize=8, color="gray")
    fig.tight_layout(rect=(0, 0.02, 1, 1 - 0.35 / (3.6 * rows_n) * 2))
    return fig, data


def rc_cycle() -> list[dict]:
    from matplotlib import rcParams

    return list(rcParams["axes.prop_cycle"])


def save_figure(fig, out: str) -> str:
    """Writes the figure to `out` (.png, .svg or .pdf; local or gs://); returns the path."""
    suffix = os.path.splitext(str(out))[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"--out={out}: the file name must end in one of {list(FORMATS)}")
    buf = io.BytesIO()
    fig.savefig(buf, format=suffix[1:], dpi=110, bbox_inches="tight")
    write_bytes(out, buf.getvalue())
    return str(out)


def write_bytes(out: str, data: bytes) -> None:
    """Writes a file, local or gs://, making its folder; a clear error names --out."""
    path = workdir_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as e:
        raise OSError(f"--out={out}: cannot write it ({e.strerror or e}); choose another --out") from None


def csv_bytes(rows: list[dict[str, Any]]) -> bytes:
    """The rows as CSV (columns: the union of their keys, in first-seen order)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def write_data(out: str, data: bytes) -> str:
    """Writes a figure's data file, unless it holds these bytes already (the same figure drawn
    in another format: check_new_file let it be); returns the path."""
    existing = workdir_path(out)
    if not (existing.is_file() and existing.read_bytes() == data):
        write_bytes(out, data)
    return str(out)


def data_path(out: str, suffix: str = ".csv") -> str:
    """Where a figure's data go: beside it, same name."""
    return os.path.splitext(str(out))[0] + suffix


def plot_workdirs(workdirs: Sequence[str], out: str | None = None, *, x: str = "step",
                  smoothing: float = 0.6) -> dict[str, Any]:
    """`bert-jax plot`: the curves of the workdirs in one figure (default
    <first workdir>/plots/metrics.png) and their data (.csv beside it)."""
    if not workdirs:
        raise ValueError("`bert-jax plot` needs --workdir (one or more run directories)")
    # (the default, plots/ of the first workdir, is plot's own: drawn again)
    given = out
    if given:  # (its data file is checked below, once the data it would hold are known)
        paths.check_new_file(given, "--out", "plot")
    names = [os.path.basename(str(w).rstrip("/")) for w in workdirs]
    if len(set(names)) < len(names):  # the same folder name under different parents
        names = [str(w).rstrip("/") for w in workdirs]
    runs = [load_run(w, n) for w, n in zip(workdirs, names)]
    out = out or str(workdir_path(workdirs[0]) / "plots" / "metrics.png")
    fig, data = plot_runs(runs, x=x, smoothing=smoothing)
    table = csv_bytes(data)
    if given:  # a data file holding these very rows: the same plot in another format
        paths.check_new_file(given, "--out", "plot", [data_path(given)], {data_path(given): table})
    save_figure(fig, out)
    return {"figure": str(out), "data": write_data(data_path(out), table),
            "runs": [r.name for r in runs], "series": sorted({d["series"] for d in data}),
            "phase_starts": {r.name: r.phase_starts for r in runs if r.phase_starts},
            "goodput": {r.name: g for r in runs if (g := goodput_breakdown(r))}}


def goodput_breakdown(run: Run) -> dict[str, float] | None:
    """The last logged goodput of a run and the wall time behind it, by category (seconds)."""
    rows = [r for r in run.train if "goodput" in r]
    if not rows:
        return None
    last = rows[-1]
    return {"step": last["step"], "goodput": last["goodput"],
            **{k.removeprefix(_BOOKKEEPING): v for k, v in last.items() if k.startswith(_BOOKKEEPING)}}


def sweep_figure(groups: dict[str, list[float]], metric: str, title: str):
    """Figure of a sweep: per setting (x, labelled by the keys of `groups`), each finished
    trial's `metric` as a point (one per seed) and the median as a bar."""
    if not groups:
        raise ValueError(f"no finished trial has {metric}")
    fig = new_figure(figsize=(max(4.0, 1.1 * len(groups) + 2), 4.0))
    ax = fig.subplots()
    for i, ys in enumerate(groups.values()):
        offsets = np.linspace(-0.15, 0.15, len(ys)) if len(ys) > 1 else [0.0]
        ax.scatter(i + np.asarray(offsets), ys, s=22, color="tab:blue", zorder=3,
                   label="a seed" if i == 0 else None, gid=f"seeds|{i}")
    at = np.arange(len(groups))
    ax.hlines([statistics.median(ys) for ys in groups.values()], at - 0.3, at + 0.3,
              color="tab:red", linewidth=2.2, zorder=4, label="median", gid="medians")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(list(groups), fontsize=8)
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sweep_results(groups: dict[str, list[float]], metric: str, title: str, out: str) -> str:
    """Saves the sweep figure (its data: the sweep's results.csv) at `out`; returns the markdown
    line that shows it, or says why there is none."""
    try:
        save_figure(sweep_figure(groups, metric, title), out)
    except Exception as e:  # noqa: BLE001 (a figure is never worth losing results.md over)
        log.warning(f"no {os.path.basename(out)}: {e}")
        return f"(No figure: {e}.)"
    return (f"![{metric} per setting]({os.path.basename(out)})\n\nEach point is one seed's best "
            f"{metric}, the bar the median over seeds; the points are the rows of results.csv.")
