"""Refused before anything runs. Every path flag is checked as one before its command runs:
empty, a URL scheme bert-jax does not read, or a Cloud Storage URL miswritten is one line
naming the flag (and the fix), exit 2, and nothing is made in the current folder (a `GS:` or
`gs:` folder there, as before); a command that would write nothing fails rather than
succeeding at nothing."""

import pytest
from helpers import REPO

TRAIN = ["train", "--config", "configs/bert_pretrain.py:tiny", "--config.data.name=synthetic"]


@pytest.mark.parametrize("argv, said", [
    ([*TRAIN, "--workdir", "GS://bucket/run"], "--workdir=GS://bucket/run: a Cloud Storage URL is "
     "written gs://bucket/path (lower case, two slashes): gs://bucket/run"),
    ([*TRAIN, "--workdir", "gs:/bucket/run"], "gs://bucket/run"),
    ([*TRAIN, "--workdir", "s3://bucket/run"], "--workdir=s3://bucket/run: s3:// is not a storage"),
    ([*TRAIN, "--workdir", "/tmp/x", "--compilation_cache="], "--compilation_cache is empty"),
    ([*TRAIN, "--workdir", "/tmp/x", "--compilation_cache=gs:/oops"], "gs://oops"),
    (["features", "--checkpoint", "http://example.com/ckpt", "--input", "a.txt", "--output",
      "b.jsonl"], "--checkpoint=http://example.com/ckpt: http:// is not"),
    (["vocab", "--input", "a.txt", "--out", " "], "--out is empty"),
])
def test_a_bad_path_flag_is_one_line_and_makes_nothing(cli, argv, said):
    before = {p.name for p in REPO.iterdir()}
    code, _, err = cli(argv)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert {p.name for p in REPO.iterdir()} == before  # no GS:, gs: or empty-named folder


def test_the_paths_users_give_still_pass():
    from bert_jax import paths

    for value in ("runs/x", "/tmp/x", "gs://bucket/run", "./a:b", "~/cache", "C-1/x"):
        paths.check_given(value, "--workdir")


def test_prepare_of_an_empty_corpus_fails_and_leaves_no_folder(cli, tmp_path, wordpiece_vocab):
    """`prepare` that would write no training shard exits non-zero (it printed 0 documents and a
    `train with` glob matching nothing), and the --out folder it made is gone again; so does one
    that would write no validation shard (one document), whose glob it printed too."""
    for text, says in (("\n\n", ("no training documents in", "c.txt")),
                       ("the cat sat.\n", ("data.heldout_every=", "none held out for validation"))):
        (tmp_path / "c.txt").write_text(text, "utf-8")
        code, out, err = cli(["prepare", "--config", "configs/bert_pretrain.py:tiny",
                              f"--config.data.train_files={tmp_path / 'c.txt'}",
                              f"--config.data.tokenizer={wordpiece_vocab.parent}", "--out",
                              str(tmp_path / "shards")])
        assert code == 1 and all(s in err for s in says), err
        assert not (tmp_path / "shards").exists() and "validation-*" not in out
    (tmp_path / "made").mkdir()  # an empty folder the user made is emptied of the shards, kept
    code, _, err = cli(["prepare", "--config", "configs/bert_pretrain.py:tiny",
                        f"--config.data.train_files={tmp_path / 'c.txt'}",
                        f"--config.data.tokenizer={wordpiece_vocab.parent}", "--out", str(tmp_path / "made")])
    assert code == 1 and (tmp_path / "made").is_dir() and not any((tmp_path / "made").iterdir()), err


def test_a_sweep_grid_that_repeats_a_value_is_refused(cli, tmp_path):
    """Two equal values made two trials of one name in one folder (the second resumed the first)."""
    (tmp_path / "sw.py").write_text(
        "from bert_jax.commands.sweep import sweep_config\n\n\ndef get_config(arg=None):\n"
        "    return sweep_config('configs/glue.py:mrpc,tiny', "
        "{'optimizer.learning_rate': (1e-3, 0.001), 'seed': (0, 1)})\n", "utf-8")
    code, _, err = cli(["sweep", "--config", str(tmp_path / "sw.py"), "--workdir", str(tmp_path / "s")])
    assert code == 1 and "grid.optimizer.learning_rate=(0.001, 0.001) repeats a value" in err, err
    assert not (tmp_path / "s").exists()
