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


@pytest.mark.parametrize("name, files, other, kind", [
    ("v.npy", (".npy",), "folder", "file"),
    ("shards", (".npy",), "folder", "folder"),
    ("run-1.5", (), "folder", "folder"),  # a dot in a folder's name is no file extension
    ("f.PNG", (".png", ".svg"), "", "file"),  # a figure's format, in any case
    ("newstest.de", (".txt",), "file", "file"),  # a text file of any other name
])
def test_an_output_is_a_file_or_a_folder_by_its_name(tmp_path, name, files, other, kind):
    assert paths.output_kind(tmp_path / name, "--output", "cmd", files, other) == kind


@pytest.mark.parametrize("name, files, other, said", [
    ("v.npz", (".npy",), "folder", "ends in .npz, which is not what cmd writes there; give a .npy "
                                   "file or a folder (a name without a file extension)"),
    ("v.NPY", (".npy",), "folder", "ends like a .npy file but not in lowercase"),
    ("out.json", (".jsonl",), "file", "ends in .json, which is not what cmd writes there; give a "
                                      ".jsonl file"),
    ("out.jsonl.gz", (".jsonl",), "file", "ends in .gz"),
    ("a", (".png",), "", "has no file extension, which is not what cmd writes there; give a .png file"),
    ("vocab.txt", (), "folder", "ends in .txt, which is not what cmd writes there; give a folder"),
])
def test_an_output_named_like_another_kind_of_file_is_refused(tmp_path, name, files, other, said):
    with pytest.raises(ValueError, match=f"^--output={tmp_path / name}: " + said.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        paths.output_kind(tmp_path / name, "--output", "cmd", files, other)
    assert not (tmp_path / name).exists()


def test_an_existing_folder_named_like_a_file_is_a_folder(tmp_path):
    (tmp_path / "old.npz").mkdir()  # written before names were checked: resumed, not refused
    assert paths.output_kind(tmp_path / "old.npz", "--output", "embed", (".npy",), "folder") == "folder"


def _made(root, *names: str):
    for name in names:  # a name ending in / is a folder
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            (root / name).mkdir()
        else:
            (root / name).write_text("x")
    return root


@pytest.mark.parametrize("files, at, kind, instead", [
    (["run/checkpoints/4/"], "run/checkpoints/4", "step", "run"),
    (["run/checkpoints/4/"], "run", "run", ""),
    (["sw/lr1/trial_config.json", "sw/lr2/trial_config.json", "sw/results.csv"], "sw", "sweep", "sw/lr1"),
    (["st/modules.json", "st/model.safetensors"], "st", "sentence-transformers", ""),
    (["hf/config.json", "hf/model.safetensors"], "hf", "hf", ""),
    (["beir/corpus.jsonl", "beir/qrels/test.tsv"], "beir", "beir", ""),
    (["beir/corpus.jsonl", "beir/qrels/test.tsv"], "beir/qrels/test.tsv", "qrels", "beir"),
    (["voc/vocab.txt"], "voc", "tokenizer", ""),
    (["voc/vocab.txt"], "voc/vocab.txt", "tokenizer-file", "voc"),
    (["d/notes.txt"], "d", "folder", ""),
    (["d/notes.txt"], "d/notes.txt", "file", ""),
])
def test_a_path_is_described_by_the_files_that_make_its_kind(tmp_path, files, at, kind, instead):
    _made(tmp_path, *files)
    found = paths.path_kind(tmp_path / at)
    assert (found.kind, found.instead) == (kind, str(tmp_path / instead) if instead else "")


def test_nothing_there_has_no_kind(tmp_path):
    assert paths.path_kind(tmp_path / "nope") is None
    assert paths.wrong_kind(tmp_path / "nope", "--checkpoint", ("run",), "a checkpoint") is None


def test_a_path_of_another_kind_is_named_with_the_way_to_the_kind_wanted(tmp_path):
    _made(tmp_path, "run/checkpoints/4/", "sw/lr1/trial_config.json", "st/modules.json")
    run, step = tmp_path / "run", tmp_path / "run/checkpoints/4"
    assert paths.wrong_kind(run, "--checkpoint", ("run", "folder"), "a checkpoint") is None
    assert paths.wrong_kind(step, "--checkpoint", ("run",), "a checkpoint", step_flag=True) == (
        f"--checkpoint={step} is the folder of step 4 of a run, not a checkpoint; give its run "
        f"folder {run} with --step 4")
    assert paths.wrong_kind(step, "--checkpoint", ("run",), "a checkpoint").endswith(
        f"give its run folder {run} (which reads its latest step)")
    assert paths.wrong_kind(tmp_path / "sw", "--workdir", ("run",), "a run's folder") == (
        f"--workdir={tmp_path / 'sw'} is a sweep's folder (1 trial), not a run's folder; give one "
        f"of its trials' folders, e.g. {tmp_path / 'sw/lr1'}")
    assert paths.wrong_kind(tmp_path / "st", "", ("run",), "a checkpoint") == (
        f"{tmp_path / 'st'} is a sentence-transformers folder, not a checkpoint; convert it first: "
        f"bert-jax convert st:{tmp_path / 'st'} <dir>, then give <dir>")
@pytest.mark.parametrize("value", ["gs://", "gs:///run", "gs:///"])
def test_a_cloud_storage_url_without_a_bucket_is_refused(value):
    with pytest.raises(ValueError) as refused:
        paths.check_given(value, "--workdir")
    assert str(refused.value) == f"--workdir={value}: no bucket; give gs://BUCKET/path"
    paths.check_given("gs://b/run", "--workdir")  # a bucket: accepted
