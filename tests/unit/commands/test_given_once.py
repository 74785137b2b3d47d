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


def test_a_sweep_override_its_grid_also_sets_is_refused_before_any_trial():
    config = sweep.sweep_config(str(REPO / "configs/glue.py:sst2,tiny"),
                                {"optimizer.learning_rate": (1e-4,)})
    config.overrides = ("optimizer.learning_rate=3e-5",)
    with pytest.raises(ValueError, match="--config.optimizer.learning_rate is given twice.*not both"):
        sweep.check_sweep(config)
