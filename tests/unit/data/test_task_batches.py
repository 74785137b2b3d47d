"""The batches of a fine-tuning task's features (data/finetune.py) drawn from several datasets:
each batch from one dataset, the mixes' shares and orders, exact resume, any host count."""

import numpy as np
import pytest

from bert_jax.data.finetune import FeaturePipeline

BLOCKS = (40, 20, 10)  # three datasets one after the other: rows 0-39, 40-59, 60-69
STARTS = (0, 40, 60)


def pipeline(mix, **kw):
    return FeaturePipeline({"x": np.arange(sum(BLOCKS))}, batch_size=8, train=True, seed=3,
                           blocks=BLOCKS, mix=mix, **kw)


def dataset_of(batch) -> int:
    [d] = {int(np.searchsorted(STARTS, x, side="right")) - 1 for x in batch["x"]}  # one only
    return d


def test_proportional_rounds_take_each_dataset_by_its_size_and_read_it_through():
    p = pipeline("proportional")
    batches = [next(p) for _ in range(24)]  # three rounds of 40//8 + 20//8 + max(1, 10//8) = 8
    sources = [dataset_of(b) for b in batches]
    for r in range(3):
        assert sorted(sources[8 * r:8 * r + 8]) == [0] * 5 + [1] * 2 + [2]
    assert sources[:8] != sources[8:16] or sources[8:16] != sources[16:]  # orders drawn per round
    # Dataset 0's first five batches are one epoch of it: every row once.
    rows = np.concatenate([b["x"] for b, s in zip(batches, sources) if s == 0][:5])
    assert sorted(rows) == list(range(40))
    # The smallest: 10 rows, a batch of 8 a round; epochs follow each other without a gap.
    rows = np.concatenate([b["x"] for b, s in zip(batches, sources) if s == 2])
    assert sorted(rows[:10]) == list(range(60, 70)) and sorted(rows[10:20]) == list(range(60, 70))


def test_round_robin_takes_the_datasets_in_turn():
    p = pipeline("round_robin")
    assert [dataset_of(next(p)) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("mix", ["proportional", "round_robin"])
def test_a_resumed_stream_and_every_host_count_give_the_same_batches(mix):
    p = pipeline(mix)
    whole = [next(p)["x"] for _ in range(20)]
    resumed = pipeline(mix)
    resumed.set_state({"produced": 9})
    assert all((next(resumed)["x"] == b).all() for b in whole[9:])
    hosts = [pipeline(mix, process_index=i, process_count=2) for i in range(2)]
    for b in whole:
        assert (np.concatenate([next(h)["x"] for h in hosts]) == b).all()


def test_one_dataset_keeps_the_stream_it_always_had():
    """blocks of one dataset (or evaluation) change nothing: the same batches as without."""
    plain = FeaturePipeline({"x": np.arange(70)}, batch_size=8, train=True, seed=3)
    one = FeaturePipeline({"x": np.arange(70)}, batch_size=8, train=True, seed=3, blocks=(70,))
    assert all((next(plain)["x"] == next(one)["x"]).all() for _ in range(12))


def test_datasets_that_do_not_add_up_or_an_unknown_mix_are_refused():
    with pytest.raises(ValueError, match=r"datasets of \[40, 20\] examples, but the features hold 70"):
        FeaturePipeline({"x": np.arange(70)}, batch_size=8, train=True, seed=0, blocks=(40, 20))
    with pytest.raises(ValueError, match="mix='shuffled'; choose one of"):
        pipeline("shuffled")
