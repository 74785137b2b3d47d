"""GLUE readers on the real GLUE files, their errors on malformed rows, TFDS records and encode."""

import csv
import random
import sys
import types

import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import glue

# (task, split, rows) as in ../shared/data/README.md
REAL_FILES = [("cola", "train", 8551), ("cola", "dev", 1043), ("sst2", "train", 67349), ("sst2", "dev", 872),
              ("mrpc", "train", 3668), ("mrpc", "dev", 408), ("mrpc", "test", 1725), ("stsb", "train", 5749),
              ("stsb", "dev", 1500), ("rte", "train", 2490), ("rte", "dev", 277), ("qnli", "dev", 5463)]


@pytest.fixture(scope="module")
def tok(wordpiece_vocab):
    return tokenizer_lib.load_tokenizer(wordpiece_vocab.parent)


def _first_data_row(path, task) -> list[str]:
    """The first data row straight from the file, bytes decoded without our reader's help."""
    lines = path.read_bytes().decode("utf-8").removeprefix("\ufeff").split("\n")
    return lines[0 if task == "cola" else 1].split("\t")


@pytest.mark.parametrize("task, split, rows", REAL_FILES)
def test_read_real_files(shared_data, task, split, rows):
    path = glue.task_path(shared_data / "glue", task, split)
    spec = glue.TASKS[task]
    examples = glue.read_glue(task, path)
    assert len(examples) == rows
    first, cells = examples[0], _first_data_row(path, task)
    header = list(spec.columns) if spec.columns else next(csv.reader(
        path.open(encoding="utf-8-sig"), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert first.text_a == cells[header.index(spec.text_a)]
    assert first.text_b == (cells[header.index(spec.text_b)] if spec.text_b else None)
    assert first.guid == f"{split}-0" and examples[-1].guid == f"{split}-{rows - 1}"
    if split == "test":
        assert all(e.label is None for e in examples)
    elif spec.labels is None:
        assert first.label == float(cells[header.index(spec.label)])
        assert all(0.0 <= e.label <= 5.0 for e in examples)
    else:
        assert first.label == cells[header.index(spec.label)]
        assert {e.label for e in examples} == set(spec.labels)  # every class occurs in these files
        assert all(e.text_a and (e.text_b is None or e.text_b) for e in examples)


def test_mrpc_bom_and_quotes(shared_data):
    path = shared_data / "glue" / "MRPC" / "dev.tsv"
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")  # else the BOM case is not exercised
    examples = glue.read_glue("mrpc", path)
    # An unbalanced quote that csv's default quoting would run on into later rows.
    assert examples[0].text_b.startswith('"The foodservice') and len(examples) == 408


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("task, lines, bad_line, field, found", [
    ("rte", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\ta\tb\tmaybe"], 3,
     "label column 'label'", "'maybe'"),
    ("rte", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb", "1\ta\tb\tentailment"], 2,
     "row", "3 tab-separated columns"),
    ("cola", ["gj04\t1\t\tfine.", "gj04\t2\t\tbad label."], 2, "label column 'label'", "'2'"),
    ("sst2", ["sentence\tlabel", "ok\t1", "too\tmany\t0"], 3, "row", "3 tab-separated"),
    ("sst2", ["sentence\tlabel", "ok\t1", " \t0"], 3, "column 'sentence'", "' '"),  # no text to score
    ("rte", ["index\tsentence1\tsentence2\tlabel", "0\t \t\tentailment"], 2, "column 'sentence1'", "' '"),
    ("stsb", ["i\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore", "0\tg\tf\ty\to\tn\tn\ta\tb\t5.1"], 2,
     "score column 'score'", "'5.1'"),
    ("stsb", ["i\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore", "0\tg\tf\ty\to\tn\tn\ta\tb\tfive",
              "1\tg\tf\ty\to\tn\tn\ta\tb\t2.5"], 2, "score column 'score'", "'five'"),
    ("stsb", ["i\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore", "0\tg\tf\ty\to\tn\tn\ta\tb\tnan"], 2,
     "score column 'score'", "'nan'"),
])
def test_malformed_rows(tmp_path, capsys, task, lines, bad_line, field, found):
    path = _write(tmp_path, "train.tsv", lines)
    with pytest.raises(glue.GlueFormatError) as e:
        glue.read_glue(task, path)
    message = str(e.value)
    for part in (f"{path}:{bad_line}:", field, found, "expected", "data.skip_bad_rows=True"):
        assert part in message
    examples = glue.read_glue(task, path, skip_bad_rows=True)
    has_header = task != "cola"
    assert len(examples) == len(lines) - has_header - 1
    # guids keep their row's index in the file, so the skipped row's index is missing.
    assert f"train-{bad_line - 1 - has_header}" not in {e.guid for e in examples}
    assert all(int(e.guid.split("-")[1]) < len(lines) - has_header for e in examples)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped 1 malformed row(s)" in err and str(path) in err


def test_a_pair_with_one_empty_text_and_test_rows_without_text_are_kept(tmp_path, caplog):
    """As transformers encodes them ([CLS] a [SEP] [SEP]): QQP's published train file has two
    rows with an empty question2 (HF datasets #277), and every row of a test file is a line of
    the submission; one warning names the first."""
    path = _write(tmp_path, "train.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                                          "1\t1\t2\twhy?\t\t0", "2\t3\t4\thow?\twhat?\t1"])
    assert [(e.text_a, e.text_b) for e in glue.read_glue("qqp", path)] == [("why?", ""), ("how?", "what?")]
    assert any(f"{path}:2: an empty text (1 row(s) like it), kept" in r.getMessage()
               for r in caplog.records)
    test = _write(tmp_path, "test.tsv", ["index\tsentence", "0\tfine", "1\t "])
    assert [e.text_a for e in glue.read_glue("sst2", test)] == ["fine", " "]


def test_header_and_task_errors(tmp_path):
    path = _write(tmp_path, "dev.tsv", ["index\tquestion\tlabel", "0\tq\tentailment"])
    with pytest.raises(glue.GlueFormatError, match=r"dev.tsv:1: header lacks column\(s\) \['sentence'\]"):
        glue.read_glue("qnli", path)
    with pytest.raises(ValueError, match="unknown GLUE task 'sst5'.*cola, sst2"):
        glue.read_glue("sst5", path)
    with pytest.raises(ValueError, match="no split 'train'"):
        glue.task_path(tmp_path, "ax", "train")


def test_test_files_and_mnli_layout(tmp_path):
    cola = glue.read_glue("cola", _write(tmp_path, "test.tsv", ["index\tsentence", "0\tA test sentence."]))
    assert cola == [glue.Example("test-0", "A test sentence.", None, None)]
    parses = "sentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse"
    head = f"index\tpromptID\tpairID\tgenre\t{parses}\tsentence1\tsentence2"
    cells = "0\t1\t1e\tfiction\t(\t(\t(\t("
    dev = [head + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
           cells + "\tPremise.\tHypothesis.\tneutral\tneutral\tentailment\t\t\tneutral"]
    examples = glue.read_glue("mnli", _write(tmp_path, "dev_matched.tsv", dev))
    assert examples == [glue.Example("dev_matched-0", "Premise.", "Hypothesis.", "neutral")]
    test = [head, cells + "\tPremise.\tHypothesis."]
    assert glue.read_glue("mnli_mismatched", _write(tmp_path, "test_mismatched.tsv", test))[0].label is None
    qqp = _write(tmp_path, "q.tsv", ["id\tquestion1\tquestion2", "0\tWhy?\tHow?"])  # test: no qid columns
    assert glue.read_glue("qqp", qqp) == [glue.Example("q-0", "Why?", "How?", None)]


@pytest.mark.parametrize("task, record, text_b, label", [
    ("mnli", {"premise": b"P", "hypothesis": b"H", "label": 0, "idx": 3}, "H", "entailment"),
    ("mnli", {"premise": b"P", "hypothesis": b"H", "label": 2, "idx": 3}, "H", "contradiction"),
    ("mnli_mismatched", {"premise": b"P", "hypothesis": b"H", "label": -1, "idx": 3}, "H", None),
    ("ax", {"premise": b"P", "hypothesis": b"H", "label": np.int64(1), "idx": 0}, "H", "neutral"),
    ("cola", {"sentence": b"P", "label": 1, "idx": 0}, None, "1"),
    ("wnli", {"sentence1": b"P", "sentence2": b"H", "label": 1, "idx": 0}, "H", "1"),  # 1 = entailment
    ("rte", {"sentence1": b"P", "sentence2": b"H", "label": 1, "idx": 0}, "H", "not_entailment"),
    ("qnli", {"question": b"P", "sentence": b"H", "label": 0, "idx": 0}, "H", "entailment"),
    ("qqp", {"question1": b"P", "question2": b"H", "label": 1, "idx": 0}, "H", "1"),
    ("stsb", {"sentence1": b"P", "sentence2": "H", "label": np.float32(3.8), "idx": 0}, "H", 3.8),
    ("stsb", {"sentence1": b"P", "sentence2": b"H", "label": np.float32(-1.0), "idx": 0}, "H", None),
])
def test_tfds_record_to_example(task, record, text_b, label):
    example = glue._tfds_record_to_example(task, 7, record)
    assert example.text_a == "P" and example.text_b == text_b
    assert example.label == (pytest.approx(label) if isinstance(label, float) else label)
    spec = glue.TASKS[task]
    if isinstance(label, str):  # TFDS strings are ours: encode accepts them
        assert label in spec.labels


def test_read_glue_tfds_with_fake_source(monkeypatch):
    calls = []

    def data_source(name, split, data_dir, download):  # a list of records stands in for ArrayRecord
        calls.append((name, split, data_dir, download))
        return [{"premise": b"A cat.", "hypothesis": "An animal.", "label": 0, "idx": 0},
                {"premise": b"Dogs.", "hypothesis": b"Cats.", "label": 2, "idx": 1}]

    fake = types.SimpleNamespace(data_source=data_source)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text", fake)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.text.glue", fake)
    examples = glue.read_glue_tfds("mnli_mismatched", "dev", data_dir="/tfds")
    assert calls == [("glue/mnli", "validation_mismatched", "/tfds", False)]  # never downloads
    assert examples == [glue.Example("mnli-0", "A cat.", "An animal.", "entailment"),
                        glue.Example("mnli-1", "Dogs.", "Cats.", "contradiction")]


def test_read_glue_tfds_not_prepared(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"glue/rte.*not prepared under .*tfds build glue/rte"):
        glue.read_glue_tfds("rte", "dev", data_dir=str(tmp_path))


def test_tfds_splits_and_label_agreement():
    assert glue._tfds_split("mnli", "dev") == "validation_matched"
    assert glue._tfds_split("mnli_mismatched", "test") == "test_mismatched"
    assert glue._tfds_split("cola", "dev") == "validation"
    assert glue._tfds_split("sst2", "train[:10%]") == "train[:10%]"
    for spec in glue.TASKS.values():
        assert (spec.labels is None) == (spec.tfds_labels is None)
        if spec.labels:  # the same label set, whatever each side's order
            assert sorted(spec.labels) == sorted(spec.tfds_labels)


def _reference_truncate(a: list, b: list, max_length: int) -> tuple[list, list]:
    """The original run_classifier._truncate_seq_pair, popping one token at a time."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
    return a, b


def test_truncate_seq_pair_matches_reference():
    for la in range(9):
        for lb in range(9):
            for m in range(12):
                a, b = list(range(la)), list(range(100, 100 + lb))
                got = tokenizer_lib.truncate_seq_pair(a, b, m)
                assert got == _reference_truncate(a, b, m), (la, lb, m)


def test_encode_layout(tok):
    examples = [glue.Example("0", "the quick brown fox", "jumped over", "entailment"),
                glue.Example("1", "a", "b", None)]
    f = glue.encode(examples, tok, 40, ("entailment", "not_entailment"))
    ids_a, ids_b = tok.encode("the quick brown fox"), tok.encode("jumped over")
    row = [tok.cls_id, *ids_a, tok.sep_id, *ids_b, tok.sep_id]
    n = len(row)
    assert n < 40  # no truncation here
    assert {k: (v.shape, v.dtype) for k, v in f.items()} == {
        k: ((2, 40), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids", "label_ids")} | {
        "label_ids": ((2,), np.int32)}
    assert f["input_ids"][0, :n].tolist() == row and (f["input_ids"][0, n:] == tok.pad_id).all()
    assert f["attention_mask"][0].tolist() == [1] * n + [0] * (40 - n)
    assert f["token_type_ids"][0].tolist() == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1) + [0] * (40 - n)
    assert f["label_ids"].tolist() == [0, 0]  # None -> 0
    with pytest.raises(ValueError, match="'maybe'"):
        glue.encode([glue.Example("0", "a", "b", "maybe")], tok, 8, ("entailment", "not_entailment"))


def test_encode_truncation_real_pairs(shared_data, tok):
    examples = glue.read_glue("rte", shared_data / "glue" / "RTE" / "dev.tsv")
    f = glue.encode(examples, tok, 32, glue.TASKS["rte"].labels)
    lengths = f["attention_mask"].sum(1)
    assert (lengths <= 32).all() and (lengths == 32).any()
    seps = (f["input_ids"] == tok.sep_id).sum(1)
    assert (seps == 2).all() and (f["input_ids"][:, 0] == tok.cls_id).all()
    ids_a = tok.encode_batch([e.text_a for e in examples])
    ids_b = tok.encode_batch([e.text_b for e in examples])
    for i in range(len(examples)):
        a, b = _reference_truncate(ids_a[i].tolist(), ids_b[i].tolist(), 29)
        assert f["input_ids"][i, :lengths[i]].tolist() == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
    # RTE premises are long and hypotheses short: truncation pops from the premise only.
    short_b = [i for i in range(len(examples)) if len(ids_b[i]) <= 14 and len(ids_a[i]) + len(ids_b[i]) > 29]
    assert len(short_b) > 10
    for i in short_b:
        assert f["token_type_ids"][i].sum() == len(ids_b[i]) + 1 and lengths[i] == 32


def test_encode_single_sentences_and_regression(shared_data, tok):
    sst = glue.read_glue("sst2", shared_data / "glue" / "SST-2" / "dev.tsv")
    f = glue.encode(sst, tok, 12, glue.TASKS["sst2"].labels)
    assert (f["token_type_ids"] == 0).all() and ((f["input_ids"] == tok.sep_id).sum(1) == 1).all()
    assert f["label_ids"].tolist() == [int(e.label) for e in sst]
    i = random.Random(0).choice([i for i, e in enumerate(sst) if len(tok.encode(e.text_a)) > 10])
    assert f["input_ids"][i].tolist() == [tok.cls_id, *tok.encode(sst[i].text_a)[:10], tok.sep_id]
    sts = glue.read_glue("stsb", shared_data / "glue" / "STS-B" / "dev.tsv")[:50]
    f = glue.encode(sts, tok, 64, None)
    assert f["label_ids"].dtype == np.float32
    np.testing.assert_allclose(f["label_ids"], [e.label for e in sts], rtol=1e-6)
