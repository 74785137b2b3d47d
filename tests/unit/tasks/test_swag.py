"""SWAG readers (real JSON lines rows, swagaf CSV layout), their errors, and [N, 4, T] features."""

import csv
import json

import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.tokenizer import truncate_seq_pair
from bert_jax.tasks import swag

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]


@pytest.fixture(scope="module")
def tok(wordpiece_vocab):
    return tokenizer_lib.load_tokenizer(wordpiece_vocab.parent)


@pytest.fixture(scope="module")
def sample(shared_data):
    return shared_data / "fixtures" / "swag_sample.jsonl"


def _write_csv(path, rows, header=HEADER):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def _csv_row(i, sent1, sent2, endings, label):
    return [i, f"lsmdc-{i}", 17 + i, f"{sent1} {sent2}", sent1, sent2, "gold", *endings, label]


def test_read_jsonl_fixture(sample):
    examples = swag.read_swag(sample)
    raw = [json.loads(line) for line in sample.read_text("utf-8").splitlines()]
    assert len(examples) == len(raw) == 10
    assert [e.label for e in examples] == [r["label"] for r in raw] == [0, 3, 1, 3, 0, 3, 0, 1, 3, 3]
    first = examples[0]
    assert (first.context, first.start) == (raw[0]["sent1"], raw[0]["sent2"]) == (
        "Members of the procession walk down the street holding small horn brass instruments.", "A drum line")
    assert first.endings == tuple(raw[0][f"ending{i}"] for i in range(4))
    assert first.guid == "swag_sample-0"


def test_read_swagaf_csv(tmp_path):
    endings = ("walks in.", 'sits, "quietly".', "runs\naway.", "x")  # csv quoting at work
    rows = [_csv_row(0, "He opens the door.", "He", endings, 2),
            _csv_row(1, "A woman, smiling.", "She", ["a", "b", "c", "d"], 0)]
    examples = swag.read_swag(_write_csv(tmp_path / "val.csv", rows))
    assert examples == [
        swag.Example("val-0", "He opens the door.", "He", endings, 2),
        swag.Example("val-1", "A woman, smiling.", "She", ("a", "b", "c", "d"), 0)]
    test = _write_csv(tmp_path / "test.csv", [r[:-1] for r in rows], HEADER[:-1])  # no label column
    assert [e.label for e in swag.read_swag(test)] == [None, None]


@pytest.mark.parametrize("rows, line, field, found", [
    ([_csv_row(0, "a", "b", "wxyz", 1), _csv_row(1, "a", "b", "wxyz", 4)], 3, "label", "'4'"),
    # sent1 and startphrase hold a quoted newline each: record 1 is lines 2-4, the bad one starts on 5.
    ([_csv_row(0, "a\nb", "b", "wxyz", 1), _csv_row(1, "a", "b", "wxyz", 1)[:-2]], 5, "row", "10 columns"),
])
def test_csv_errors(tmp_path, capsys, rows, line, field, found):
    path = _write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(swag.SwagFormatError) as e:
        swag.read_swag(path)
    for part in (f"{path}:{line}:", field, found, "expected", "data.skip_bad_rows=True"):
        assert part in str(e.value)
    assert len(swag.read_swag(path, skip_bad_rows=True)) == 1
    assert "read_swag: skipped 1 malformed row(s)" in capsys.readouterr().err


def test_jsonl_errors(tmp_path, sample):
    lines = sample.read_text("utf-8").splitlines()[:3]
    bad_label = json.dumps(json.loads(lines[1]) | {"label": 7})
    no_ending = json.dumps({k: v for k, v in json.loads(lines[2]).items() if k != "ending2"})
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([lines[0], bad_label, "", no_ending, "{not json"]) + "\n", "utf-8")
    with pytest.raises(swag.SwagFormatError, match=r"bad.jsonl:2: label: found 7"):
        swag.read_swag(path)
    assert len(swag.read_swag(path, skip_bad_rows=True)) == 1
    path.write_text("\n".join([lines[0], no_ending]), "utf-8")
    with pytest.raises(swag.SwagFormatError, match=r"bad.jsonl:2: field 'ending2': found None"):
        swag.read_swag(path)
    with pytest.raises(swag.SwagFormatError, match="header lacks column"):
        swag.read_swag(_write_csv(tmp_path / "x.csv", [], ["a", "b"]))


def test_encode(sample, tok):
    examples = swag.read_swag(sample)
    t = 24
    f = swag.encode(examples, tok, t)
    assert {k: v.shape for k, v in f.items()} == {"input_ids": (10, 4, t), "attention_mask": (10, 4, t),
                                                   "token_type_ids": (10, 4, t), "label_ids": (10,)}
    assert f["label_ids"].tolist() == [e.label for e in examples]
    assert (f["input_ids"][..., 0] == tok.cls_id).all()
    assert ((f["input_ids"] == tok.sep_id).sum(-1) == 2).all() and (f["attention_mask"].sum(-1) <= t).all()
    for i in (0, 5):
        context = tok.encode(examples[i].context).tolist()
        for j, ending in enumerate(examples[i].endings):
            choice = tok.encode(f"{examples[i].start} {ending}").tolist()
            a, b = truncate_seq_pair(context, choice, t - 3)
            row = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
            assert f["input_ids"][i, j, :len(row)].tolist() == row
            assert f["token_type_ids"][i, j].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (
                t - len(row))
    unlabeled = swag.Example("u", "ctx", "st", ("a", "b", "c", "d"), None)
    assert swag.encode([unlabeled], tok, 16)["label_ids"].tolist() == [0]
    assert np.array_equal(swag.encode(examples[:1], tok, t)["input_ids"], f["input_ids"][:1])
