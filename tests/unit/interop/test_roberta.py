"""RoBERTa in and out: its byte-level BPE tokenizer equals HF's RobertaTokenizer on real text, and
every RoBERTa head converts from transformers' PyTorch classes and exports back to them with
outputs equal to 1e-5 (random-init models from small RobertaConfigs, real padded text)."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_bpe_equals_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from bert_jax.interop import convert, export  # noqa: E402
from bert_jax.training import state  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # roberta-base's ids 0..3, <mask> after


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory, wiki_lines):
    """A byte-level BPE vocab.json + merges.txt trained on real text (no public vocab offline)."""
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("bpe")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(wiki_lines, vocab_size=1000, min_frequency=2, special_tokens=SPECIALS,
                            show_progress=False)
    bpe.save_model(str(out))
    return out


@pytest.fixture(scope="module")
def hf_tokenizer(bpe_dir):
    return transformers.RobertaTokenizer.from_pretrained(bpe_dir)


@pytest.fixture(scope="module")
def json_only_dir(tmp_path_factory, hf_tokenizer):
    """The same tokenizer as HF saves it, keeping only its tokenizer.json, there set to cut and
    pad (as some published ones are), which ours must not do."""
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("bpe_json")
    hf_tokenizer.save_pretrained(out)
    for f in out.iterdir():
        if f.name != "tokenizer.json":
            f.unlink()
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.enable_truncation(8)
    tok.enable_padding(length=200, pad_id=1, pad_token="<pad>")
    tok.save(str(out / "tokenizer.json"))
    return out


@pytest.mark.parametrize("files", ["vocab_merges", "tokenizer_json"])
def test_tokenizer_equals_hf(bpe_dir, json_only_dir, hf_tokenizer, wiki_lines, squad_lines, files):
    ours = tokenizer_lib.load_tokenizer(bpe_dir if files == "vocab_merges" else json_only_dir)
    assert (ours.kind, ours.vocab_size) == ("bpe", len(hf_tokenizer))
    roles = ("cls", "sep", "pad", "unk", "mask")
    assert ([getattr(ours, f"{r}_id") for r in roles]
            == [getattr(hf_tokenizer, f"{r}_token_id") for r in roles] == [0, 2, 1, 3, 4])
    # Pairs <s> A </s></s> B </s>, one segment, cut (longest first) and padded as HF does.
    enc = assert_bpe_equals_hf(ours, hf_tokenizer, wiki_lines[:500] + squad_lines, squad_lines)
    assert enc.tokens[:1] == ["<s>"] and enc.tokens.count("</s>") == 3


# HF class -> (our model, {HF output: ours}, config changes, choices)
HEADS = {
    "RobertaModel": ("bert", {"last_hidden_state": "sequence_output",
                              "pooler_output": "pooled_output"}, {}, 0),
    "RobertaForMaskedLM": ("bert_pretraining", {"logits": "mlm_logits"}, {}, 0),
    "RobertaForSequenceClassification": ("bert_classification", {"logits": "logits"},
                                         {"num_labels": 3}, 0),
    "RobertaForTokenClassification": ("bert_tagging", {"logits": "logits"}, {"num_labels": 5}, 0),
    "RobertaForQuestionAnswering": ("bert_span", {"start_logits": "start_logits",
                                                  "end_logits": "end_logits"}, {}, 0),
    "RobertaForMultipleChoice": ("bert_choice", {"logits": "logits"}, {}, 2),
}


def roberta_config(vocab_size: int, **kw):
    """A small RoBERTa as roberta-base is configured (pad 1, positions 2..T+1, one segment)."""
    return transformers.RobertaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, **kw)


@pytest.fixture(scope="module")
def batch(hf_tokenizer, squad_lines):
    """Question/context pairs of different lengths, padded, as HF's tokenizer encodes them."""
    enc = hf_tokenizer(squad_lines[:4], squad_lines[10:14], padding=True, truncation=True,
                       max_length=64, return_tensors="np")
    assert (enc["attention_mask"] == 0).any(), "the batch must contain padding"
    return {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}


def run_hf(model, inputs):
    with torch.no_grad():
        return model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()})


@pytest.mark.parametrize("hf_class", list(HEADS))
def test_convert_and_export_parity(hf_class, bpe_dir, hf_tokenizer, batch, tmp_path):
    """transformers -> convert -> ours: the same outputs; ours -> export -> transformers: no
    missing weights, the same outputs, and a tokenizer that encodes the same."""
    name, outputs, kw, choices = HEADS[hf_class]
    cls = getattr(transformers, hf_class)
    torch.manual_seed(0)
    original = cls(roberta_config(len(hf_tokenizer), **kw)).eval()
    src = tmp_path / "hf"
    original.save_pretrained(src)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_dir / f, src / f)
    inputs = ({k: np.stack([v[:2], v[2:]], axis=1) for k, v in batch.items()}  # [B=2, C=2, T]
              if choices else batch)

    report = convert.convert_hf(src, tmp_path / "ours")
    assert report["model"] == name and report["unused"] == []
    assert report["missing"] == []  # RobertaForMaskedLM: an MLM-only model (nsp=False)
    model_cfg, model = state.load_model(tmp_path / "ours")
    assert (model_cfg["position_offset"], model_cfg["type_vocab_size"]) == (2, 1)
    ours = model(**{k: jnp.asarray(v) for k, v in inputs.items()})
    ref = run_hf(original, inputs)
    for theirs, mine in outputs.items():
        np.testing.assert_allclose(ours[mine], getattr(ref, theirs).numpy(), **TOL, err_msg=theirs)

    export_report = export.export_hf(tmp_path / "ours", tmp_path / "back")
    assert export_report["architecture"] == hf_class and export_report["tokenizer"]
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["model_type"], config["pad_token_id"], config["max_position_embeddings"]) == (
        "roberta", 1, 66)
    loaded, info = cls.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    back = run_hf(loaded, inputs)
    for theirs, mine in outputs.items():
        np.testing.assert_allclose(getattr(back, theirs).numpy(), ours[mine], **TOL, err_msg=theirs)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert type(tok).__name__ == "RobertaTokenizer" and tok.model_max_length == 64
    assert tok("a b", "c")["input_ids"] == hf_tokenizer("a b", "c")["input_ids"]


def test_roberta_without_a_pad_row_is_refused_on_export(tmp_path):
    """Ours with position_offset but a tokenizer whose pad id is not the row before: HF's RoBERTa
    would read other position rows, so export names the field."""
    with pytest.raises(ValueError, match=r"model.position_offset=3 \(HF RoBERTa: the tokenizer's "
                                         r"pad id \+ 1 = 2\)"):
        convert.hf_config({"name": "bert", "vocab_size": 10, "emb_dim": 8, "num_layers": 1,
                           "num_heads": 2, "head_dim": 4, "mlp_dim": 8, "position_offset": 3,
                           "hf_family": "roberta"},
                          {"pad": 1})


def test_a_missing_special_token_names_its_role(bpe_dir, tmp_path):
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_dir / f, tmp_path / f)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<msk>"}))
    tok = tokenizer_lib.load_tokenizer(tmp_path)
    assert (tok.cls_id, tok.sep_id) == (0, 2)  # the others keep RoBERTa's defaults
    with pytest.raises(ValueError, match=r"vocab.json: the vocab has no mask_token token '<msk>'.*"
                                         r"set mask_token in tokenizer_config.json"):
        _ = tok.mask_id


@pytest.mark.parametrize("saved,says", [("bert", "roberta"), ("roberta", "bert")])
def test_weights_of_the_other_family_are_refused(saved, says, bpe_dir, tmp_path):
    """A folder whose config.json says one family and whose tensors are the other's (a BERT
    relabelled RoBERTa would convert with its positions shifted by the pad id + 1) is refused,
    naming config.json, its model_type and what to do."""
    torch.manual_seed(0)
    src = tmp_path / "hf"
    if saved == "bert":
        transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=66)).save_pretrained(src)
    else:
        transformers.RobertaForMaskedLM(roberta_config(1000)).save_pretrained(src)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_dir / f, src / f)
    (src / "vocab.txt").write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                              "[MASK]", "a"]))
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": says}))
    theirs = {"bert": "BERT", "roberta": "RoBERTa"}[saved]
    with pytest.raises(ValueError, match=rf"^{src / 'config.json'}: model_type='{says}' but the "
                                         rf"weights are a {theirs}'s \(tensor '{saved}\..*use the "
                                         rf"one that came with them \(model_type='{saved}'\)$"):
        convert.convert_hf(src, tmp_path / "ours")
    assert not (tmp_path / "ours").exists()
    (src / "config.json").write_text(json.dumps(config))  # with its own config.json: converts
    assert convert.convert_hf(src, tmp_path / "ours")["model"] == "bert_pretraining"


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_a_type_vocab_size_the_family_cannot_have_is_refused(model_type):
    hf = {"model_type": model_type, "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 48, "type_vocab_size": 0}
    with pytest.raises(ValueError, match=r"^config.json: type_vocab_size=0, but HF's .* always has "
                                         r"token type embeddings"):
        convert.model_config_from_hf(hf, "bert")
