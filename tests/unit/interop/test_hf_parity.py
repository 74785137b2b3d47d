"""Number-for-number parity with the PyTorch Hugging Face BERT: randomly initialised HF
models are saved, converted with `bert-jax convert` and run on real padded sentences."""

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.interop import convert  # noqa: E402
from bert_jax.training import state  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def hf_config(vocab_size: int, **kw):
    return transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=64, type_vocab_size=2,
        hidden_act="gelu", **kw)


@pytest.fixture(scope="module")
def batch(wordpiece_vocab, english_lines):
    """Sentence pairs of different lengths, padded, as HF's own tokenizer encodes them."""
    tok = transformers.BertTokenizer(str(wordpiece_vocab), do_lower_case=True)
    firsts = [line[:60] for line in english_lines[:4]]
    seconds = [line[-90:] for line in english_lines[4:8]]
    enc = tok(firsts, seconds, padding=True, truncation=True, max_length=48, return_tensors="np")
    assert (enc["attention_mask"] == 0).any(), "the batch must contain padding"
    return {k: enc[k].astype(np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}


def convert_model(hf_model, vocab, tmp_path, safe=True):
    src, out = tmp_path / "hf", tmp_path / "converted"
    if safe:
        hf_model.save_pretrained(src)
    else:  # transformers 5 only writes safetensors: write the classic .bin as 4.x did
        hf_model.config.architectures = [type(hf_model).__name__]
        hf_model.config.save_pretrained(src)
        torch.save(hf_model.state_dict(), src / "pytorch_model.bin")
    shutil.copy(vocab, src / "vocab.txt")
    report = convert.convert_hf(src, out)
    _, model = state.load_model(out)
    return model, report


def run_hf(hf_model, batch, **kw):
    with torch.no_grad():
        return hf_model(**{k: torch.from_numpy(v) for k, v in batch.items()}, **kw)


def jax_inputs(batch):
    return {k: jnp.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_bin"])
def test_pretraining_parity(batch, wordpiece_vocab, tmp_path, safe):
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(hf_config(1500)).eval()
    model, report = convert_model(hf, wordpiece_vocab, tmp_path, safe)
    assert report["missing"] == [] and report["unused"] == []
    ref = run_hf(hf, batch, output_hidden_states=True)
    out = model(**jax_inputs(batch))
    np.testing.assert_allclose(out["mlm_logits"], ref.prediction_logits.numpy(), **TOL)
    np.testing.assert_allclose(out["nsp_logits"], ref.seq_relationship_logits.numpy(), **TOL)
    # Gathering the masked positions first gives the same logits there.
    positions = np.array([[1, 3, 5]] * batch["input_ids"].shape[0])
    gathered = model(**jax_inputs(batch), masked_positions=jnp.asarray(positions))["mlm_logits"]
    expected = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    np.testing.assert_allclose(gathered, expected, **TOL)
    # Every layer's hidden states (what `bert-jax features` reads).
    hidden = model.bert(**jax_inputs(batch), return_hidden=True)["hidden_states"]
    assert hidden.shape[0] == len(ref.hidden_states) == 4
    for ours, theirs in zip(hidden, ref.hidden_states):
        np.testing.assert_allclose(ours, theirs.numpy(), **TOL)


@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_sequence_classification_parity(batch, wordpiece_vocab, tmp_path, num_labels):
    torch.manual_seed(1)
    hf = transformers.BertForSequenceClassification(
        hf_config(1500, num_labels=num_labels)).eval()
    model, report = convert_model(hf, wordpiece_vocab, tmp_path)
    assert report["missing"] == [] and report["unused"] == []
    np.testing.assert_allclose(model(**jax_inputs(batch))["logits"],
                               run_hf(hf, batch).logits.numpy(), **TOL)


def test_token_classification_parity(batch, wordpiece_vocab, tmp_path):
    torch.manual_seed(2)
    hf = transformers.BertForTokenClassification(hf_config(1500, num_labels=9)).eval()
    model, report = convert_model(hf, wordpiece_vocab, tmp_path)
    assert report["missing"] == [] and report["unused"] == []
    np.testing.assert_allclose(model(**jax_inputs(batch))["logits"],
                               run_hf(hf, batch).logits.numpy(), **TOL)


def test_question_answering_parity(batch, wordpiece_vocab, tmp_path):
    torch.manual_seed(3)
    hf = transformers.BertForQuestionAnswering(hf_config(1500)).eval()
    model, report = convert_model(hf, wordpiece_vocab, tmp_path, safe=False)
    assert report["missing"] == [] and report["unused"] == []
    out, ref = model(**jax_inputs(batch)), run_hf(hf, batch)
    np.testing.assert_allclose(out["start_logits"], ref.start_logits.numpy(), **TOL)
    np.testing.assert_allclose(out["end_logits"], ref.end_logits.numpy(), **TOL)


def test_multiple_choice_parity(batch, wordpiece_vocab, tmp_path):
    torch.manual_seed(4)
    hf = transformers.BertForMultipleChoice(hf_config(1500)).eval()
    model, report = convert_model(hf, wordpiece_vocab, tmp_path)
    assert report["missing"] == [] and report["unused"] == []
    choices = {k: np.stack([v[:2], v[2:4]]) for k, v in batch.items()}  # [B=2, C=2, T]
    np.testing.assert_allclose(model(**jax_inputs(choices))["logits"],
                               run_hf(hf, choices).logits.numpy(), **TOL)


def test_checkpoint_without_heads_reports_them(batch, wordpiece_vocab, tmp_path):
    torch.manual_seed(5)
    hf = transformers.BertModel(hf_config(1500))
    src, out = tmp_path / "hf", tmp_path / "converted"
    hf.save_pretrained(src)
    shutil.copy(wordpiece_vocab, src / "vocab.txt")
    report = convert.convert_hf(src, out, name="bert_pretraining")
    assert sorted(report["missing"]) == sorted(
        ["mlm/transform/kernel", "mlm/transform/bias", "mlm/norm/scale", "mlm/norm/bias",
         "mlm/bias", "nsp/kernel", "nsp/bias"])
    # The encoder is still the reference one.
    _, model = state.load_model(out)
    ref = run_hf(hf.eval(), batch)
    np.testing.assert_allclose(model.bert(**jax_inputs(batch))["sequence_output"],
                               ref.last_hidden_state.numpy(), **TOL)


def test_shape_mismatch_names_the_tensor(wordpiece_vocab, tmp_path):
    torch.manual_seed(6)
    hf = transformers.BertForPreTraining(hf_config(1500))
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    shutil.copy(wordpiece_vocab, src / "vocab.txt")
    cfg = (src / "config.json").read_text().replace('"intermediate_size": 96',
                                                    '"intermediate_size": 80')
    (src / "config.json").write_text(cfg)
    expected = (r"hf/config.json: intermediate_size=80 but bert.encoder.layer.0.intermediate.dense"
                r".weight has shape \(96, 64\)")
    with pytest.raises(ValueError, match=expected):
        convert.convert_hf(src, tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoints").exists()


# Layouts of published checkpoints: a plain BertModel (no `bert.` prefix: most
# sentence-embedding models) in each file layout, TF-era gamma/beta names, any architecture.
def save_layout(hf_model, vocab, root, layout):
    """Writes `hf_model` the way `layout` publishes it; returns the folder to convert."""
    src = root / "hf"
    hf_model.save_pretrained(src)
    sd = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    config = json.loads((src / "config.json").read_text())
    if layout in ("pytorch_bin", "gamma_beta_bin", "sharded_bin"):
        (src / "model.safetensors").unlink()
        if layout == "gamma_beta_bin":  # as bert-base-uncased's original pytorch_model.bin
            sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma")
                  .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in sd.items()}
        if layout == "sharded_bin":
            names = sorted(sd)
            shards = {f"pytorch_model-0000{i + 1}-of-00002.bin": names[i::2] for i in range(2)}
            for file, keys in shards.items():
                torch.save({k: sd[k] for k in keys}, src / file)
            weight_map = {k: file for file, keys in shards.items() for k in keys}
            (src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
        else:
            torch.save(sd, src / "pytorch_model.bin")
    elif layout == "sharded_safetensors":
        shutil.rmtree(src)
        hf_model.save_pretrained(src, max_shard_size="20KB")
        assert (src / "model.safetensors.index.json").is_file()
    elif layout == "no_architectures":
        del config["architectures"]
    elif layout == "unknown_architecture":
        config["architectures"] = ["BertForSomethingNew"]
    (src / "config.json").write_text(json.dumps(config))
    shutil.copy(vocab, src / "vocab.txt")
    if layout in ("hf_cache_entry", "hf_cache_snapshot"):  # blobs + symlinked snapshot + refs
        entry = root / "hub" / "models--someone--tiny-bert"
        (entry / "blobs").mkdir(parents=True)
        snapshot = entry / "snapshots" / "0123abcd"
        snapshot.mkdir(parents=True)
        for i, file in enumerate(sorted(src.iterdir())):
            shutil.move(file, entry / "blobs" / f"blob{i}")
            (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text("0123abcd")
        return entry if layout == "hf_cache_entry" else snapshot
    return src


LAYOUTS = ["safetensors", "pytorch_bin", "sharded_safetensors", "sharded_bin", "gamma_beta_bin",
           "no_architectures", "unknown_architecture", "hf_cache_entry", "hf_cache_snapshot"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_plain_bert_model_parity(batch, wordpiece_vocab, tmp_path, layout):
    """transformers.BertModel as saved by save_pretrained: no `bert.` prefix."""
    torch.manual_seed(7)
    hf = transformers.BertModel(hf_config(1500)).eval()
    report = convert.convert_hf(save_layout(hf, wordpiece_vocab, tmp_path, layout), tmp_path / "out")
    assert (report["model"], report["missing"], report["unused"]) == ("bert", [], [])
    _, model = state.load_model(tmp_path / "out")
    ref = run_hf(hf, batch, output_hidden_states=True)
    out = model(**jax_inputs(batch), return_hidden=True)
    np.testing.assert_allclose(out["sequence_output"], ref.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(out["pooled_output"], ref.pooler_output.numpy(), **TOL)
    for ours, theirs in zip(out["hidden_states"], ref.hidden_states, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), **TOL)


def test_encoder_without_pooler(batch, wordpiece_vocab, tmp_path):
    """Sentence-embedding models often drop the pooler (add_pooling_layer=False)."""
    torch.manual_seed(8)
    hf = transformers.BertModel(hf_config(1500), add_pooling_layer=False).eval()
    report = convert.convert_hf(save_layout(hf, wordpiece_vocab, tmp_path, "safetensors"),
                                tmp_path / "out")
    assert (report["model"], report["missing"], report["unused"]) == ("bert", [], [])
    model_cfg, model = state.load_model(tmp_path / "out")
    assert model_cfg["use_pooler"] is False
    np.testing.assert_allclose(model(**jax_inputs(batch))["sequence_output"],
                               run_hf(hf, batch).last_hidden_state.numpy(), **TOL)


@pytest.mark.parametrize("layout", ["safetensors", "gamma_beta_bin"])
def test_masked_lm_parity(batch, wordpiece_vocab, tmp_path, layout):
    """BertForMaskedLM (bert-base-uncased's architecture): no pooler, no NSP head; both are
    listed as freshly initialised, and the MLM logits are the reference ones."""
    torch.manual_seed(9)
    hf = transformers.BertForMaskedLM(hf_config(1500)).eval()
    report = convert.convert_hf(save_layout(hf, wordpiece_vocab, tmp_path, layout), tmp_path / "out")
    assert report["model"] == "bert_pretraining" and report["unused"] == []
    assert sorted(report["missing"]) == ["bert/pooler/bias", "bert/pooler/kernel", "nsp/bias",
                                         "nsp/kernel"]
    _, model = state.load_model(tmp_path / "out")
    np.testing.assert_allclose(model(**jax_inputs(batch))["mlm_logits"],
                               run_hf(hf, batch).logits.numpy(), **TOL)


def test_unknown_architecture_is_inferred_from_the_tensors(wordpiece_vocab, tmp_path):
    torch.manual_seed(10)
    hf = transformers.BertForQuestionAnswering(hf_config(1500))
    src = save_layout(hf, wordpiece_vocab, tmp_path, "unknown_architecture")
    assert convert.convert_hf(src, tmp_path / "out")["model"] == "bert_span"
    with pytest.raises(ValueError, match="--head='bert_qa'; choose one of"):
        convert.convert_hf(src, tmp_path / "out2", name="bert_qa")


def test_decoder_config_is_refused(wordpiece_vocab, tmp_path):
    hf = transformers.BertLMHeadModel(hf_config(1500, is_decoder=True))
    src = save_layout(hf, wordpiece_vocab, tmp_path, "safetensors")
    with pytest.raises(ValueError, match="is_decoder"):
        convert.convert_hf(src, tmp_path / "out")
