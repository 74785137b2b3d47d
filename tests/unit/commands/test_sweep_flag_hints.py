"""A sweep config refuses a run key given as a flag (or a grid key it lacks) with the flag that
sets it: that flag, given instead, is accepted and keeps what the sweep already had."""

import shlex

import pytest

from bert_jax import config as config_lib
from bert_jax.commands import sweep as sweep_cmd

SWEEP = "configs/sweeps/glue.py:mrpc,tiny"
OVERRIDES = "overrides=(\"data.data_dir=/d\", \"init_from=/c\")"


def offered(message: str) -> str:
    start = message.rindex("--config.")
    flag = shlex.split(message[start:])[0]
    return flag.removeprefix("--config.").split(" (one trial")[0]


@pytest.mark.parametrize("given, expected", [
    # a run key the grid lacks: added to the overrides the sweep already has
    ("train.steps=3", ("data.data_dir=/d", "init_from=/c", "train.steps=3")),
    ("train.objective=cosent", ("data.data_dir=/d", "init_from=/c", "train.objective=cosent")),
    # a typo of a grid key, or a new axis: one value for every trial
    ("grid.train.batch_size=(16,)", ("data.data_dir=/d", "init_from=/c", "train.batch_size=16")),
])
def test_the_overrides_offered_keep_the_sweeps_own_and_are_accepted(given, expected):
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.load(SWEEP, [OVERRIDES, given])
    flag = offered(str(refused.value))
    assert flag.startswith("overrides=")
    sweep = config_lib.load(SWEEP, [OVERRIDES, flag])  # accepted
    assert tuple(sweep.overrides) == expected
    assert sweep_cmd.check_sweep(sweep, SWEEP)  # and each trial loads with it


@pytest.mark.parametrize("given, values", [
    ("optimizer.learning_rate=1e-3", (1e-3,)),
    ("seed=3", (3,)),
])
def test_the_grid_flag_offered_for_a_grid_key_is_accepted(given, values):
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.load(SWEEP, [given])
    flag = offered(str(refused.value))
    assert flag.startswith("grid.")
    sweep = config_lib.load(SWEEP, [flag])
    assert tuple(sweep.grid[given.partition("=")[0]]) == values


def test_a_grid_typo_names_the_wrong_part():
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.load(SWEEP, ["grid.optimizer.learnin_rate=(1e-3,)"])
    assert ("config.grid has no 'optimizer.learnin_rate' ('learnin_rate' is not a part of any grid "
            "key under 'optimizer'") in str(refused.value)


def test_a_string_value_in_the_grid_flag_is_quoted():
    assert config_lib.grid_flag("train.objective", "cosent") == \
        "--config.grid.train.objective='(\"cosent\",)'"
    assert config_lib.grid_flag("train.epochs", "3.0") == "--config.grid.train.epochs='(3.0,)'"
