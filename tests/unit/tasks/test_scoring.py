"""Task metrics against sklearn.metrics and scipy.stats, on random and hand-picked predictions."""

import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics

from bert_jax.tasks import scoring


def _random_pairs(num_classes: int):
    rng = np.random.default_rng(num_classes)
    for n in (1, 2, 7, 100, 1000):
        y = rng.integers(0, num_classes, n)
        # Mostly right predictions, so the correlations are not all near zero.
        yield y, np.where(rng.random(n) < 0.7, y, rng.integers(0, num_classes, n))


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_classification_metrics_match_sklearn(num_classes):
    for y, p in _random_pairs(num_classes):
        assert scoring.accuracy(y, p) == pytest.approx(metrics.accuracy_score(y, p))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns where a metric is ill-defined
            assert scoring.matthews_corrcoef(y, p) == pytest.approx(metrics.matthews_corrcoef(y, p))
            if num_classes == 2:
                assert scoring.f1_binary(y, p) == pytest.approx(metrics.f1_score(y, p, zero_division=0))


@pytest.mark.parametrize("y, p, mcc, f1", [
    ([1, 1, 1, 1], [1, 1, 1, 1], 0.0, 1.0),  # one class only: MCC undefined -> 0
    ([0, 1, 0, 1], [0, 0, 0, 0], 0.0, 0.0),  # no predicted positives
    ([0, 0, 0, 0], [0, 0, 0, 0], 0.0, 0.0),  # no positives at all
    ([0, 1, 0, 1], [1, 0, 1, 0], -1.0, 0.0),
    ([0, 1, 1, 0], [0, 1, 1, 0], 1.0, 1.0),
])
def test_edge_cases_match_sklearn(y, p, mcc, f1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert metrics.matthews_corrcoef(y, p) == pytest.approx(mcc)
        assert metrics.f1_score(y, p, zero_division=0) == pytest.approx(f1)
    assert scoring.matthews_corrcoef(y, p) == pytest.approx(mcc)
    assert scoring.f1_binary(y, p) == pytest.approx(f1)


def test_multiclass_mcc_fixed():
    y, p = [0, 1, 2, 2, 1, 0, 2], [0, 2, 2, 1, 1, 0, 0]
    assert scoring.matthews_corrcoef(y, p) == pytest.approx(metrics.matthews_corrcoef(y, p))
    assert scoring.matthews_corrcoef(np.array(["a", "b", "a"]), np.array(["a", "b", "b"])) == pytest.approx(
        metrics.matthews_corrcoef(["a", "b", "a"], ["a", "b", "b"]))


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    for n in (2, 3, 50, 1500):
        x = rng.normal(size=n)
        y = x + rng.normal(size=n)
        assert scoring.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
        assert scoring.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
        # STS-B-like: scores on a 0..5 grid, so many ties on both sides.
        a, b = np.round(rng.uniform(0, 5, n) * 5) / 5, np.round(rng.uniform(0, 5, n))
        assert scoring.spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0])
        assert scoring.pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0])


def test_spearman_ties_fixed():
    x, y = [1, 2, 2, 3, 3, 3, 4], [2, 1, 3, 3, 5, 5, 4]
    assert scoring.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    np.testing.assert_allclose(scoring._average_ranks(np.array([3.0, 1, 3, 2, 3])),
                               stats.rankdata([3.0, 1, 3, 2, 3]))


def test_perfect_correlations_are_clipped_to_one():
    x = np.arange(10.0)
    assert scoring.pearson(x, 3 * x + 1) == 1.0  # clipped, never 1.0000000000000002
    assert scoring.spearman(x, -x ** 3) == -1.0

def test_a_constant_side_is_undefined_as_in_scipy():
    # Every gold score equal (a one-row dev file too), or every prediction: scipy returns nan
    # (with a warning), and so do we (0.0 would rank beside real correlations), saying why.
    x = np.arange(10.0)
    for a, b in ((x, np.ones(10)), (np.full(10, 3.0), x), (np.ones(10), np.ones(10)), ([2.0], [4.0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if len(a) > 1:  # (scipy refuses fewer than two)
                assert np.isnan(stats.pearsonr(a, b)[0]) and np.isnan(stats.spearmanr(a, b)[0])
        assert np.isnan(scoring.pearson(a, b)) and np.isnan(scoring.spearman(b, a))
        metrics_ = scoring.glue_metrics("stsb", a, b)
        assert set(metrics_) == {"pearson", "spearman", "corr"} and all(map(np.isnan, metrics_.values()))
        assert set(metrics_) <= scoring.CORRELATIONS
    assert scoring.constant_note("d/dev.tsv", np.full(3, 2.5), x[:3]) == (
        "warning: d/dev.tsv: every gold score is 2.5 (3 pair(s)); Pearson and Spearman of constant "
        "scores are undefined: reported as nan (a model is ranked on a dev file whose scores "
        "differ, as the STS-B dev.tsv)")
    assert scoring.constant_note("d/dev.tsv", x[:4], np.full(4, 1.25)).startswith(
        "warning: d/dev.tsv: the model predicts 1.25 for every one of its 4 pair(s); Pearson and "
        "Spearman of constant predictions are undefined: reported as nan")
    assert scoring.constant_note("d/dev.tsv", x, -x) is None
    assert scoring.constant_note("d/dev.tsv", x, np.full(10, np.nan)) is None  # not finite: not constant


def test_bad_inputs():
    with pytest.raises(ValueError, match="differ in length: 3 vs 2"):
        scoring.accuracy([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="no examples"):
        scoring.pearson([], [])


def test_glue_metrics():
    y, p = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    acc, f1 = metrics.accuracy_score(y, p), metrics.f1_score(y, p)
    for task in ("mrpc", "qqp"):
        got = scoring.glue_metrics(task, y, p)
        assert got == pytest.approx({"f1": f1, "accuracy": acc, "acc_and_f1": (acc + f1) / 2})
    assert scoring.glue_metrics("cola", y, p) == pytest.approx({"mcc": metrics.matthews_corrcoef(y, p)})
    for task in ("sst2", "mnli", "mnli_mismatched", "qnli", "rte", "wnli", "ax", "swag"):
        assert scoring.glue_metrics(task, y, p) == pytest.approx({"accuracy": acc})
    s, t = np.array([0.0, 1.2, 3.4, 5.0, 2.2]), np.array([0.5, 1.0, 4.0, 4.5, 1.0])
    r, rho = stats.pearsonr(s, t)[0], stats.spearmanr(s, t)[0]
    assert scoring.glue_metrics("stsb", s, t) == pytest.approx(
        {"pearson": r, "spearman": rho, "corr": (r + rho) / 2})
    for task, name in scoring.MAIN_METRIC.items():
        values = scoring.glue_metrics(task, s if task == "stsb" else y, t if task == "stsb" else p)
        assert name in values and all(0.0 <= v <= 1.0 for v in values.values())
    with pytest.raises(ValueError, match="unknown task 'squad'.*cola"):
        scoring.glue_metrics("squad", y, p)
