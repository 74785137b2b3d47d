"""Every reader of text files decides the same way what is text (bert_jax/data/text.py): vocab,
prepare and training read a corpus with one reader; the translation and task readers give
the same error for a file that is not UTF-8 text."""

import gzip
import logging

import pytest

from bert_jax.data import documents, pretraining, rows, text
from bert_jax.tasks import glue

BOOK = b"".join(b"Line %d of the book. It goes on.\n" % i for i in range(300))


def test_a_few_stray_bytes_are_replaced_with_one_warning_in_every_corpus_reader(tmp_path, caplog):
    """One line in 300 with a Latin-1 byte (as two lines of a Gutenberg book beside the repo):
    vocab's lines and the pretraining documents both read it, with U+FFFD, and one warning."""
    path = tmp_path / "book.txt.gz"
    path.write_bytes(gzip.compress(BOOK.replace(b"Line 7 of", b"Line 7 caf\xe9 of")))
    with caplog.at_level(logging.WARNING):
        lines = list(text.utf8_lines(str(path)))
    assert len(lines) == 300 and lines[7] == "Line 7 caf\ufffd of the book. It goes on.\n"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"warning: {path}: 1 of 300 lines hold bytes that are not UTF-8, replaced by "
                        "U+FFFD; the first: 8: not UTF-8: found byte 0xe9 at column 11, expected "
                        "UTF-8 text; re-save the file as UTF-8 (from Latin-1 or Windows-1252: "
                        "`iconv -f cp1252 -t utf-8`)"]
    docs = list(pretraining.iter_documents(path, "sentences"))
    assert sum(len(d) for d in docs) == 300 and "caf\ufffd" in docs[0][7]


@pytest.mark.parametrize("content, says", [
    (BOOK.replace(b"of the", b"of th\xe9"), "book.txt:1: not UTF-8: found byte 0xe9 at column 13"),
    (BOOK.decode().encode("utf-16"), "book.txt:1: UTF-16 text"),
    (BOOK.decode().encode("utf-16-be"), "book.txt:1: UTF-16 text"),
    (BOOK.decode().encode("utf-32"), "book.txt:1: UTF-32 text.*iconv -f utf-32"),
    (BOOK.decode().encode("utf-32-be"), "book.txt:1: UTF-32 text"),
    (BOOK[:100] + b"\x00\x01\x02binary", "book.txt:4: a NUL byte: a binary file, not text"),
])
def test_what_is_not_text_is_refused_by_every_reader(tmp_path, content, says):
    path = tmp_path / "book.txt"
    path.write_bytes(content)
    readers = {"vocab": lambda: list(text.utf8_lines(str(path))),
               "pretraining": lambda: list(pretraining.iter_documents(path, "sentences")),
               "translation": lambda: documents.read_lines(path)}
    for name, read in readers.items():
        with pytest.raises(ValueError, match=rf"{tmp_path}/{says}") as e:
            read()
        assert "\n" not in str(e.value), name
    tsv = tmp_path / "train.tsv"
    tsv.write_bytes(b"sentence\tlabel\n" + content.replace(b"\n", b"\t1\n"))
    with pytest.raises(ValueError, match="train.tsv:"):
        glue.read_glue("sst2", str(tsv))
    for encoding in ("UTF-16", "UTF-32"):
        assert encoding in str(rows.not_utf8(path)) or encoding not in says


@pytest.mark.parametrize("line, encoding, says", [
    ("Ceci est un café très élégant, où l'on mange des crêpes.", "cp1252",
     "(from Latin-1 or Windows-1252: `iconv -f cp1252 -t utf-8`)"),
    ("Größe und Maß: schön", "latin1", "(from Latin-1 or Windows-1252"),
    ("これは日本語のテキストです。", "shift_jis", "(it decodes as shift_jis"),
    ("这是中文文本。北京是一个大城市。", "gbk", "gbk"),
    ("한국어 텍스트입니다.", "euc_kr", "euc_kr"),
    ("Это русский текст. Москва большой город.", "cp1251", "8-bit encoding of another alphabet: Cyrillic"),
    ("Αυτό είναι ελληνικό κείμενο", "cp1253", "8-bit encoding of another alphabet"),
])
def test_text_of_another_encoding_is_named_by_what_its_bytes_look_like(tmp_path, line, encoding, says):
    path = tmp_path / "book.txt"
    path.write_bytes(b"the cat sat.\n" * 6 + (line + "\n").encode(encoding) * 200)
    with pytest.raises(ValueError) as e:
        list(text.utf8_lines(str(path)))
    assert str(e.value).startswith(f"{path}:7: not UTF-8") and says in str(e.value), str(e.value)
    if "East Asian" in str(e.value) or "alphabet" in str(e.value):
        assert "cp1252" not in str(e.value)


def test_every_task_file_reader_reads_a_gz_as_its_plain_text(tmp_path):
    """rows.open_text: a gzipped pair, STS, SQuAD or GLUE file reads as its plain text (the
    binary check reads the decompressed bytes); a damaged one, or one holding binary, is named."""
    from bert_jax.tasks import pairs, retrieval

    stsb = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
            + "".join(f"{i}\tmain\tf\t2012\t{i}\ts\ts\tthe cat {i}\tthe dog\t{i}.5\n" for i in range(3)))
    squad = ('{"data": [{"title": "t", "paragraphs": [{"context": "The cat sat.", "qas": [{"id": "q1", '
             '"question": "Who sat?", "answers": [{"text": "cat", "answer_start": 4}]}]}]}]}')
    readers = {
        "p.jsonl": ('{"query": "the cat", "positive": "a dog", "negatives": ["a hat"]}\n',
                    lambda p: [(e.query, e.positive, e.negatives) for e in pairs.read_pairs(p)]),
        "sts.tsv": (stsb, retrieval.read_sts),
        "sq.json": (squad, retrieval.squad_retrieval),
        "sst2.tsv": ("sentence\tlabel\nthe cat\t1\n",
                     lambda p: [(e.text_a, e.label) for e in glue.read_glue("sst2", p)]),
    }
    for name, (content, read) in readers.items():
        plain = tmp_path / name
        plain.write_text(content, encoding="utf-8")
        packed = tmp_path / f"{name}.gz"
        packed.write_bytes(gzip.compress(content.encode()))
        assert read(packed) == read(plain), name
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b'{"query": "the cat", "positive": "a dog"}\n' * 50)[:40])
    with pytest.raises(ValueError, match=rf"{cut}: not a readable gzip file"):
        pairs.read_pairs(cut)
    binary = tmp_path / "bin.tsv.gz"
    binary.write_bytes(gzip.compress(b"query\tpositive\nthe\x00cat\tdog\n"))
    with pytest.raises(ValueError, match=rf"{binary}:2: a NUL byte"):
        pairs.read_pairs(binary)
