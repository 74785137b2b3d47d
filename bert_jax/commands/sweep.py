"""`bert-jax sweep`: a grid of fine-tuning runs from a sweep config, one sub-workdir per trial.

A sweep config (configs/sweeps/*.py) has `base` (the run's `--config` spec), `overrides`
(`key=value` strings applied to every trial) and `grid` ({config key: tuple of values}; the
key `seed` marks repetitions of one setting). Each trial runs `bert-jax train` in its own
process in `<workdir>/<trial name>`; a trial whose summary.json says it finished is skipped
(unless the config it ran, recorded in trial_config.json, differs from the one it would run now:
then the sweep stops before any trial, naming the keys) and an interrupted one resumes from its
checkpoint. A trial that fails (bert-jax found a bad
input: exit 1 or 2) is reported with its error line and log, and tried again on the next run
(its cause may have been fixed meanwhile). Then `results.csv` (a row per trial),
`results.md` (per setting: median and best over seeds; the best setting) and `results.png`
(each seed's metric as a point per setting, medians marked) are written.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_collections

from bert_jax import config as config_lib
from bert_jax import trees
from bert_jax.commands.options import CONFIG, PRINT_COMMANDS, WORKDIR, require
from bert_jax.paths import is_remote

log = logging.getLogger(__name__)

SUMMARY = "summary.json"  # written by train_and_evaluate at the end of a run
FAILED = "failed.json"  # written here when a trial fails: {"exit": code, "error": its error line}
# written here when a trial starts: its run config as loaded (the sweep's base, overrides and the
# trial's grid values), which a finished trial's must equal on a later run (refuse_changed_trials)
TRIAL = "trial_config.json"


# Appendix A.3 of the BERT paper: the fine-tuning values that "work well across all tasks".
PAPER_A3_GRID = {"train.batch_size": (16, 32), "optimizer.learning_rate": (5e-5, 3e-5, 2e-5),
                 "train.epochs": (2.0, 3.0, 4.0)}


def sweep_config(base: str, grid: dict[str, tuple]) -> ml_collections.ConfigDict:
    """A sweep config: `base` run, no overrides yet, `grid` plus seed (0,) (set more seeds with
    --config.grid.seed='(0, 1, 2)')."""
    sweep = ml_collections.ConfigDict()
    sweep.base = base
    sweep.overrides = ()  # "key=value" strings for every trial (init_from, data.data_dir, ...)
    sweep.grid = ml_collections.ConfigDict({**grid, "seed": (0,)}, allow_dotted_keys=True)
    return sweep


def cmd_sweep(args: list[str]) -> None:
    """Runs every trial of a sweep config (skipping finished ones), then writes results.csv/.md."""
    try:
        result = run_sweep(require(CONFIG, "sweep"), require(WORKDIR, "sweep"), PRINT_COMMANDS.value,
                           spec=CONFIG.value)
    except TrialsFailed as e:
        print(f"bert-jax sweep: error: {e}", file=sys.stderr)
        sys.exit(1)
    if PRINT_COMMANDS.value:
        print("\n".join(result["commands"]))
    else:
        print(Path(result["results"]).read_text())


class TrialsFailed(RuntimeError):
    """Some trials failed (their error lines and logs named) or were interrupted (rerunning
    the sweep resumes them)."""


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def trials(sweep) -> list[dict[str, Any]]:
    """Every combination of the grid, in a fixed order: [{key: value, ...}, ...]."""
    keys = sorted(sweep.grid.keys(), key=lambda k: k == "seed")  # seeds vary fastest
    return [dict(zip(keys, values)) for values in itertools.product(*(sweep.grid[k] for k in keys))]


def trial_name(setting: dict[str, Any]) -> str:
    return "_".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in setting.items())


def command(sweep, setting: dict[str, Any], workdir: str | Path) -> list[str]:
    """The `bert-jax train` command line of one trial."""
    args = [f"--config.{item}" for item in sweep.overrides]
    args += [f"--config.{k}={_fmt(v)}" for k, v in setting.items()]
    # Joined as text: Path("gs://b/sweep") would become the local folder "gs:/b/sweep".
    return [sys.executable, "-m", "bert_jax", "train", f"--config={sweep.base}",
            f"--workdir={str(workdir).rstrip('/')}/{trial_name(setting)}", *args]


def finished(trial_dir: Path) -> dict | None:
    """The trial's summary if it ran to its last step, else None (no summary, or one that does
    not read: damaged_summary says so; running the trial again rewrites it)."""
    path = trial_dir / SUMMARY
    if not path.is_file() or damaged_summary(trial_dir):
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary if summary.get("step") == summary.get("steps") and not summary.get("preempted") else None


def damaged_summary(trial_dir: Path) -> str | None:
    """What is wrong with the trial's summary.json when it is there but not a JSON object."""
    path = trial_dir / SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # (not JSON, not UTF-8)
        return f"{path}: not valid JSON ({str(e)[:80]})"
    return None if isinstance(summary, dict) else f"{path}: not a JSON object"


def error_line(log_file: Path) -> str:
    """The error a failed trial ended with: its `bert-jax ...` line (else the log's last line)."""
    with open(log_file, "rb") as f:
        f.seek(max(f.seek(0, 2) - (1 << 16), 0))
        lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("bert-jax")]
    line = (ours or lines or ["(empty log)"])[-1]
    return line.removeprefix("bert-jax train: error: ")


def failure(trial_dir: Path) -> dict | None:
    """{"exit", "error"} of the trial's last run if it failed, else None."""
    path = trial_dir / FAILED
    return json.loads(path.read_text()) if path.is_file() else None


def check_sweep(sweep, spec: str = "the sweep config") -> list[dict[str, Any]]:
    """Each trial's run config as JSON (what its `bert-jax train` process loads), checked as
    train checks it before it builds anything (config.resolve: types and ranges;
    config.check_overrides_read: keys the trial sets on its command line), so that no trial is
    printed or started while another would be refused; else a ValueError naming the trial and
    the key. (The checks that need the devices are the trial's own.)"""
    missing = [k for k in ("base", "overrides", "grid") if k not in sweep]
    if missing:
        raise ValueError(f"--config={spec} is not a sweep config (it has no {' or '.join(missing)}); "
                         "give a sweep file such as configs/sweeps/glue.py:mrpc")
    if bad := [k for k, v in sweep.grid.items() if not isinstance(v, (tuple, list)) or not v]:
        raise ValueError(f"grid.{bad[0]}={sweep.grid[bad[0]]!r}: expected a non-empty tuple of values")
    # Two equal values would be two trials of one name, in one folder (trial_name).
    if twice := [k for k, v in sweep.grid.items() if len({_fmt(x) for x in v}) < len(v)]:
        raise ValueError(f"grid.{twice[0]}={tuple(sweep.grid[twice[0]])!r} repeats a value: each "
                         "trial is one combination, run once; list each value once")
    check_overrides(sweep, spec)
    try:  # the base itself (the sweep's own argument chose it): not a trial's fault
        config_lib.load(sweep.base)
    except Exception as e:  # noqa: BLE001 (a config file can raise anything; say which file)
        message = e if isinstance(e, config_lib.ConfigError) else f"{type(e).__name__}: {e}"
        raise ValueError(f"sweep {spec}: its base run {sweep.base} cannot be loaded ({message}); "
                         "check the sweep's --config argument (or --config.base)") from None
    configs = []
    for setting in trials(sweep):
        items = [*sweep.overrides, *(f"{k}={_fmt(v)}" for k, v in setting.items())]
        try:
            config = config_lib.load(sweep.base, items)
            config_lib.check_overrides_read(config_lib.resolve(config),
                                            {item.partition("=")[0] for item in items})
        except Exception as e:  # noqa: BLE001 (a config file can raise anything; say which trial)
            message = e if isinstance(e, config_lib.ConfigError) else f"{type(e).__name__}: {e}"
            raise ValueError(f"sweep {spec}, trial {trial_name(setting)} (base={sweep.base}): "
                             f"{message}") from None
        configs.append(json.loads(config.to_json()))
    return configs


def check_overrides(sweep, spec: str) -> None:
    """A ValueError when `overrides` gives a key twice, or a key the grid also sets (the grid's
    value would replace it in every trial: the seed is always in the grid), naming the grid flag
    that sets it."""
    if repeated := config_lib.repeated_override(sweep.overrides):
        raise ValueError(f"sweep {spec}: overrides: {repeated}; keep one")
    for item in sweep.overrides:
        key, _, value = item.partition("=")
        if key in sweep.grid:
            raise ValueError(
                f"sweep {spec}: overrides sets {key}={value} but the grid sets {key} too (grid.{key}="
                f"{tuple(sweep.grid[key])!r} would replace it in every trial): give its values in "
                f"the grid instead, {config_lib.grid_flag(key, value)}, and drop it from overrides")


def differing_keys(before: dict, now: dict) -> list[str]:
    """'key: A before, B now' for each dotted key both sides hold whose value differs (a key one
    side lacks is another version's: a new default, as checkpoint.say_setting_changes reads it)."""
    old, new = trees.dotted(before), trees.dotted(now)
    return [f"{k}: {old[k]!r} before, {new[k]!r} now"
            for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def refuse_changed_trials(root: Path, settings: list[dict[str, Any]], configs: list[dict]) -> None:
    """A finished trial whose recorded run config (TRIAL, written when it started) differs
    from the one it would run now: its results are of other settings, and rerunning it would
    replace them; a ValueError naming the trial and the keys, before any trial runs."""
    changed = []
    for setting, config in zip(settings, configs):
        trial_dir = root / trial_name(setting)
        record = trial_dir / TRIAL
        if finished(trial_dir) and record.is_file():
            if diff := differing_keys(json.loads(record.read_text()), config):
                changed.append((trial_dir, diff))
    if changed:
        trial_dir, diff = changed[0]
        more = f" (and {len(changed) - 1} more finished trial(s))" if len(changed) > 1 else ""
        shown = "; ".join(diff[:5]) + (f"; {len(diff) - 5} more" if len(diff) > 5 else "")
        raise ValueError(f"trial {trial_dir} finished with other settings than it has now{more} "
                         f"({shown}): its results are not this sweep's; give the sweep a new "
                         f"--workdir (or move that trial's folder away to run it again)")


def run_trial(cmd: list[str], log_file) -> int:
    """A trial's `bert-jax train` process, its output into `log_file`; its exit code. On Ctrl-C
    (which reaches the trial too: one process group) the trial is waited for, as it saves the
    step it reached before it exits (130); a second Ctrl-C stops it at once."""
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            log.info("interrupted: waiting for the trial to save its step (Ctrl-C again stops it "
                     "at once, losing the steps since its last checkpoint)")
            return proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            raise


def run_sweep(sweep, workdir: str, print_commands: bool = False, spec: str = "the sweep config"
              ) -> dict[str, Any]:
    """Runs every unfinished trial, then writes the results tables; with `print_commands`
    only returns each trial's `bert-jax train` command line (for a cluster scheduler)."""
    configs = check_sweep(sweep, spec)
    root = Path(workdir)
    settings = trials(sweep)
    commands = [command(sweep, s, workdir) for s in settings]
    if print_commands:
        return {"trials": len(settings), "commands": [shlex.join(cmd) for cmd in commands]}
    if is_remote(workdir):
        raise ValueError(f"--workdir={workdir}: a sweep keeps its trial logs and results tables on "
                         "local disk; give a local --workdir, or use --print_commands to launch "
                         "the trials with gs:// workdirs on a cluster")
    refuse_changed_trials(root, settings, configs)
    root.mkdir(parents=True, exist_ok=True)
    failed, interrupted = [], []
    for i, (setting, cmd, config) in enumerate(zip(settings, commands, configs)):
        trial_dir = root / trial_name(setting)
        if finished(trial_dir):
            log.info(f"[{i + 1}/{len(settings)}] {trial_dir.name}: finished before, skipped")
            continue
        if damaged := damaged_summary(trial_dir):
            log.info(f"[{i + 1}/{len(settings)}] {damaged}: running the trial again (it resumes "
                     "from its checkpoint; a finished one only rewrites its summary.json)")
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / FAILED).unlink(missing_ok=True)  # tried again: its cause may be fixed
        (trial_dir / TRIAL).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        log_file = trial_dir / "train.log"
        log.info(f"[{i + 1}/{len(settings)}] {trial_dir.name}: running (log: {log_file})")
        with open(log_file, "a", encoding="utf-8") as trial_log:
            code = run_trial(cmd, trial_log)
        if code == 130:  # Ctrl-C: the trial saved its step and stopped; so does the sweep
            raise KeyboardInterrupt
        if finished(trial_dir):
            continue
        if code in (1, 2):  # bert-jax found a bad input or flag: the same run fails the same way
            error = error_line(log_file)
            (trial_dir / FAILED).write_text(json.dumps({"exit": code, "error": error}) + "\n")
            failed.append(f"{trial_dir.name}: {error} (log: {log_file})")
            log.info(f"    failed (exit {code}): {error}")
        else:  # killed, or stopped early (preempted): its checkpoint resumes it
            interrupted.append(trial_dir.name)
            log.info(f"    interrupted (exit {code}); see {log_file}")
    rows = write_results(sweep, root, settings)
    problems = []
    if failed:
        shown = failed[:2] + [f"{len(failed) - 2} more (each trial's train.log)"] * (len(failed) > 2)
        problems.append(f"{len(failed)} of {len(settings)} trial(s) failed: {'; '.join(shown)}; fix the "
                        "cause and rerun the sweep (it skips finished trials)")
    if interrupted:
        problems.append(f"{len(interrupted)} trial(s) were interrupted: {', '.join(interrupted)}; rerun "
                        "the sweep to resume them")
    if problems:
        raise TrialsFailed("; ".join(problems))
    return {"trials": len(settings), "results": str(root / "results.md"), "rows": rows}


def _best_eval(trial_dir: Path, metric: str) -> dict[str, Any] | None:
    """The evaluation (metrics.jsonl line) with the highest `metric`, ranked as checkpoints are
    (nan, an undefined metric, below every number; ties: the later step)."""
    from bert_jax.training import checkpoint, metrics

    path = trial_dir / metrics.METRICS_FILE
    if not path.is_file():
        return None
    evals = [r for r in metrics.read_metrics(path) if metric in r]
    return max(evals, key=lambda r: (checkpoint.rank_value(r[metric]), r["step"])) if evals else None


def write_results(sweep, root: Path, settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """results.csv (one row per trial) and results.md (per setting and the best setting)."""
    rows, metric = [], None
    for setting in settings:
        trial_dir = root / trial_name(setting)
        summary, failed = finished(trial_dir), failure(trial_dir)
        row: dict[str, Any] = {"trial": trial_dir.name, **setting,
                               "status": "finished" if summary else "failed" if failed else "unfinished"}
        if failed and not summary:
            row["error"] = failed["error"]
        if summary:
            metric = summary["best_metric"]
            best = _best_eval(trial_dir, metric) or {}
            row.update({"best_step": best.get("step"),
                        **{k: v for k, v in best.items() if k not in ("step", "time")}})
        rows.append(row)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(root / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
    groups = _groups(sweep, rows, metric)
    (root / "results.md").write_text(_markdown(sweep, rows, metric, groups,
                                               _figure(sweep, root, groups, metric)), encoding="utf-8")
    return rows


def _groups(sweep, rows: list[dict[str, Any]], metric: str | None) -> dict[tuple, list[float]]:
    """{setting (the grid values but the seed): [metric of each finished trial]} (nan, an
    undefined metric, included: it ranks its setting as it ranks a checkpoint, below every
    number; `_median`)."""
    keys = [k for k in sweep.grid.keys() if k != "seed"]
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if metric and r.get(metric) is not None:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r[metric])
    return groups


def _median(values: list[float]) -> float:
    """The median of a setting's trials, a nan trial counted below every number (so a setting
    whose trials are half nan is not ranked on its defined half); nan if that is where it falls."""
    from bert_jax.training import checkpoint

    middle = statistics.median(checkpoint.rank_value(v) for v in values)
    return math.nan if middle == -math.inf else middle


def setting_labels(sweep, groups: dict[tuple, list[float]]) -> dict[str, list[float]]:
    """{a setting's label (its grid values but the seed, a line each): its metric per seed}."""
    keys = [k.split(".")[-1] for k in sweep.grid.keys() if k != "seed"]
    return {"\n".join(f"{k}={_fmt(v)}" for k, v in zip(keys, s)) or "(one setting)": values
            for s, values in groups.items()}


def _figure(sweep, root: Path, groups: dict[tuple, list[float]], metric: str | None) -> str:
    """results.png (viz.plots draws it; its data are results.csv); returns the markdown line
    that shows it, or says why there is none."""
    groups = {s: defined for s, values in groups.items()
              if (defined := [v for v in values if not math.isnan(v)])}  # (nan: not drawn)
    if not groups:
        return ""
    from bert_jax.viz import plots

    return plots.sweep_results(setting_labels(sweep, groups), metric,
                               f"{Path(sweep.base).name}: {metric} per setting", str(root / "results.png"))


def _markdown(sweep, rows: list[dict[str, Any]], metric: str | None,
              groups: dict[tuple, list[float]], figure: str = "") -> str:
    from bert_jax.training import checkpoint

    keys = [k for k in sweep.grid.keys() if k != "seed"]
    lines = [f"# Sweep of {sweep.base}", "", f"{len(rows)} trials; metric: {metric or 'none yet'} "
             "(best evaluation of each trial on dev)", "", "| trial | status | best step | "
             f"{metric} |", "|---|---|---|---|"]
    for r in rows:
        value = r.get(metric) if metric else None
        lines.append(f"| {r['trial']} | {r['status']} | {r.get('best_step', '')} | "
                     f"{'' if value is None else f'{value:.4f}'} |")
    if groups:
        lines += ["", "## Per setting (over seeds)", "",
                  "| " + " | ".join(keys) + " | seeds | median | best |",
                  "|" + "---|" * (len(keys) + 3)]
        for setting, values in groups.items():
            undefined = sum(map(math.isnan, values))
            top = max((v for v in values if not math.isnan(v)), default=math.nan)
            lines.append("| " + " | ".join(map(_fmt, setting)) + f" | {len(values)}"
                         + (f" ({undefined} nan)" if undefined else "")
                         + f" | {_median(values):.4f} | {top:.4f} |")
        best = max(groups, key=lambda s: checkpoint.rank_value(_median(groups[s])))
        lines += ["", f"Best setting by median {metric}: "
                  + ", ".join(f"{k}={_fmt(v)}" for k, v in zip(keys, best))
                  + f" ({_median(groups[best]):.4f})"]
    if figure:
        lines += ["", figure]
    return "\n".join(lines) + "\n"
