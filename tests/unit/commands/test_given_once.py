"""A value given twice on a command line: a bert_jax flag is refused (absl would keep the last
and drop the other without a word); a --config.<key> override is said in one warning line (a
later override replacing a base command's is how scripts vary one value); a sweep setting one
key in both its overrides and its grid is refused."""

import pytest
from helpers import REPO

from bert_jax import config as config_lib
from bert_jax.commands import sweep


def test_an_override_key_given_twice_is_named_with_both_values():
    assert config_lib.repeated_override(["train.steps=3", "model.num_layers=2", "train.steps=4"]) == (
        "--config.train.steps is given twice ('3', then '4'): the last replaces the first")


def test_distinct_keys_and_a_key_inside_a_value_pass():
    assert config_lib.repeated_override(["train.steps=3", "train.steps_per_loop=2",
                                         "data.train_files=a=b.txt", "init_from=train.steps=3"]) is None


def test_an_override_given_twice_warns_once_in_either_form(cli):
    code, _, err = cli(["info", "--config", "configs/bert_pretrain.py:tiny",
                        "--config.train.steps=3", "--config.train.steps", "4"])
    assert code == 0, err
    assert err.count("warning: --config.train.steps is given twice ('3', then '4')") == 1, err


def test_a_sweep_override_its_grid_also_sets_is_refused_naming_the_grid_flag():
    config = sweep.sweep_config(str(REPO / "configs/glue.py:sst2,tiny"),
                                {"optimizer.learning_rate": (1e-4,)})
    config.overrides = ("optimizer.learning_rate=3e-5",)
    with pytest.raises(ValueError) as e:
        sweep.check_sweep(config, "sw.py")
    assert str(e.value) == (
        "sweep sw.py: overrides sets optimizer.learning_rate=3e-5 but the grid sets "
        "optimizer.learning_rate too (grid.optimizer.learning_rate=(0.0001,) would replace it in "
        "every trial): give its values in the grid instead, "
        "--config.grid.optimizer.learning_rate='(3e-5,)', and drop it from overrides")


def test_a_seed_in_a_sweeps_overrides_points_to_grid_seed():
    # every sweep's grid holds the seed (sweep_config), so an override of it never takes effect
    config = sweep.sweep_config(str(REPO / "configs/glue.py:sst2,tiny"), {})
    config.overrides = ("train.steps=2", "seed=3")
    with pytest.raises(ValueError, match=r"overrides sets seed=3 .*--config\.grid\.seed='\(3,\)'"):
        sweep.check_sweep(config, "sw.py")


def test_a_key_given_twice_in_a_sweeps_overrides_is_not_blamed_on_the_grid():
    config = sweep.sweep_config(str(REPO / "configs/glue.py:sst2,tiny"), {})
    config.overrides = ("train.steps=2", "train.steps=3")
    with pytest.raises(ValueError) as e:
        sweep.check_sweep(config, "sw.py")
    assert str(e.value) == ("sweep sw.py: overrides: --config.train.steps is given twice ('2', then "
                            "'3'): the last replaces the first; keep one")


@pytest.mark.parametrize("key, hint", [
    ("seed", "set a trial's seed in the grid, --config.grid.seed='(3,)' (one trial per value)"),
    # (not in the grid: a flag cannot add it there; the overrides flag keeps the sweep's own)
    ("train.steps", "set train.steps for every trial by adding it to the sweep's overrides, "
                    "--config.overrides='(\"train.steps=3\",)'"),
])
def test_a_run_key_given_to_a_sweep_config_names_grid_or_overrides(key, hint):
    config = sweep.sweep_config(str(REPO / "configs/glue.py:sst2,tiny"), {})
    with pytest.raises(config_lib.ConfigError) as e:
        config_lib.set_value(config, key, "3")
    assert str(e.value) == (f"unknown config key {key!r}: a sweep config has only "
                            f"['base', 'grid', 'overrides']; {hint}")
