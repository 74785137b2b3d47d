"""An empty (or blank) source line translates to an empty line, not decoded (the model would
make up a sentence from nothing), so the output keeps the input's line count (sacreBLEU pairs
lines); translate says once how many there were."""

import logging

from bert_jax.translation import translate


def test_empty_sentences_are_empty_translations_in_place():
    translator = object.__new__(translate.Translator)  # no model: only which sentences it decodes
    decoded = []

    def decode(params, sentences, *, progress_every):
        decoded.append(sentences)
        return [f"<{s}>" for s in sentences]
    translator._translate = decode
    assert translator(None, ["a", "", "  ", "b"]) == ["<a>", "", "", "<b>"]
    assert decoded == [["a", "b"]]
    assert translator(None, ["", " "]) == ["", ""] and len(decoded) == 1  # nothing to decode


def test_the_input_says_once_how_many_lines_are_empty(tmp_path, caplog):
    src = tmp_path / "src.txt"
    src.write_text("A man rides a horse.\n\nTwo dogs play.\n \n")
    with caplog.at_level(logging.WARNING):
        assert translate._read_input(str(src)) == ["A man rides a horse.", "", "Two dogs play.", " "]
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: --input={src}: 2 of its 4 lines are empty (the first: line 2); each gets an empty "
        "output line, so the lines still match the input's (and a reference's)"]
