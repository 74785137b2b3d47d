"""Every whole number of a run config fits in 64 bits (numpy's, JAX's and XLA's shapes'
integers): one rule for every count field of every section (config.check_int_sizes, run by
config.resolve); token counts beyond 32 bits pass."""

import pytest
from helpers import REPO

from bert_jax import config as config_lib


@pytest.mark.parametrize("override, key", [
    ("model.vocab_size=9223372036854775808", "model.vocab_size=9223372036854775808"),
    ("train.batch_size=99999999999999999999", "train.batch_size=99999999999999999999"),
    ("mesh.data=-9223372036854775808", "mesh.data=-9223372036854775808"),
    ("data.phases=((0, 128, 20), (10, 18446744073709551616, 20))",
     "data.phases[1][1]=18446744073709551616"),
])
def test_a_whole_number_beyond_64_bits_is_refused_naming_its_key(override, key):
    config = config_lib.load(str(REPO / "configs/bert_pretrain.py:tiny"), [override])
    with pytest.raises(config_lib.ConfigError, match=rf"^{key.replace('[', '.').replace(']', '.')} "
                                                      "is beyond what a run can count"):
        config_lib.resolve(config)


def test_the_largest_64_bit_number_passes_this_rule():
    config_lib.check_int_sizes({"model": {"vocab_size": 2**63 - 1}, "data": {"phases": ((0, 2**63 - 1),)},
                                "mesh": {"data": -(2**63 - 1)}, "train": {"shuffle": True}})


def test_a_token_count_beyond_32_bits_passes():
    config_lib.resolve(config_lib.load(str(REPO / "configs/modernbert.py:base")))
