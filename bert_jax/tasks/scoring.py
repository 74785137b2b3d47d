"""Classification and regression metrics for GLUE and SWAG in plain numpy (values are fractions, 0..1).

They agree with sklearn.metrics / scipy.stats (tests check). As scipy's, a correlation with a
constant input (every gold score equal, or every prediction) is undefined: nan, never a number
that would rank beside real ones; `constant_note` says why in words, and checkpoint selection
ranks nan below every number.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

# The metrics that are nan when one side is constant (pearson, spearman and their mean for
# GLUE STS-B; of the cosines for scored pairs): undefined, not a failed run.
CORRELATIONS = frozenset({"pearson", "spearman", "corr", "pearson_cosine", "spearman_cosine"})

# The metric that ranks checkpoints of each task; glue_metrics(task, ...) always contains it.
MAIN_METRIC = {
    "cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "pearson", "qqp": "f1",
    "mnli": "accuracy", "mnli_mismatched": "accuracy", "qnli": "accuracy", "rte": "accuracy",
    "wnli": "accuracy", "ax": "accuracy", "swag": "accuracy",
}


def _pair(labels: ArrayLike, preds: ArrayLike, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D arrays of the same nonzero length."""
    y, p = np.asarray(labels, dtype).ravel(), np.asarray(preds, dtype).ravel()
    if y.shape != p.shape:
        raise ValueError(f"labels and preds differ in length: {y.size} vs {p.size}")
    if y.size == 0:
        raise ValueError("no examples to score (labels and preds are empty)")
    return y, p


def accuracy(labels: ArrayLike, preds: ArrayLike) -> float:
    """Fraction of predictions equal to the label."""
    y, p = _pair(labels, preds)
    return float(np.mean(y == p))


def f1_binary(labels: ArrayLike, preds: ArrayLike) -> float:
    """F1 of the positive class 1; 0.0 when there are no true or predicted positives (as sklearn)."""
    y, p = _pair(labels, preds)
    y, p = y == 1, p == 1
    tp, fp, fn = np.sum(y & p), np.sum(~y & p), np.sum(y & ~p)
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(labels: ArrayLike, preds: ArrayLike) -> float:
    """Matthews correlation (multiclass form, as sklearn); 0.0 when undefined, e.g. one class only."""
    y, p = _pair(labels, preds)
    _, idx = np.unique(np.concatenate([y, p]), return_inverse=True)
    k, n = int(idx.max()) + 1, y.size
    cm = np.zeros((k, k), np.float64)
    np.add.at(cm, (idx[:n], idx[n:]), 1)
    t, q = cm.sum(1), cm.sum(0)  # true and predicted count of each class
    correct, s = np.trace(cm), float(n)
    cov_yp, cov_pp, cov_yy = correct * s - t @ q, s * s - q @ q, s * s - t @ t
    denom = np.sqrt(cov_pp * cov_yy)
    return float(cov_yp / denom) if denom else 0.0


def _constant(x: np.ndarray) -> bool:
    return bool(np.all(x == x[0]))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; nan if either input is constant (as scipy.stats.pearsonr)."""
    a, b = _pair(x, y, np.float64)
    if _constant(a) or _constant(b):
        return math.nan
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a @ a) * (b @ b))
    # Clip: rounding can put a perfect correlation a hair outside [-1, 1].
    return float(np.clip(a @ b / denom, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their mean rank (scipy.stats.rankdata 'average')."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]  # each run of equal values is [start, end)
    ranks = np.empty(x.size, np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation (average ranks for ties); nan if either input is constant (as
    scipy.stats.spearmanr)."""
    a, b = _pair(x, y, np.float64)
    return pearson(_average_ranks(a), _average_ranks(b))


def constant_note(where: str, gold: ArrayLike, preds: ArrayLike) -> str | None:
    """The warning line for correlations that are undefined (nan) because every gold score of
    `where` (a file) is equal, or every prediction on it; None when both sides vary."""
    y, p = _pair(gold, preds, np.float64)
    if _constant(y):
        return (f"warning: {where}: every gold score is {y[0]:g} ({y.size} pair(s)); Pearson and "
                "Spearman of constant scores are undefined: reported as nan (a model is ranked on "
                "a dev file whose scores differ, as the STS-B dev.tsv)")
    if _constant(p):
        return (f"warning: {where}: the model predicts {p[0]:g} for every one of its {p.size} "
                "pair(s); Pearson and Spearman of constant predictions are undefined: reported "
                "as nan (such a checkpoint ranks below every other)")
    return None


def glue_metrics(task: str, labels: ArrayLike, preds: ArrayLike) -> dict[str, float]:
    """The official GLUE metrics of a task (class ids, or scores for stsb); swag gives accuracy."""
    if task not in MAIN_METRIC:
        raise ValueError(f"glue_metrics: unknown task {task!r}; expected one of {', '.join(MAIN_METRIC)}")
    if task == "cola":
        return {"mcc": matthews_corrcoef(labels, preds)}
    if task == "stsb":
        r, rho = pearson(labels, preds), spearman(labels, preds)
        return {"pearson": r, "spearman": rho, "corr": (r + rho) / 2}
    if task in ("mrpc", "qqp"):
        f1, acc = f1_binary(labels, preds), accuracy(labels, preds)
        return {"f1": f1, "accuracy": acc, "acc_and_f1": (acc + f1) / 2}
    return {"accuracy": accuracy(labels, preds)}
