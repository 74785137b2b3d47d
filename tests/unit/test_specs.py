"""Every numeric key of a run's sections declares its valid values (specs.valid), and reading a
section refuses a value outside them before anything compiles, naming the key, the range and
the default."""

import dataclasses
import re
import typing

import pytest

from bert_jax import specs, tasks
from bert_jax.data import sources

# In one order in every process (pytest-xdist's workers must collect the same tests).
RECORDS = list(dict.fromkeys([
    specs.TrainSpec, specs.OptimizerSpec, specs.ScheduleSpec, specs.MeshSpec, specs.PretrainingData,
    specs.TranslationData, specs.TaskData, *(cls.Data for cls in tasks.TASKS.values()),
    *(s.keys for s in sources.SOURCES.values())]))


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__qualname__)
def test_every_numeric_key_declares_its_valid_values(record):
    kinds = typing.get_type_hints(record)
    missing = [f.name for f in dataclasses.fields(record)
               if kinds[f.name] in (int, float) and "valid" not in f.metadata]
    assert not missing, f"{record.__qualname__}: declare the valid values of {missing} (specs.valid)"
    for f in dataclasses.fields(record):  # each default is itself valid
        if "valid" in f.metadata:
            specs.read(record, {f.name: f.default}, "x")


@pytest.mark.parametrize("record, key, value, said", [
    (specs.OptimizerSpec, "b2", 1.5, "optimizer.b2=1.5 must be in [0, 1)"),
    (specs.OptimizerSpec, "learning_rate", 0.0, "optimizer.learning_rate=0.0 must be > 0"),
    (specs.OptimizerSpec, "weight_decay", -0.1, "must be >= 0; the default is 0.01"),
    (specs.TrainSpec, "eval_steps", -1, "train.eval_steps=-1 must be >= 0"),
    (specs.PretrainingData, "max_predictions_per_seq", 0, "data.max_predictions_per_seq=0 must be >= 1"),
    (specs.PretrainingData, "masked_lm_prob", 1.5, "data.masked_lm_prob=1.5 must be in (0, 1]"),
    (specs.ScheduleSpec, "final_fraction", 1.5, "schedule.final_fraction=1.5 must be in [0, 1]"),
])
def test_a_value_outside_its_range_is_refused(record, key, value, said):
    where = {specs.OptimizerSpec: "optimizer", specs.TrainSpec: "train",
             specs.ScheduleSpec: "schedule"}.get(record, "data")
    with pytest.raises(specs.ConfigError, match=re.escape(said)):
        specs.read(record, {key: value}, where)


@pytest.mark.parametrize("value", ["OFF", "Off", " none", "false", "0", "disabled"])
def test_a_switch_word_for_the_shard_cache_is_refused_not_made_a_folder(value):
    from bert_jax.data import documents

    with pytest.raises(specs.ConfigError, match=re.escape(f"$BERT_JAX_SHARD_CACHE={value.strip()!r} "
                                                          "reads as a switch, not a folder: write off")):
        documents.shard_cache({"BERT_JAX_SHARD_CACHE": value})


def test_the_shard_cache_takes_off_a_folder_or_nothing(tmp_path):
    from bert_jax.data import documents

    assert documents.shard_cache({"BERT_JAX_SHARD_CACHE": "off"}) is None
    assert documents.shard_cache({"BERT_JAX_SHARD_CACHE": f"{tmp_path}/OFF"}) == f"{tmp_path}/OFF"
    assert documents.shard_cache({"BERT_JAX_SHARD_CACHE": "", "XDG_CACHE_HOME": str(tmp_path)}) == \
        f"{tmp_path}/bert_jax/shards"


@pytest.mark.parametrize("given, says", [
    (((1, 128, 20),), r"data.phases\[0\] starts at step 1: the first phase must start at step 0"),
    (((0, 128, 20), (5, 256, 40), (2, 64, 10)),
     r"data.phases\[2\] starts at step 2, before data.phases\[1\] \(step 5\)"),
    (((0, 128, 20), (0, 64, 10)), r"data.phases\[1\] starts at step 0, the same step as "
                                  r"data.phases\[0\] \(step 0\).*never run"),
])
def test_phases_out_of_order_are_refused_naming_the_phase(given, says):
    """A phase listed out of order or at another's start step would never run (the phase of a
    step is the last that started): refused, as is a first phase after step 0."""
    from bert_jax import config as config_lib

    with pytest.raises(specs.ConfigError, match=says):
        config_lib.phases(type("Data", (), {"phases": given})())
    ordered = config_lib.phases(type("Data", (), {"phases": ((0, 128, 20), (5, 64, 10))})())
    assert [p.start_step for p in ordered] == [0, 5]


def test_a_phase_starting_at_or_after_train_steps_is_said_as_never_running(monkeypatch):
    """data.phases[i] at or after train.steps never runs in this run: one warning naming each;
    a phase before the end, or train.steps 0 (set from train.epochs later), says nothing."""
    from bert_jax import config as config_lib

    warned = []
    monkeypatch.setattr(config_lib.log, "warning", warned.append)
    phases = config_lib.phases(type("Data", (), {"phases": ((0, 128, 20), (3, 64, 10), (10, 256, 40))})())

    def say(steps: int) -> None:
        config_lib.say_phases_after_the_end(type("Spec", (), {
            "train": type("Train", (), {"steps": steps})(), "phases": phases,
            "schedule": type("Schedule", (), {"stages": ()})()})())
    say(11)
    say(0)
    assert warned == []
    say(3)
    assert warned == ["warning: data.phases[1] (step 3), data.phases[2] (step 10): starts at or after "
                      "train.steps=3, never reached in this run; drop it, or raise train.steps past it"]


def test_a_stage_starting_at_or_after_train_steps_is_said_as_a_phase_is(monkeypatch):
    """schedule.stages[i] at or after train.steps never runs in this run: the same warning as a
    length phase's, naming it."""
    from bert_jax import config as config_lib

    warned = []
    monkeypatch.setattr(config_lib.log, "warning", warned.append)
    config = config_lib.load("configs/bert_pretrain.py:tiny", [
        "train.steps=4", "schedule.warmup_steps=10",
        "schedule.stages=({'start_step': 0}, {'start_step': 2}, {'start_step': 100})"])
    config_lib.say_phases_after_the_end(config_lib.resolve(config))
    assert warned == ["warning: schedule.stages[2] (step 100): starts at or after train.steps=4, "
                      "never reached in this run; drop it, or raise train.steps past it"]
