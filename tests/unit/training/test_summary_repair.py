"""A finished run trained again ("already trained") rewrites a summary.json that is missing,
does not read, or does not say it finished; one that does is kept (training/train.py)."""

import json

import pytest

from bert_jax.training import train

DONE = {"step": 4, "preempted": False, "steps": 4, "best_metric": "eval/accuracy"}


@pytest.mark.parametrize("before", [None, "garbage", "[1]", json.dumps({"step": 2, "steps": 4})])
def test_a_missing_or_damaged_summary_is_rewritten(before, tmp_path):
    path = tmp_path / "summary.json"
    if before is not None:
        path.write_text(before)
    train._repair_summary(str(tmp_path), DONE)
    assert json.loads(path.read_text()) == DONE


def test_a_summary_that_says_the_run_finished_is_kept(tmp_path):
    path = tmp_path / "summary.json"
    kept = json.dumps({"step": 4, "steps": 4, "preempted": False, "metrics": {"loss": 1.5}})
    path.write_text(kept)
    train._repair_summary(str(tmp_path), DONE)
    assert path.read_text() == kept


def test_a_finished_runs_summary_is_kept_when_train_steps_is_now_given_lower(tmp_path):
    """Trained to 6, then run again with train.steps=4 ("already trained"): its summary still
    says it finished at its last checkpoint, and its eval, metrics and goodput stay."""
    path = tmp_path / "summary.json"
    kept = json.dumps({"step": 6, "steps": 6, "preempted": False, "eval": {"eval/loss": 2.0}})
    path.write_text(kept)
    train._repair_summary(str(tmp_path), {**DONE, "step": 6})
    assert path.read_text() == kept
