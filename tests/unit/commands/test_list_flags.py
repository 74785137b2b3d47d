"""A comma-separated list flag (features --layers, plot --workdir): its items parsed one by one,
an empty item or one named twice refused naming the flag (it would be read twice, or dropped)."""

import pytest
from absl import app

from bert_jax import paths
from bert_jax.commands.options import list_items


def test_items_are_parsed_in_order():
    assert list_items("--layers", ["-1,-2, 0"], int) == [-1, -2, 0]
    assert list_items("--workdir", ["a,b", "c"]) == ["a", "b", "c"]


@pytest.mark.parametrize("values, said", [
    (["-1,-1"], "--layers='-1,-1': -1 is named twice; list each item once"),
    (["-1,,-2"], "--layers='-1,,-2': an empty item"),
    (["-1,"], "--layers='-1,': an empty item"),
    ([" "], "--layers is empty"),
])
def test_an_empty_or_repeated_item_is_refused(values, said):
    with pytest.raises(app.UsageError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        list_items("--layers", values, int)


def test_items_naming_one_thing_are_one_item():
    with pytest.raises(app.UsageError, match=r"^--workdir='runs/x,runs/x/': runs/x is named twice "
                                             r"\(again as runs/x/\)"):
        list_items("--workdir", ["runs/x,runs/x/"], same=paths.listed_as)
