"""What a sweep compares when it finds a finished trial (commands/sweep.py): the run config the
trial recorded when it started against the one it would run now."""

from bert_jax.commands import sweep


def test_a_changed_value_is_named_and_a_key_one_side_lacks_is_not():
    """A key the record lacks (a default a later version added) or holds alone (one a later
    version dropped) is not a change of the trial's settings; a value both hold that differs is."""
    before = {"model": {"dropout_rate": 0.3, "old_key": 1}, "seed": 0}
    now = {"model": {"dropout_rate": 0.1, "new_key": "x"}, "seed": 0}
    assert sweep.differing_keys(before, now) == ["model.dropout_rate: 0.3 before, 0.1 now"]
    assert sweep.differing_keys(before | {"model": {"dropout_rate": 0.1}}, now) == []
