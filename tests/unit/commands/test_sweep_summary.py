"""A sweep trial whose summary.json does not read (commands/sweep.py): named, not a raw JSON
error, and the trial run again, whose train rewrites the summary (a stand-in process here)."""

import json
import sys
from pathlib import Path

from bert_jax.commands import sweep

REPO = Path(__file__).resolve().parents[3]


def test_a_damaged_summary_is_named_and_the_trial_run_again(tmp_path, monkeypatch, caplog):
    config = sweep.sweep_config("configs/glue.py:sst2,tiny", {"optimizer.learning_rate": (1e-3,)})
    trial = tmp_path / "learning_rate=0.001_seed=0"
    trial.mkdir()
    (trial / sweep.SUMMARY).write_text("garbage")
    assert sweep.finished(trial) is None
    assert sweep.damaged_summary(trial).startswith(f"{trial / sweep.SUMMARY}: not valid JSON (")
    (trial / sweep.SUMMARY).write_text("[2]")
    assert sweep.damaged_summary(trial) == f"{trial / sweep.SUMMARY}: not a JSON object"
    runs = tmp_path / "runs.txt"  # a line per run of the trial's process
    # the trial's train: finished before, it only rewrites its summary (train._repair_summary)
    repair = ("import json, pathlib; pathlib.Path({path!r}).write_text(json.dumps({{'step': 2, "
              "'steps': 2, 'preempted': False, 'best_metric': 'eval/accuracy'}})); "
              "open({runs!r}, 'a').write('ran\\n')")

    def command(s, setting, workdir):
        return [sys.executable, "-c", repair.format(path=str(trial / sweep.SUMMARY), runs=str(runs))]
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sweep, "command", command)
    with caplog.at_level("INFO"):
        sweep.run_sweep(config, str(tmp_path))
    assert runs.read_text() == "ran\n"
    assert f"{trial / sweep.SUMMARY}: not a JSON object: running the trial again" in caplog.text
    assert sweep.finished(trial)["step"] == 2
    assert (tmp_path / "results.csv").read_text().splitlines()[1].split(",")[3] == "finished"
    sweep.run_sweep(config, str(tmp_path))  # finished now: skipped
    assert runs.read_text() == "ran\n"
    assert json.loads((trial / sweep.SUMMARY).read_text())["steps"] == 2
