"""data.eval_files naming a file data.train_files names too is one warning line naming it (eval
metrics of training text; not refused: a user may mean it); files the train lists do not name,
and no eval_files, say nothing."""

import logging

from bert_jax.data import documents, sources


def test_an_eval_file_also_trained_on_is_named_once(tmp_path, caplog):
    for name in ("a.txt", "b.txt", "ev.txt"):
        (tmp_path / name).write_text("the cat sat.\n")
    with caplog.at_level(logging.WARNING):
        documents.warn_evaluated_in_training(f"{tmp_path}/*.txt", f"{tmp_path}/ev.txt,{tmp_path}/../"
                                             f"{tmp_path.name}/a.txt")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"warning: data.eval_files names {tmp_path}/ev.txt, which "
                               "data.train_files names too (and 1 more): its eval metrics are "
                               "measured on training text"), lines


def test_held_out_files_or_none_say_nothing(tmp_path, caplog):
    for name in ("a.txt", "ev.txt"):
        (tmp_path / name).write_text("the cat sat.\n")
    with caplog.at_level(logging.WARNING):
        documents.warn_evaluated_in_training(f"{tmp_path}/a.txt", f"{tmp_path}/ev.txt")
        documents.warn_evaluated_in_training(f"{tmp_path}/a.txt", "")
    assert caplog.records == []


def test_train_checks_it_for_text_and_array_record(tmp_path, caplog):
    (tmp_path / "a.txt").write_text("the cat sat.\n")
    for name in ("text", "array_record"):
        keys = sources.get(name).keys(name=name, tokenizer="v", train_files=f"{tmp_path}/a.txt",
                                      eval_files=f"{tmp_path}/a.txt")
        with caplog.at_level(logging.WARNING):
            sources.get(name).check(keys)
    assert [f"data.eval_files names {tmp_path}/a.txt, which" in r.getMessage()
            for r in caplog.records] == [True, True]
