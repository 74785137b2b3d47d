"""BLEU: sacreBLEU's standard score and the paper's tokenized, compound-split score, each
checked against sacrebleu computed independently here on hand-written German sentences."""

import gzip
import time

import pytest
import sacrebleu
from helpers import REPO

from bert_jax.translation import bleu

HYPS = ["Die Test-Ergebnisse wurden am Montag veröffentlicht.",
        "Der Bundeskanzler sprach mit den Journalisten in Berlin.",
        "Es gab keine Hinweise auf einen Anschlag, sagte die Polizei.",
        "Die E-Mail-Adresse ist nicht mehr gültig."]
REFS = ["Die Test-Resultate wurden am Montag veröffentlicht.",
        "Die Bundeskanzlerin sprach mit Journalisten in Berlin.",
        "Es gab keine Hinweise auf einen Anschlag, sagte ein Polizeisprecher.",
        "Die E-Mail-Adresse ist nicht länger gültig."]
# The same, tokenized and compound-split by hand, as get_ende_bleu.sh would leave them.
HYPS_SPLIT = ["Die Test ##AT##-##AT## Ergebnisse wurden am Montag veröffentlicht .",
              "Der Bundeskanzler sprach mit den Journalisten in Berlin .",
              "Es gab keine Hinweise auf einen Anschlag , sagte die Polizei .",
              "Die E ##AT##-##AT## Mail ##AT##-##AT## Adresse ist nicht mehr gültig ."]
REFS_SPLIT = ["Die Test ##AT##-##AT## Resultate wurden am Montag veröffentlicht .",
              "Die Bundeskanzlerin sprach mit Journalisten in Berlin .",
              "Es gab keine Hinweise auf einen Anschlag , sagte ein Polizeisprecher .",
              "Die E ##AT##-##AT## Mail ##AT##-##AT## Adresse ist nicht länger gültig ."]


def test_corpus_bleu_is_sacrebleu():
    got = bleu.corpus_bleu(HYPS, REFS)
    want = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert got["bleu"] == pytest.approx(want.score, abs=1e-9)
    assert got["brevity_penalty"] == pytest.approx(want.bp)
    assert got["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.")
    assert 0 < got["bleu"] < 100


def test_perfect_hypothesis_scores_100():
    assert bleu.corpus_bleu(REFS, REFS)["bleu"] == pytest.approx(100)
    assert bleu.tokenized_bleu(REFS, REFS)["bleu"] == pytest.approx(100)


def test_tokenized_bleu_splits_compounds_like_get_ende_bleu():
    got = bleu.tokenized_bleu(HYPS, REFS)
    want = sacrebleu.corpus_bleu(HYPS_SPLIT, [REFS_SPLIT], tokenize="none", smooth_method="none")
    assert got["bleu"] == pytest.approx(want.score, abs=1e-9)
    # Without the split, Test-Ergebnisse and Test-Resultate share no token: a lower score.
    unsplit = [s.replace(" ##AT##-##AT## ", "-") for s in (*HYPS_SPLIT, *REFS_SPLIT)]
    no_split = sacrebleu.corpus_bleu(unsplit[:4], [unsplit[4:]], tokenize="none", smooth_method="none")
    assert no_split.score < got["bleu"] - 1
    assert "tokenized" in got["label"] and "not to sacreBLEU" in got["label"]
    assert "tok:none" in got["signature"]


def test_compound_split_is_non_overlapping_as_in_perl():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' leaves "y-z" joined after "x-y" matched.
    assert bleu.split_compounds("x-y-z E-Mail-Adresse") == (
        "x ##AT##-##AT## y-z E ##AT##-##AT## Mail ##AT##-##AT## Adresse")


def test_length_mismatch_says_how_many_lines():
    with pytest.raises(ValueError, match="3 hypothesis lines but 4 reference lines"):
        bleu.corpus_bleu(HYPS[:3], REFS)
    with pytest.raises(ValueError, match="4 hypothesis lines but 2 reference lines"):
        bleu.tokenized_bleu(HYPS, REFS[:2])
    with pytest.raises(ValueError, match="empty"):
        bleu.corpus_bleu([], [])


def test_read_lines_plain_and_gz(tmp_path):
    text = "".join(f"{line}\n" for line in HYPS)
    (tmp_path / "hyp.de").write_text(text, encoding="utf-8")
    (tmp_path / "hyp.de.gz").write_bytes(gzip.compress(text.replace("\n", "\r\n").encode("utf-8")))
    assert bleu.read_lines(tmp_path / "hyp.de") == HYPS
    assert bleu.read_lines(str(tmp_path / "hyp.de.gz")) == HYPS
    with pytest.raises(FileNotFoundError, match="missing.de"):
        bleu.read_lines(tmp_path / "missing.de")
    (tmp_path / "bad.gz").write_text("not gzip")
    with pytest.raises(ValueError, match="bad.gz: not a readable gzip file"):
        bleu.read_lines(tmp_path / "bad.gz")
    # A gzip header before a damaged deflate stream (zlib's own error, not gzip's).
    damaged = bytearray(gzip.compress(text.encode("utf-8") * 20))
    damaged[12:40] = b"\xff" * 28
    (tmp_path / "damaged.gz").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="damaged.gz: not a readable gzip file"):
        bleu.read_lines(tmp_path / "damaged.gz")


def test_newstest2014_against_itself():
    path = REPO.parent / "shared" / "data" / "mt" / "wmt" / "newstest2014.de"
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared WMT test sets)")
    start = time.perf_counter()
    lines = bleu.read_lines(path)
    score = bleu.corpus_bleu(lines, lines)
    assert len(lines) == 3003 and score["bleu"] == pytest.approx(100)
    assert time.perf_counter() - start < 5
