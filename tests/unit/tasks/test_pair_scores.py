"""A pair file's score (bert_jax/tasks/pairs.py): in JSON lines a JSON number, in TSV the text
of one; anything else names the file, the line and the field."""

import json
import re

import pytest

from bert_jax.tasks import pairs


def _jsonl(tmp_path, scores):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"sentence1": f"the cat {i}", "sentence2": "a dog", "score": s})
                            + "\n" for i, s in enumerate(scores)))
    return path


@pytest.mark.parametrize("score,found", [(True, "'true'"), (False, "'false'"), ("3.5", "'3.5'"),
                                         ([1], "[1]"), (None, None)])
def test_a_json_score_must_be_a_json_number(tmp_path, score, found):
    path = _jsonl(tmp_path, [1.0, 2, score])
    if found is None:  # null: no score, so the file mixes scored and unscored rows
        with pytest.raises(pairs.PairsFormatError, match="some rows have a score and some not"):
            pairs.read_pairs(path)
        return
    with pytest.raises(pairs.PairsFormatError, match=rf"p.jsonl:3: field 'score': found {re.escape(found)}, "
                                                     r"expected a finite number \(a JSON number"):
        pairs.read_pairs(path)


def test_numbers_read_as_scores_in_both_formats(tmp_path):
    assert [e.score for e in pairs.read_pairs(_jsonl(tmp_path, [1, 2.5, 0]))] == [1.0, 2.5, 0.0]
    tsv = tmp_path / "p.tsv"
    tsv.write_text("sentence1\tsentence2\tscore\nthe cat\ta dog\t3.5\nthe mat\ta hat\t1\n")
    assert [e.score for e in pairs.read_pairs(tsv)] == [3.5, 1.0]
    tsv.write_text("sentence1\tsentence2\tscore\nthe cat\ta dog\tinf\n")
    with pytest.raises(pairs.PairsFormatError, match=r"p.tsv:2: field 'score': found 'inf', expected "
                                                     r"a finite number\. Fix"):
        pairs.read_pairs(tsv)
