"""A checkpoint converted from a Hugging Face folder exports a tokenizer that decodes, cuts and
names its special tokens as that folder's does (transformers 5 reads a tokenizer_config.json
without clean_up_tokenization_spaces as false: "it ' s", as all-MiniLM-L6-v2's gives); one of
our own vocabularies keeps today's settings. A damaged weights file converts to nothing."""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from bert_jax.interop import convert, export  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "it", "'", "s", "a", "test", ",", "isn", "t",
         "?", ".", "the", "dog", "##s"]
TEXT = "It's a test, isn't it?"
# all-MiniLM-L6-v2's tokenizer_config.json as published (no clean_up_tokenization_spaces)
MINILM = {"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
          "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True,
          "strip_accents": None, "do_basic_tokenize": True, "never_split": None,
          "tokenizer_class": "BertTokenizer", "model_max_length": 512}


def hf_folder(path, tokenizer_config):
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=64))
    model.save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", "utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), "utf-8")
    return path


@pytest.mark.parametrize("changes", [{}, {"clean_up_tokenization_spaces": True},
                                     {"model_max_length": 256, "mask_token": "[MASK]"}])
def test_export_tokenizes_and_decodes_as_the_converted_folder(tmp_path, changes):
    source = hf_folder(tmp_path / "hf", {**MINILM, **changes})
    convert.convert_hf(source, tmp_path / "ours")
    export.export_hf(tmp_path / "ours", tmp_path / "back")
    theirs = transformers.AutoTokenizer.from_pretrained(source)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    ids = theirs(TEXT)["input_ids"]
    assert back(TEXT)["input_ids"] == ids
    assert back.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    assert back.model_max_length == theirs.model_max_length
    assert back.clean_up_tokenization_spaces == theirs.clean_up_tokenization_spaces
    assert (back.mask_token, back.cls_token) == (theirs.mask_token, theirs.cls_token)
    saved = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text("utf-8"))
    assert ("clean_up_tokenization_spaces" in saved) == ("clean_up_tokenization_spaces" in changes)


def test_all_minilm_decodes_with_spaces_as_published(tmp_path):
    """The case of the report: the export no longer joins "it ' s" where the source did not."""
    source = hf_folder(tmp_path / "hf", MINILM)
    convert.convert_hf(source, tmp_path / "ours")
    export.export_hf(tmp_path / "ours", tmp_path / "back")
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert back.decode(back(TEXT, add_special_tokens=False)["input_ids"]) == "it ' s a test, isn ' t it?"


def test_our_own_vocabulary_keeps_todays_settings(tmp_path):
    """A checkpoint of ours (no Hugging Face source) exports with clean-up on, as the published
    BERT checkpoints set it, and model_max_length = the position table."""
    source = hf_folder(tmp_path / "hf", MINILM)
    convert.convert_hf(source, tmp_path / "ours")
    (tmp_path / "ours" / tokenizer_lib.HF_SOURCE_NAME).unlink()  # as a run of ours has none
    export.export_hf(tmp_path / "ours", tmp_path / "back")
    saved = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text("utf-8"))
    assert saved["clean_up_tokenization_spaces"] is True and saved["model_max_length"] == 64


def test_a_weights_file_with_nan_values_is_refused(tmp_path):
    """A damaged model.safetensors (NaN where numbers were) converts to nothing: one error
    naming the tensor, not a checkpoint of NaN parameters."""
    source = hf_folder(tmp_path / "hf", MINILM)
    import safetensors.numpy

    tensors = safetensors.numpy.load_file(source / "model.safetensors")
    name = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[name].reshape(-1)[:7] = np.nan
    safetensors.numpy.save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"tensor {re.escape(name)} holds 7 NaN or infinite values"):
        convert.convert_hf(source, tmp_path / "ours")
    assert not (tmp_path / "ours" / "checkpoints").exists()
