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
