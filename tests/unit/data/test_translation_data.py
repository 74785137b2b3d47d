"""Parallel text: line-aligned files, TSV and TFDS readers, packing into token-budget rows,
length filtering, deterministic and resumable order, disjoint host shares."""

import gzip

import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data import translation

EN = ["A man rides a bike.", "Two dogs play in the snow.", "A girl reads a book.",
      "People walk on a busy street.", "A child jumps into the lake.", "An old woman sells fruit."]
DE = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Mädchen liest ein Buch.",
      "Menschen gehen auf einer belebten Straße.", "Ein Kind springt in den See.",
      "Eine alte Frau verkauft Obst."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("spm")
    lines = (EN + DE) * 20 + [" ".join(EN + DE), " ".join(map(str, range(100)))]
    tokenizer_lib.train_vocab(lines, size=120, kind="sentencepiece", out_dir=out, lowercase=False,
                              sp_model_type="bpe")
    return tokenizer_lib.load_tokenizer(out)


def _write(path, lines, gz=False):
    text = "".join(x + "\n" for x in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, "utf-8")


def test_line_aligned_files_plain_and_gz_either_direction(tmp_path):
    _write(tmp_path / "train.en.gz", EN, gz=True)
    _write(tmp_path / "train.de.gz", DE, gz=True)
    src, tgt = translation.read_files(str(tmp_path / "train.{lang}.gz"), "en", "de")
    assert (src, tgt) == (EN, DE)
    src, tgt = translation.read_files(str(tmp_path / "train.{lang}.gz"), "de", "en")
    assert (src, tgt) == (DE, EN)


def test_misaligned_files_name_both_and_their_line_counts(tmp_path):
    _write(tmp_path / "x.en", EN)
    _write(tmp_path / "x.de", DE[:-1])
    with pytest.raises(ValueError, match=r"x\.en has 6 lines but .*x\.de has 5"):
        translation.read_files(str(tmp_path / "x.{lang}"), "en", "de")
    with pytest.raises(FileNotFoundError, match=r"x\.fr"):
        translation.read_files(str(tmp_path / "x.{lang}"), "en", "fr")


def test_tsv_columns_by_language_and_bad_line_named(tmp_path):
    _write(tmp_path / "pairs.tsv", [f"{d}\t{e}" for e, d in zip(EN, DE)])
    src, tgt = translation.read_files(str(tmp_path / "pairs.tsv"), "en", "de", "de,en")
    assert (src, tgt) == (EN, DE)
    with pytest.raises(ValueError, match="tsv_langs"):
        translation.read_files(str(tmp_path / "pairs.tsv"), "en", "fr", "de,en")
    _write(tmp_path / "bad.tsv", [f"{d}\t{e}" for e, d in zip(EN, DE)] + ["no tab here"])
    with pytest.raises(ValueError, match=r"bad\.tsv line 7 has 1 tab-separated column"):
        translation.read_files(str(tmp_path / "bad.tsv"), "en", "de", "de,en")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ValueError, match=r"\{lang\}"):
        translation.read_files(str(tmp_path / "plain.txt"), "en", "de")


def test_tfds_records_are_read_by_language(monkeypatch):
    import tensorflow_datasets as tfds

    records = [{"en": e.encode(), "de": d.encode()} for e, d in zip(EN, DE)]
    seen = {}

    def data_source(name, split, data_dir=None, download=True):
        seen.update(name=name, split=split, download=download)
        return records
    monkeypatch.setattr(tfds, "data_source", data_source)
    pairs = translation.TfdsPairs("wmt14_translate/de-en", "validation", "de", "en")
    assert len(pairs) == 6 and pairs[2] == (DE[2], EN[2])
    assert seen == {"name": "wmt14_translate/de-en", "split": "validation", "download": False}


def _segments(batch, key):
    """The packed sequences of every row of `batch[key]`, in order."""
    out = []
    for ids, seg, pos in zip(batch[key], batch[f"{key}_segment_ids"], batch[f"{key}_positions"]):
        for s in range(1, seg.max() + 1):
            where = seg == s
            np.testing.assert_array_equal(pos[where], np.arange(where.sum()))
            out.append(ids[where])
    return out


def _pairs(n=60):
    return translation.FilePairs([EN[i % 6] + f" {i}" for i in range(n)],
                                 [DE[i % 6] + f" {i}" for i in range(n)])


def test_packed_rows_hold_every_pair_once_with_eos_and_positions(tokenizer):
    pairs = _pairs()
    ds = translation.packed_dataset(pairs, tokenizer, max_len=32, rows=4, seed=0, train=False)
    batches = list(ds.batch(4))
    src = [x for b in batches for x in _segments(b, "inputs")]
    tgt = [x for b in batches for x in _segments(b, "targets")]
    assert len(src) == len(tgt) == 60
    assert all(x[-1] == tokenizer.sep_id for x in src + tgt)
    got = sorted((tokenizer.decode(s[:-1]), tokenizer.decode(t[:-1])) for s, t in zip(src, tgt))
    assert got == sorted(zip(pairs.src, pairs.tgt))  # each pair intact, sides kept together
    fill = np.mean([(b["targets_segment_ids"] > 0).mean() for b in batches])
    assert fill > 0.6, fill  # packed, not one pair per row


def test_length_filter_drops_pairs_longer_than_a_row(tokenizer):
    long = " ".join(EN) * 3
    pairs = translation.FilePairs(EN + [long], DE + ["kurz"])
    ds = translation.packed_dataset(pairs, tokenizer, max_len=24, rows=2, seed=0, train=False)
    src = [tokenizer.decode(x[:-1]) for b in ds.batch(2) for x in _segments(b, "inputs")]
    assert sorted(src) == sorted(EN)
    assert translation.dropped_by_length(pairs, tokenizer, 24) == pytest.approx(1 / 7)


def test_training_order_is_deterministic_and_resumes_from_its_state(tokenizer):
    def stream(seed):
        return iter(translation.packed_dataset(_pairs(), tokenizer, max_len=32, rows=4,
                                               seed=seed, train=True).batch(4))
    a, b = stream(0), stream(0)
    first = [next(a) for _ in range(5)]
    for x in first:
        y = next(b)
        assert all(np.array_equal(x[k], y[k]) for k in x)
    state = a.get_state()
    expected = [next(a) for _ in range(8)]  # past the first epoch
    c = stream(0)
    c.set_state(state)
    for x in expected:
        y = next(c)
        assert all(np.array_equal(x[k], y[k]) for k in x)
    other = next(stream(1))
    assert not np.array_equal(other["inputs"], first[0]["inputs"])


def test_hosts_read_disjoint_shares_that_cover_the_split(tokenizer):
    shares = []
    for index in range(3):
        ds = translation.packed_dataset(_pairs(), tokenizer, max_len=32, rows=2, seed=0,
                                        train=False, process_index=index, process_count=3)
        shares.append({tokenizer.decode(x[:-1]) for b in ds.batch(2) for x in _segments(b, "inputs")})
    assert sum(len(s) for s in shares) == 60
    assert set.union(*shares) == set(_pairs().src)


def test_multi30k_files_read_as_29000_pairs(shared_data):
    d = shared_data / "mt" / "multi30k"
    src, tgt = translation.read_files(str(d / "train.{lang}.gz"), "en", "de")
    assert len(src) == len(tgt) == 29000
    assert src[0].startswith("Two young") and tgt[0].startswith("Zwei junge")
