"""`bert-jax export`: a checkpoint written as a Hugging Face folder that transformers loads
with no missing or unexpected weights and that gives the same outputs (round trips from
PyTorch models, a fine-tuned training workdir, and the refusals)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import REPO

from bert_jax import models
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import convert, export
from bert_jax.training import checkpoint, state

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-5)
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "##s", "##ed", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def hf_config(**kw):
    return transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=40,
                                   max_position_embeddings=24, **kw)


def batch(choices: int = 0) -> dict[str, np.ndarray]:
    """Padded id rows ([B, T], or [B, C, T] for multiple choice)."""
    rng = np.random.default_rng(0)
    shape = (2, choices, 10) if choices else (3, 10)
    ids = rng.integers(5, len(VOCAB), shape)
    mask = np.ones(shape, np.int64)
    mask[..., 7:] = 0
    mask[0, ..., 4:] = 0
    types = np.zeros(shape, np.int64)
    types[..., 3:7] = 1
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types * mask}


def run_hf(model, inputs):
    with torch.no_grad():
        return model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()})


def export_and_load(src_dir, tmp_path, hf_class):
    out = tmp_path / "exported"
    report = export.export_hf(src_dir, out)
    loaded, info = hf_class.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    return loaded, report


# (HF class, its main outputs, config kwargs, choices)
ROUND_TRIPS = {
    "bert": ("BertModel", ["last_hidden_state", "pooler_output"], {}, 0),
    "pretraining": ("BertForPreTraining", ["prediction_logits", "seq_relationship_logits"], {}, 0),
    "classification": ("BertForSequenceClassification", ["logits"], {"num_labels": 3}, 0),
    "regression": ("BertForSequenceClassification", ["logits"], {"num_labels": 1}, 0),
    "tagging": ("BertForTokenClassification", ["logits"], {"num_labels": 5}, 0),
    "span": ("BertForQuestionAnswering", ["start_logits", "end_logits"], {}, 0),
    "choice": ("BertForMultipleChoice", ["logits"], {}, 3),
}


@pytest.mark.parametrize("kind", list(ROUND_TRIPS))
def test_round_trip_from_pytorch(tmp_path, kind):
    """PyTorch model -> convert -> export -> from_pretrained: same tensors, same outputs."""
    class_name, outputs, kw, choices = ROUND_TRIPS[kind]
    hf_class = getattr(transformers, class_name)
    torch.manual_seed(0)
    original = hf_class(hf_config(**kw))
    original.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    convert.convert_hf(tmp_path / "hf", tmp_path / "ours")
    loaded, report = export_and_load(tmp_path / "ours", tmp_path, hf_class)
    assert report["architecture"] == class_name and report["tokenizer"]
    theirs, ours = original.state_dict(), loaded.state_dict()
    for name, tensor in theirs.items():
        assert torch.equal(tensor, ours[name]), name
    inputs = batch(choices)
    want, got = run_hf(original, inputs), run_hf(loaded, inputs)
    for name in outputs:
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), **TOL)
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    if kind == "regression":
        assert config["problem_type"] == "regression"
    assert loaded.config.num_labels == original.config.num_labels


def test_auto_classes_and_tokenizer_load_the_export(tmp_path):
    torch.manual_seed(1)
    transformers.BertForSequenceClassification(hf_config(num_labels=2)).save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    convert.convert_hf(tmp_path / "hf", tmp_path / "ours")
    export.export_hf(tmp_path / "ours", tmp_path / "out")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "BertForSequenceClassification"
    assert type(transformers.AutoModel.from_pretrained(tmp_path / "out")).__name__ == "BertModel"
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok("the cats sat", "a dog")["input_ids"] == [2, 5, 7, 15, 9, 3, 6, 8, 3]


# The tokenizer settings of a published uncased BERT (sentence-transformers/all-MiniLM-L6-v2's
# tokenizer_config.json; bert-base-uncased's states fewer and has the same defaults).
PUBLISHED = dict(do_lower_case=True, model_max_length=512, clean_up_tokenization_spaces=True)


def published_folder(vocab_file, out):
    """The tokenizer files a published BERT checkpoint has for this vocab, as transformers saves
    them: vocab.txt and tokenizer_config.json of the slow tokenizer, tokenizer.json of the fast."""
    transformers.BertTokenizerLegacy(str(vocab_file), **PUBLISHED).save_pretrained(out)
    # 5.x's BertTokenizer is the fast one; save_pretrained writes its tokenizer.json.
    transformers.BertTokenizer.from_pretrained(out, **PUBLISHED).save_pretrained(out)
    return out


def real_lines(shared_data) -> tuple[list[str], list[tuple[str, str]]]:
    """300 WikiText-2 lines and SQuAD contexts, and 100 (question, context) pairs."""
    wiki = (shared_data / "text" / "wikitext2" / "valid.txt").read_text("utf-8").splitlines()
    wiki = [line.strip() for line in wiki if line.strip() and not line.strip().startswith("=")][:200]
    articles = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text("utf-8"))["data"]
    paragraphs = [p for a in articles for p in a["paragraphs"]][:100]
    pairs = [(p["qas"][0]["question"], p["context"]) for p in paragraphs]
    return wiki + [c for _, c in pairs], pairs


@pytest.mark.skipif(not hasattr(transformers, "BertTokenizerLegacy"), reason="transformers < 5")
def test_exported_tokenizer_loads_as_the_published_one(tmp_path, wordpiece_vocab, shared_data):
    """Fast (AutoTokenizer) and slow (BertTokenizerLegacy) tokenizers of an export give the same
    ids, token types, masks, truncation and decode as those of the published checkpoint."""
    cfg = dict(name="bert", vocab_size=1500, emb_dim=16, num_layers=1, num_heads=2, head_dim=8,
               mlp_dim=16, max_len=512)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    checkpoint.save_params(tmp_path / "ours", 0, params, {"model": cfg})
    tokenizer_lib.copy_tokenizer(wordpiece_vocab.parent, tmp_path / "ours")
    export.export_hf(tmp_path / "ours", tmp_path / "exported")
    original = published_folder(wordpiece_vocab, tmp_path / "original")
    assert (json.loads((tmp_path / "exported" / "tokenizer.json").read_text())
            == json.loads((original / "tokenizer.json").read_text()))
    lines, pairs = real_lines(shared_data)
    long_text = " ".join(lines[:20])
    for load in (transformers.AutoTokenizer.from_pretrained,
                 transformers.BertTokenizerLegacy.from_pretrained):
        ours, theirs = load(tmp_path / "exported"), load(original)
        assert ours.model_max_length == theirs.model_max_length == 512
        for args, kw in [((lines,), {}), ((long_text,), {}), ((long_text,), dict(truncation=True)),
                         (([q for q, _ in pairs], [c for _, c in pairs]), {}),
                         (([long_text] * 2, [q for q, _ in pairs[:2]]), dict(truncation=True))]:
            want = theirs(*args, **kw)
            assert ours(*args, **kw) == want
        assert len(ours(long_text)["input_ids"]) > 512  # the truncation above truncated
        assert len(ours(long_text, truncation=True)["input_ids"]) == 512
        ids = want["input_ids"] + ours(lines)["input_ids"]
        for skip in (False, True):
            assert ([ours.decode(i, skip_special_tokens=skip) for i in ids]
                    == [theirs.decode(i, skip_special_tokens=skip) for i in ids])
    assert ours.decode(ours("the life's work, isn't it?")["input_ids"][1:-1]) == "the life's work, isn't it?"


def hf_ids(tokenizer, lines):
    return tokenizer(lines, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_bert_folder_saved_by_transformers_5_converts_with_its_tokenizer(
        tmp_path, wordpiece_vocab, shared_data, lowercase):
    """transformers 5 saves a BERT's tokenizer as tokenizer.json alone (no vocab.txt): convert
    reads its WordPiece vocab and casing; the converted tokenizer equals HF's on real text, and
    the checkpoint's vocab.txt is the model's vocab in id order."""
    vocab = tokenizer_lib.load_vocab(wordpiece_vocab)
    src = tmp_path / "hf"
    transformers.BertModel(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=512)).save_pretrained(src)
    theirs = transformers.BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=lowercase)
    theirs.save_pretrained(src)
    assert not (src / "vocab.txt").exists()
    convert.convert_hf(src, tmp_path / "ours")
    assert tokenizer_lib.load_vocab(tmp_path / "ours" / "vocab.txt") == vocab
    lines, pairs = real_lines(shared_data)
    lines += [q for q, _ in pairs] + ["Ünïcödé CAFÉ Σίσυφος", "HELLO world"]
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    for ours in (tokenizer_lib.load_tokenizer(tmp_path / "ours"), tokenizer_lib.load_hf_tokenizer(src)):
        assert ours.lowercase == lowercase
        assert [list(ids) for ids in ours.encode_batch(lines)] == hf_ids(theirs, lines)
    # transformers rebuilds the normaliser from tokenizer_config.json (do_lower_case: true when
    # absent), whatever tokenizer.json's says; so does convert.
    config = json.loads((src / "tokenizer_config.json").read_text())
    del config["do_lower_case"]
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    ours = tokenizer_lib.load_hf_tokenizer(src)
    assert ours.lowercase and theirs.backend_tokenizer.normalizer.lowercase
    assert [list(ids) for ids in ours.encode_batch(lines)] == hf_ids(theirs, lines)


def test_a_tokenizer_json_beyond_bert_wordpiece_is_refused(tmp_path, wordpiece_vocab, english_lines):
    """An id without a token (a vocab.txt's duplicate line) reads as transformers reads it; what
    BertTokenizer's vocab cannot state is one line naming it, not another tokenizer."""
    vocab = tokenizer_lib.load_vocab(wordpiece_vocab)
    ids = {t: i for i, t in enumerate(vocab)}
    del ids["the"]  # e.g. "the" on two lines of vocab.txt: its first id is left without a token
    transformers.BertTokenizer(vocab=ids).save_pretrained(tmp_path)
    lines = english_lines[:200]
    assert ([list(x) for x in tokenizer_lib.load_hf_tokenizer(tmp_path).encode_batch(lines)]
            == hf_ids(transformers.AutoTokenizer.from_pretrained(tmp_path), lines))
    state = json.loads((tmp_path / "tokenizer.json").read_text())
    state["added_tokens"].append({"id": len(vocab), "content": "<new>", "special": False})
    (tmp_path / "tokenizer.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="tokens added beyond the WordPiece vocab [(]<new>[)]"):
        tokenizer_lib.load_hf_tokenizer(tmp_path)
    state["added_tokens"].pop()
    state["model"]["continuing_subword_prefix"] = "@@"
    (tmp_path / "tokenizer.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="WordPiece with {'continuing_subword_prefix': '@@'}"):
        tokenizer_lib.load_hf_tokenizer(tmp_path)


def test_sentencepiece_checkpoint_exports_without_tokenizer(tmp_path, english_lines, caplog):
    spm_dir = tokenizer_lib.train_vocab(english_lines, size=300, kind="sentencepiece",
                                        out_dir=tmp_path / "spm")
    cfg = dict(name="bert", vocab_size=300, emb_dim=16, num_layers=1, num_heads=2, head_dim=8,
               mlp_dim=16, max_len=32)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    checkpoint.save_params(tmp_path / "ckpt", 0, params, {"model": cfg})
    tokenizer_lib.copy_tokenizer(spm_dir, tmp_path / "ckpt")
    report = export.export_hf(tmp_path / "ckpt", tmp_path / "out")
    assert not report["tokenizer"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    assert "has a SentencePiece model" in caplog.text and "gets no tokenizer files" in caplog.text
    transformers.BertModel.from_pretrained(tmp_path / "out")


def fine_tuned_workdir(workdir, num_labels: int):
    """A training workdir as `bert-jax train` leaves it: TrainCheckpointer items and vocab."""
    model_cfg = dict(name="bert_classification", vocab_size=len(VOCAB), emb_dim=32, num_layers=2,
                     num_heads=4, head_dim=8, mlp_dim=40, max_len=24, num_labels=num_labels)
    model = models.create_model(model_cfg, seed=3)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    rng = np.random.default_rng(1)  # away from the init: biases and LayerNorms not 0 and 1
    params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.05, x.shape).astype(np.float32),
                          params)
    ckpt = checkpoint.TrainCheckpointer(workdir, keep=2)
    config = {"model": model_cfg, "seed": 0, "train": {"steps": 20}, "init_from": "/somewhere"}
    opt_state = jax.tree.map(np.zeros_like, params)
    for step in (10, 20):
        ckpt.save(step, params, opt_state, {"position": step}, config)
    ckpt.wait()
    ckpt.close()
    (workdir / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))


@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_fine_tuned_workdir_exports(tmp_path, num_labels):
    fine_tuned_workdir(tmp_path / "run", num_labels)
    hf, report = export_and_load(tmp_path / "run", tmp_path, transformers.BertForSequenceClassification)
    assert hf.config.num_labels == num_labels
    assert (hf.config.problem_type == "regression") == (num_labels == 1)
    _, ours = state.load_model(tmp_path / "run")
    inputs = batch()
    want = ours(jnp.asarray(inputs["input_ids"]), token_type_ids=jnp.asarray(inputs["token_type_ids"]),
                attention_mask=jnp.asarray(inputs["attention_mask"]))["logits"]
    np.testing.assert_allclose(run_hf(hf, inputs).logits.numpy(), want, **TOL)


def test_models_hf_cannot_express_are_refused(tmp_path):
    small = dict(vocab_size=len(VOCAB), emb_dim=16, num_layers=1, num_heads=2, head_dim=8,
                 mlp_dim=16, max_len=16)
    cases = {"pre_ln": (dict(name="bert", norm="pre", **small), r"model.norm='pre'"),
             "transformer": (dict(name="transformer", **small), "model.name='transformer' has no"),
             "no_segments": (dict(name="bert", **{**small, "type_vocab_size": 0}),
                             "type_vocab_size=0"),
             "rope": (dict(name="bert", positions="rope", **small), r"model.positions='rope'"),
             "sinusoidal": (dict(name="bert", positions="sinusoidal", **small),
                            r"model.positions='sinusoidal'"),
             "glu": (dict(name="bert", mlp_layer="glu", use_bias=False, **small),
                     r"model.use_bias=False.*model.mlp_layer='glu'"),
             "window": (dict(name="bert", attention_window=4, **small), r"model.attention_window=4")}
    for name, (model_cfg, message) in cases.items():
        params = nnx.to_pure_dict(nnx.state(models.create_model(model_cfg), nnx.Param))
        checkpoint.save_params(tmp_path / name, 0, params, {"model": model_cfg})
        with pytest.raises(ValueError, match=message):
            export.export_hf(tmp_path / name, tmp_path / f"{name}_out")
        assert not (tmp_path / f"{name}_out").exists()
    # A checkpoint saved before BERT read `positions` (its stored config has every model's
    # fields, e.g. tie_output) holds a learned table whatever its `positions` says: it exports.
    bert = dict(name="bert_pretraining", **small)
    params = nnx.to_pure_dict(nnx.state(models.create_model(bert), nnx.Param))
    old = {**dict(bert, positions="sinusoidal", tie_output=True)}  # a pre-split config
    checkpoint.save_params(tmp_path / "old", 0, params, {"model": old})
    export.export_hf(tmp_path / "old", tmp_path / "old_out")
    with pytest.raises(FileNotFoundError, match="no checkpoints/ folder"):
        export.export_hf(tmp_path / "nothing", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not empty"):
        export.export_hf(tmp_path / "pre_ln", tmp_path / "full")


@pytest.mark.slow
def test_export_command(tmp_path):
    fine_tuned_workdir(tmp_path / "run", 2)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-m", "bert_jax", "export", str(tmp_path / "run"),
                           f"hf:{tmp_path / 'hf'}", "--step", "10"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "as BertForSequenceClassification" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
        "tokenizer_config.json", "vocab.txt"]
    proc = subprocess.run([sys.executable, "-m", "bert_jax", "export", str(tmp_path / "run"),
                           str(tmp_path / "hf2")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "usage: bert-jax export <checkpoint_dir> hf:<out_dir>" in proc.stderr


def test_exported_weights_get_the_mode_of_any_other_file(tmp_path):
    # The safetensors library writes through a 0600 temporary file; an exported folder is
    # shared, so its weights get 0666 less the umask, as config.json does.
    old = os.umask(0o022)
    try:
        export.save_safetensors({"w": np.zeros(3, np.float32)}, tmp_path / "model.safetensors")
        (tmp_path / "config.json").write_text("{}")
    finally:
        os.umask(old)
    assert oct((tmp_path / "model.safetensors").stat().st_mode & 0o777) == "0o644"
    assert oct((tmp_path / "config.json").stat().st_mode & 0o777) == "0o644"
