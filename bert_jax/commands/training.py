"""`bert-jax train`, `eval` and `average`: a run in a workdir, its checkpoints evaluated or averaged."""

from __future__ import annotations

import json
import sys

from bert_jax.commands import peers
from bert_jax.commands.options import (
    CONFIG,
    LAST,
    OUT,
    SPLIT,
    STEP,
    WORKDIR,
    LoadedConfig,
    Started,
    maybe_initialize_distributed,
    require,
)


def cmd_train(args: list[str]) -> None:
    """Trains (or resumes) the config in --workdir; metrics go to <workdir>/metrics.jsonl."""
    maybe_initialize_distributed("train")
    import jax

    from bert_jax.training import train

    workdir = require(WORKDIR, "train")  # (not empty: commands.check_path_flags)
    summary = train.train_and_evaluate(require(CONFIG, "train"), workdir,
                                       set_by_user=LoadedConfig.set_by_user(), started=Started.at)
    if summary.get("interrupted"):  # Ctrl-C: the step reached was saved
        peers.finished()  # (a multi-process run: every process saved that step; not a fault)
        print(f"bert-jax train: interrupted: saved checkpoint {summary['interrupted']}; run the "
              f"same command to resume", file=sys.stderr)
        sys.exit(130)
    if jax.process_index() == 0:
        print(json.dumps({k: summary[k] for k in ("step", "preempted")}
                         | {"metrics": summary.get("metrics"), "eval": summary.get("eval")}))


def cmd_eval(args: list[str]) -> None:
    """Evaluates saved checkpoints on the validation split (with the config stored in the
    checkpoint unless --config is given); prints one JSON line each."""
    maybe_initialize_distributed("eval")
    from bert_jax.training import evaluate, metrics

    for result in evaluate.evaluate_checkpoints(
            LoadedConfig.value, require(WORKDIR, "eval"), STEP.value, SPLIT.value,
            frozenset(LoadedConfig.set_by_user())):
        print(metrics.json_dumps(result))


def cmd_average(args: list[str]) -> None:
    """Averages the newest --last checkpoints of a workdir into a new checkpoint --out."""
    from bert_jax.training import average

    report = average.average_checkpoints(require(WORKDIR, "average"), LAST.value,
                                         require(OUT, "average"))
    print(json.dumps(report))
