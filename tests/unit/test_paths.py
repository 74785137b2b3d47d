"""paths.json_field: a JSON file's values read by key and type, nested keys named by their whole
dotted path (every file read by key shares it: embed.json, sentence-transformers modules,
speedrun records)."""

import pytest

from bert_jax import paths

SETTINGS = {"sentence": {"pooling": "mean", "sizes": {"max": 8}}, "flag": True}


@pytest.mark.parametrize("key, kind, said", [
    ("sentence.normalize", bool, "no key 'sentence.normalize' (true or false)"),
    ("sentence.pooling", int, "key 'sentence.pooling' is \"mean\", expected an integer"),
    ("sentence.sizes.max", str, "key 'sentence.sizes.max' is 8, expected a string"),
    ("sentence.sizes.min", int, "no key 'sentence.sizes.min' (an integer)"),
    ("flag.on", bool, "key 'flag' is true, expected an object"),
    ("other.pooling", str, "no key 'other' (an object)"),
])
def test_a_nested_key_is_named_by_its_dotted_path(key, kind, said):
    with pytest.raises(ValueError) as refused:
        paths.json_field(SETTINGS, key, kind, "s.json", "fix it")
    assert str(refused.value) == f"s.json: {said}; fix it"


def test_a_nested_key_is_read_and_its_default_given_when_absent():
    assert paths.json_field(SETTINGS, "sentence.pooling", str, "s.json", "") == "mean"
    assert paths.json_field(SETTINGS, "sentence.sizes.max", int, "s.json", "", at_least=8) == 8
    assert paths.json_field(SETTINGS, "sentence.sizes.min", int, "s.json", "", default=None) is None
    assert paths.json_field(SETTINGS, "other.pooling", str, "s.json", "", default="cls") == "cls"
    with pytest.raises(ValueError, match=r"key 'sentence.sizes.max' is 8, expected an integer >= 9"):
        paths.json_field(SETTINGS, "sentence.sizes.max", int, "s.json", "", at_least=9)


def test_a_json_file_with_a_byte_order_mark_reads_as_without(tmp_path):
    """As Windows editors save UTF-8 (an HF config.json, sentence-transformers' module files)."""
    (tmp_path / "config.json").write_bytes(b'\xef\xbb\xbf{"hidden_size": 32}')
    assert paths.read_json(tmp_path / "config.json", "expected a config") == {"hidden_size": 32}


def test_a_file_listed_twice_is_refused_naming_it(tmp_path):
    """Two names of one file (the same name twice, or `./a` beside `a`) would read it twice."""
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    paths.check_listed_once([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], "")
    with pytest.raises(ValueError, match=r"^data.train_files='x': \S*/a.txt is named twice \(again "
                                         r"as \S*/\./a.txt\): it would be read twice"):
        paths.check_listed_once([str(tmp_path / "a.txt"), f"{tmp_path}/./a.txt"],
                                "data.train_files='x': ")


def test_a_new_output_folder_may_be_missing_empty_or_hold_only_its_leftovers(tmp_path):
    paths.check_new_folder(tmp_path / "missing", "--out")
    (tmp_path / "empty").mkdir()
    paths.check_new_folder(tmp_path / "empty", "--out")
    (tmp_path / "interrupted" / "checkpoints").mkdir(parents=True)
    paths.check_new_folder(tmp_path / "interrupted", "--out", leftovers=("checkpoints",))


def test_a_folder_of_other_files_is_no_new_output_folder(tmp_path):
    for name in ("vocab.txt", "a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("keep me")
    with pytest.raises(FileExistsError, match=rf"^--out={tmp_path}: not empty \(holds a.txt, "
                                              r"b.txt, c.txt and 1 more\); choose a new output"):
        paths.check_new_folder(tmp_path, "--out", leftovers=("checkpoints",))
    assert (tmp_path / "vocab.txt").read_text() == "keep me"


def test_a_new_output_file_and_the_files_beside_it_are_never_existing_ones(tmp_path):
    paths.check_new_file(tmp_path / "a.png", "--out", "plot", [tmp_path / "a.csv"])
    (tmp_path / "a.csv").write_text("a run's data")
    with pytest.raises(FileExistsError, match=f"--out={tmp_path}/a.png: {tmp_path}/a.csv already "
                                              "exists; plot never overwrites a file"):
        paths.check_new_file(tmp_path / "a.png", "--out", "plot", [tmp_path / "a.csv"])
    with pytest.raises(FileExistsError, match=f"--out={tmp_path}/a.csv: already exists"):
        paths.check_new_file(tmp_path / "a.csv", "--out", "plot")


def test_a_file_beside_an_output_may_exist_holding_exactly_what_would_be_written(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"step,loss\n1,2.0\n")
    beside = str(tmp_path / "a.csv")
    paths.check_new_file(tmp_path / "a.svg", "--out", "plot", [beside], {beside: b"step,loss\n1,2.0\n"})
    with pytest.raises(FileExistsError, match=f"^--out={tmp_path}/a.svg: {beside} already exists and "
                                              "holds other data than plot would write there"):
        paths.check_new_file(tmp_path / "a.svg", "--out", "plot", [beside], {beside: b"step,loss\n"})
    (tmp_path / "a.svg").write_text("a figure")  # the output itself: never, whatever it holds
    with pytest.raises(FileExistsError, match=f"^--out={tmp_path}/a.svg: already exists; plot"):
        paths.check_new_file(tmp_path / "a.svg", "--out", "plot", [beside], {beside: b"step,loss\n1,2.0\n"})


@pytest.mark.parametrize("value", ["gs://", "gs:///run", "gs:///"])
def test_a_cloud_storage_url_without_a_bucket_is_refused(value):
    with pytest.raises(ValueError) as refused:
        paths.check_given(value, "--workdir")
    assert str(refused.value) == f"--workdir={value}: no bucket; give gs://BUCKET/path"
    paths.check_given("gs://b/run", "--workdir")  # a bucket: accepted
