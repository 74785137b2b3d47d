"""init_from a checkpoint fine-tuned on another task (state.say_other_task_head): its head is
taken, with one warning naming the task it was trained for."""

import numpy as np

from bert_jax.training import checkpoint, state


def _said(monkeypatch, tmp_path, data: dict, found: dict) -> list[str]:
    tmp_path = tmp_path / data["task"] / str(len(found))
    checkpoint.save_params(tmp_path, 0, {"classifier": {"bias": np.zeros(2, np.float32)}},
                           {"model": {"name": "bert_classification"},
                            "data": {"name": "glue", "task": "sst2"}})
    warned = []
    monkeypatch.setattr(state.log, "warning", warned.append)
    state.say_other_task_head(str(tmp_path), data, "bert_classification", found)
    return warned


def test_another_tasks_head_taken_is_said_once(monkeypatch, tmp_path):
    found = {"bert": {"pooler": {"kernel": 0}}, "classifier": {"bias": 0, "kernel": 0}}
    assert _said(monkeypatch, tmp_path, {"name": "glue", "task": "mrpc"}, found) == [
        f"warning: init_from {tmp_path}/mrpc/2 was fine-tuned on glue sst2: its task head (classifier/bias, "
        "classifier/kernel) is taken as this run's starting point for glue mrpc"]


def test_the_same_task_or_no_head_taken_is_not_said(monkeypatch, tmp_path):
    found = {"bert": {"pooler": {"kernel": 0}}, "classifier": {"bias": 0}}
    assert _said(monkeypatch, tmp_path, {"name": "glue", "task": "sst2"}, found) == []
    assert _said(monkeypatch, tmp_path, {"name": "glue", "task": "mrpc"}, {"bert": {"x": 0}}) == []
