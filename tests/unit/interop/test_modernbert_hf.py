"""ModernBERT in and out: a ModernBERT-style tokenizer.json (byte-level BPE with [CLS] [SEP]
[PAD] [MASK] [UNK] added at the end and a [CLS] A [SEP] B [SEP] template) reads as HF's fast
tokenizer does on real text, and every ModernBERT head converts from transformers' PyTorch
classes and exports back to them with outputs equal to 1e-5 (random-init models from small
ModernBertConfigs with local and global layers, randomised norms and biases, real padded text).

No ModernBERT tokenizer is on this machine (and no network): the tokenizer.json here is trained
on WikiText-2 in ModernBERT's layout (its OLMo/GPT-NeoX-style specials first, BERT's added at
the end, [MASK] stripping the space before it)."""


import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_bpe_equals_hf, write_modernbert_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import models  # noqa: E402
from bert_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from bert_jax.interop import convert, export  # noqa: E402
from bert_jax.training import checkpoint, state  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, wiki_lines):
    """A ModernBERT-style tokenizer.json and tokenizer_config.json (as ModernBERT-base's)."""
    return write_modernbert_tokenizer(wiki_lines, tmp_path_factory.mktemp("modernbert_tok"))


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def json_only_dir(tmp_path_factory, tokenizer_dir):
    """The tokenizer.json alone: the special tokens are found by their BERT names."""
    out = tmp_path_factory.mktemp("modernbert_tok_json")
    (out / "tokenizer.json").write_text((tokenizer_dir / "tokenizer.json").read_text("utf-8"), "utf-8")
    return out


@pytest.mark.parametrize("files", ["with_config", "tokenizer_json_only"])
def test_tokenizer_equals_hf(tokenizer_dir, json_only_dir, hf_tokenizer, wiki_lines, squad_lines,
                             files):
    ours = tokenizer_lib.load_tokenizer(tokenizer_dir if files == "with_config" else json_only_dir)
    assert (ours.kind, ours.vocab_size) == ("bpe", len(hf_tokenizer))
    roles = ("cls", "sep", "pad", "unk", "mask")
    want = [hf_tokenizer.convert_tokens_to_ids(f"[{r.upper()}]") for r in roles]
    assert [getattr(ours, f"{r}_id") for r in roles] == want == [
        getattr(hf_tokenizer, f"{r}_token_id") for r in roles]
    assert sorted(want) == list(range(len(hf_tokenizer) - 5, len(hf_tokenizer)))  # added at the end
    # Pairs [CLS] A [SEP] B [SEP] (B's segment 1), cut (longest first) and padded as HF does.
    texts = wiki_lines[:500] + squad_lines + ["a [MASK] b", "[CLS] twice [SEP] [PAD]"]
    enc = assert_bpe_equals_hf(ours, hf_tokenizer, texts, squad_lines)
    assert enc.tokens[:1] == ["[CLS]"] and enc.tokens.count("[SEP]") == 2


# HF class -> (our model, {HF output: ours}, config changes, choices)
HEADS = {
    "ModernBertModel": ("bert", {"last_hidden_state": "sequence_output"}, {}, 0),
    "ModernBertForMaskedLM": ("bert_pretraining", {"logits": "mlm_logits"}, {}, 0),
    "ModernBertForSequenceClassification": ("bert_classification", {"logits": "logits"},
                                            {"num_labels": 3}, 0),
    "ModernBertForTokenClassification": ("bert_tagging", {"logits": "logits"}, {"num_labels": 5}, 0),
    "ModernBertForQuestionAnswering": ("bert_span", {"start_logits": "start_logits",
                                                     "end_logits": "end_logits"}, {}, 0),
    "ModernBertForMultipleChoice": ("bert_choice", {"logits": "logits"}, {}, 2),
}
# (HF class, config changes): every head with ModernBERT's bias-free defaults and [CLS] pooling;
# mean pooling; and biases everywhere (norms, attention, MLP, head) with no MLM decoder bias.
# Sequence classification's mean pooling is its biased case's (the bias-free head is the first
# case's): one conversion each way fewer.
BIASED = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
              decoder_bias=False)
CASES = [(c, {}) for c in HEADS] + [
    ("ModernBertForMultipleChoice", {"classifier_pooling": "mean"}),
    ("ModernBertForMaskedLM", BIASED),
    ("ModernBertForSequenceClassification", {**BIASED, "classifier_pooling": "mean"}),
]


def modernbert_config(tokenizer, **kw):
    """A small ModernBERT: 4 layers, global at 0 and 3 (every third), a 9-token window (4 each
    side, HF local_attention=8), rope bases other than the defaults."""
    ids = {f"{r}_token_id": getattr(tokenizer, f"{r}_token_id") for r in ("pad", "cls", "sep")}
    cfg = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=128, local_attention=8,
        global_rope_theta=20_000.0, local_rope_theta=500.0, bos_token_id=ids["cls_token_id"],
        eos_token_id=ids["sep_token_id"], **ids, **{"global_attn_every_n_layers": 3, **kw})
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="module")
def batch(hf_tokenizer, squad_lines):
    """Question/context pairs of different lengths (up to 64 tokens: beyond the window), padded."""
    enc = hf_tokenizer(squad_lines[:4], squad_lines[10:14], padding=True, truncation=True,
                       max_length=64, return_tensors="np")
    assert (enc["attention_mask"] == 0).any() and enc["input_ids"].shape[1] > 20
    return {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}


def run_hf(model, inputs):
    with torch.no_grad():
        return model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()})


def randomise(model, seed: int = 0):
    """Norm scales and biases away from 1 and 0, so that a misplaced one shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def compare(ref, ours, outputs):
    """Outputs equal everywhere (padding's rows too: both attend from them to the real tokens)."""
    for theirs, mine in outputs.items():
        np.testing.assert_allclose(np.asarray(ours[mine]), getattr(ref, theirs).detach().numpy(),
                                   **TOL, err_msg=theirs)


@pytest.mark.parametrize("hf_class,changes", CASES,
                         ids=[c + "".join(f"-{k}={v}" for k, v in kw.items() if k != "decoder_bias")
                              for c, kw in CASES])
def test_convert_and_export_parity(hf_class, changes, tokenizer_dir, hf_tokenizer, batch, tmp_path):
    """transformers -> convert -> ours: the same outputs; ours -> export -> transformers: no
    missing or unexpected weights, the same outputs, and a tokenizer that encodes the same."""
    name, outputs, kw, choices = HEADS[hf_class]
    cls = getattr(transformers, hf_class)
    torch.manual_seed(0)
    original = randomise(cls(modernbert_config(hf_tokenizer, **kw, **changes)))
    src = tmp_path / "hf"
    original.save_pretrained(src)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (src / f).write_text((tokenizer_dir / f).read_text("utf-8"), "utf-8")
    inputs = ({k: np.stack([v[:2], v[2:]], axis=1) for k, v in batch.items()}  # [B=2, C=2, T]
              if choices else batch)

    report = convert.convert_hf(src, tmp_path / "ours")
    assert report["model"] == name and report["unused"] == []
    assert report["missing"] == []  # ModernBertForMaskedLM converts as an MLM-only model (nsp=False)
    model_cfg, model = state.load_model(tmp_path / "ours")
    assert {k: model_cfg[k] for k in ("positions", "mlp_layer", "task_head", "attention_window",
                                      "attention_global_every", "rope_theta", "rope_local_theta")} == {
        "positions": "rope", "mlp_layer": "glu", "task_head": "modernbert", "attention_window": 4,
        "attention_global_every": 3, "rope_theta": 20_000.0, "rope_local_theta": 500.0}
    biased = changes.get("norm_bias", False)
    assert (model_cfg["use_bias"], model_cfg["norm_bias"]) == (biased, biased)
    ours = model(**{k: jnp.asarray(v) for k, v in inputs.items()})
    compare(run_hf(original, inputs), ours, outputs)

    export_report = export.export_hf(tmp_path / "ours", tmp_path / "back")
    assert export_report["architecture"] == hf_class and export_report["tokenizer"]
    loaded, info = cls.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    loaded.config._attn_implementation = "eager"
    assert loaded.config.layer_types == original.config.layer_types
    assert loaded.config.rope_parameters == original.config.rope_parameters
    compare(run_hf(loaded, inputs), ours, outputs)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert tok("a b", "c")["input_ids"] == hf_tokenizer("a b", "c")["input_ids"]
    assert tok.mask_token_id == hf_tokenizer.mask_token_id


@pytest.mark.parametrize("pattern,window,every", [
    (dict(layer_types=["full_attention"] * 4), 0, 0),
    (dict(layer_types=["sliding_attention"] * 4), 4, 0),
    (dict(layer_types=["full_attention", "sliding_attention"] * 2), 4, 2),
    (dict(layer_types=["full_attention"] + ["sliding_attention"] * 3), 4, 4),
    (dict(global_attn_every_n_layers=1), 0, 0),
])
def test_layer_patterns_convert_and_come_back(pattern, window, every, hf_tokenizer):
    """Each pattern our global-every expresses, as 5.x's layer_types or older configs' every n,
    reads as our window and global-every, and config.json written back says the same."""
    cfg = modernbert_config(hf_tokenizer, **pattern).to_dict()
    cfg.pop("global_attn_every_n_layers", None)
    if "global_attn_every_n_layers" in pattern:  # as an older config.json: no layer_types
        cfg = {**{k: v for k, v in cfg.items() if k != "layer_types"}, **pattern}
    ours = convert.model_config_from_hf(cfg, "bert")
    assert (ours["attention_window"], ours["attention_global_every"]) == (window, every)
    back = convert.hf_config(ours, {"pad": 1, "cls": 2, "sep": 3})
    assert back["layer_types"] == transformers.ModernBertConfig(**cfg).layer_types


def test_a_window_wider_than_the_positions_is_refused(hf_tokenizer):
    # local_attention is over both sides: 2 x our window; one past the positions fits no input.
    cfg = modernbert_config(hf_tokenizer, layer_types=["sliding_attention"] * 4).to_dict()
    positions = cfg["max_position_embeddings"]
    assert convert.model_config_from_hf({**cfg, "local_attention": positions}, "bert")[
        "attention_window"] == positions // 2
    with pytest.raises(ValueError, match=rf"local_attention={positions + 2} exceeds "
                                         rf"max_position_embeddings={positions}"):
        convert.model_config_from_hf({**cfg, "local_attention": positions + 2}, "bert")


def test_attention_dropout_maps_to_both_of_ours_and_back(hf_tokenizer):
    """HF's attention_dropout drops the probabilities and, in ModernBertAttention, the output
    projection's output (`self.out_drop = nn.Dropout(config.attention_dropout)`, applied to
    `self.Wo(attn_output)`): it sets both of our rates, and export writes the larger of ours."""
    cfg = modernbert_config(hf_tokenizer, attention_dropout=0.2, embedding_dropout=0.05).to_dict()
    ours = convert.model_config_from_hf(cfg, "bert")
    assert (ours["attention_dropout_rate"], ours["attention_output_dropout_rate"],
            ours["dropout_rate"]) == (0.2, 0.2, 0.05)
    ids = {"pad": 1, "cls": 2, "sep": 3}
    assert convert.hf_config(ours, ids)["attention_dropout"] == 0.2
    # ModernBERT's pretraining dropouts: 0.1 on the attention output only
    recipe = models.model_section("bert", {**models.modernbert_model_fields("tiny"), **TINY})
    back = convert.hf_config(recipe, ids)
    assert (back["attention_dropout"], back["embedding_dropout"], back["mlp_dropout"]) == (0.1, 0.0, 0.0)


def test_older_config_keys_and_real_defaults():
    """A config.json as ModernBERT-base's (transformers 4.48: global/local_rope_theta and
    global_attn_every_n_layers, no layer_types) gives ModernBERT-base's fields."""
    hf = {"architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
          "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
          "num_hidden_layers": 22, "num_attention_heads": 12, "hidden_activation": "gelu",
          "global_attn_every_n_layers": 3, "local_attention": 128, "global_rope_theta": 160000.0,
          "local_rope_theta": 10000.0, "norm_eps": 1e-05, "norm_bias": False,
          "attention_bias": False, "mlp_bias": False, "classifier_bias": False,
          "decoder_bias": True, "classifier_pooling": "mean", "max_position_embeddings": 8192,
          "pad_token_id": 50283, "position_embedding_type": "absolute"}
    ours = convert.model_config_from_hf(hf)
    base = models.model_section("bert_pretraining", models.modernbert_model_fields("base"))
    # Its attention_dropout (0.0, left out here) for both attention dropouts; the pretraining
    # yaml's attn_out_dropout_prob (0.1) is not in the config.json.
    assert ours == {**base, "attention_output_dropout_rate": 0.0}


@pytest.mark.parametrize("changes,says", [
    (dict(layer_types=["sliding_attention", "full_attention"] * 2), "layer_types=['sliding_attention'"),
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention", "full_attention"]),
     "i % model.attention_global_every == 0"),
    (dict(mlp_bias=True), "mlp_bias=True but attention_bias=False, classifier_bias=False"),
    (dict(attention_bias=True, mlp_bias=True), "classifier_bias=False but attention_bias=True"),
    (dict(classifier_activation="relu"), "classifier_activation='relu' differs from hidden_activation"),
    (dict(hidden_activation="quick_gelu", classifier_activation="quick_gelu"),
     "hidden_activation='quick_gelu'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}),
     "rope_parameters.full_attention.rope_type='linear'"),
    (dict(global_rope_theta=0), "global_rope_theta=0"),
    (dict(classifier_pooling="max"), "classifier_pooling='max'"),
    (dict(type_vocab_size=2), "type_vocab_size=2, but HF's ModernBERT has no token type embeddings"),
])
def test_configs_we_cannot_express_are_refused(changes, says):
    hf = {"model_type": "modernbert", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 4, "num_attention_heads": 4, **changes}
    with pytest.raises(ValueError, match=r"^config.json: ") as e:
        convert.model_config_from_hf(hf, "bert_classification")
    assert says in str(e.value)


TINY = dict(vocab_size=64, emb_dim=32, num_layers=2, num_heads=4, head_dim=8, mlp_dim=48)


@pytest.mark.parametrize("changes,says", [
    (dict(positions="learned"), "model.positions='learned' (HF ModernBERT: 'rope')"),
    (dict(norm="post"), "model.norm='post' (HF ModernBERT: 'pre')"),
    (dict(normalization="rmsnorm"), "model.normalization='rmsnorm' (HF ModernBERT: 'layernorm')"),
    (dict(mlp_layer="mlp"), "model.mlp_layer='mlp' (HF ModernBERT: 'glu')"),
    (dict(type_vocab_size=2), "model.type_vocab_size=2 (HF ModernBERT: 0)"),
    (dict(embedding_norm=False), "model.embedding_norm=False (HF ModernBERT: True)"),
    (dict(task_head="bert"), "model.task_head='bert' (HF ModernBERT: 'modernbert')"),
    (dict(head_dim=4), "model.num_heads*head_dim=16 (HF ModernBERT: emb_dim=32)"),
])
def test_export_refuses_what_hf_modernbert_cannot_express(changes, says):
    model_cfg = models.model_section("bert_classification",
                                     {**models.modernbert_model_fields("tiny"), **TINY, **changes})
    with pytest.raises(ValueError, match=r"cannot be written as a Hugging Face ModernBERT") as e:
        convert.hf_config(model_cfg)
    assert says in str(e.value)


def test_a_trained_modern_encoder_exports_with_its_wordpiece_vocab(tmp_path):
    """Our own ModernBERT-like model (rmsnorm aside: a WordPiece vocab, every layer global) ->
    export -> transformers: the same outputs; its tokenizer.json is the WordPiece one."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "."]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    model_cfg = models.model_section("bert_tagging", {**models.modernbert_model_fields("tiny"), **TINY,
                                                      "vocab_size": len(vocab), "vocab_multiple": 8,
                                                      "attention_window": 0, "attention_global_every": 0,
                                                      "norm_bias": True}, num_labels=3)
    model = models.create_model(model_cfg, seed=3)
    from flax import nnx

    checkpoint.save_params(tmp_path / "ours", 0, nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                           {"model": model_cfg})
    tokenizer_lib.load_tokenizer(tmp_path / "vocab").save(tmp_path / "ours")
    report = export.export_hf(tmp_path / "ours", tmp_path / "back")
    assert report == {"architecture": "ModernBertForTokenClassification", "out": str(tmp_path / "back"),
                      "tensors": report["tensors"], "tokenizer": True}
    loaded, info = transformers.ModernBertForTokenClassification.from_pretrained(
        tmp_path / "back", output_loading_info=True)
    assert not any(info.values()), info
    assert loaded.config.vocab_size == 16 and set(loaded.config.layer_types) == {"full_attention"}
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    inputs = {k: np.asarray(v, np.int64) for k, v in
              tok(["the cats sat .", "the cat"], padding=True, return_tensors="np").items()
              if k in ("input_ids", "attention_mask")}
    assert inputs["input_ids"].tolist()[0] == [2, 5, 6, 8, 7, 9, 3]
    loaded.config._attn_implementation = "eager"
    ours = model(**{k: jnp.asarray(v) for k, v in inputs.items()})
    compare(run_hf(loaded, inputs), ours, {"logits": "logits"})


def test_weights_named_as_another_familys_are_refused():
    """A ModernBERT config.json over a BERT's tensors, and the reverse, name the config file."""
    from bert_jax.interop import families

    with pytest.raises(ValueError, match=r"^hf/config.json: model_type='modernbert' but the weights "
                                         r"are a BERT's \(tensor 'bert.embeddings"):
        families.get("modernbert").check_weights(["bert.embeddings.word_embeddings.weight"],
                                                 "hf/config.json")
    with pytest.raises(ValueError, match=r"model_type='bert' but the weights are a ModernBERT's"):
        families.get("bert").check_weights(["model.layers.0.attn.Wqkv.weight"], "hf/config.json")
    families.get("modernbert").check_weights(["model.layers.0.attn.Wqkv.weight"], "hf/config.json")


def test_hidden_states_and_features_end_after_the_final_norm(tokenizer_dir, hf_tokenizer, batch,
                                                            tmp_path):
    """A pre-norm model's last hidden state is after its final norm, as HF's last_hidden_state
    (and transformers 5's hidden_states[-1]); the layers before it are the residual stream as
    HF's hidden_states give them; `features --layers -1` writes the same vectors."""
    from bert_jax.interop import features

    torch.manual_seed(0)
    original = randomise(transformers.ModernBertModel(modernbert_config(hf_tokenizer)))
    original.save_pretrained(tmp_path / "hf")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hf" / f).write_text((tokenizer_dir / f).read_text("utf-8"), "utf-8")
    convert.convert_hf(tmp_path / "hf", tmp_path / "ours")
    _, model = state.load_model(tmp_path / "ours")
    with torch.no_grad():
        ref = original(**{k: torch.from_numpy(v) for k, v in batch.items()}, output_hidden_states=True)
    ours = model(**{k: jnp.asarray(v) for k, v in batch.items()}, return_hidden=True)["hidden_states"]
    assert ours.shape[0] == len(ref.hidden_states) == 5
    np.testing.assert_allclose(ours[-1], ref.last_hidden_state.numpy(), **TOL)
    for mine, theirs in zip(ours[:-1], ref.hidden_states[:-1]):
        np.testing.assert_allclose(mine, theirs.numpy(), **TOL)
    # The residual stream before the norm is far from it: the test tells the two apart.
    assert not np.allclose(ours[-1], ref.hidden_states[-2].numpy(), atol=1e-2)

    text = "The quick brown fox jumps over the lazy dog."
    (tmp_path / "in.txt").write_text(text + "\n", "utf-8")
    features.extract_features(tmp_path / "ours", tmp_path / "in.txt", tmp_path / "out.jsonl",
                              layers=(-1,), max_seq_length=32, batch_size=1)
    row = json.loads((tmp_path / "out.jsonl").read_text("utf-8").splitlines()[0])
    got = np.array([f["layers"][0]["values"] for f in row["features"]])
    enc = hf_tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        want = original(**enc).last_hidden_state[0].numpy()
    assert [f["token"] for f in row["features"]][0] == "[CLS]" and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
