"""MLM-only pretraining (RoBERTa, ModernBERT): model.nsp=False with data.instances
"packed" (documents cut into sequences, packed with per-document attention) and "full_rows"
(documents concatenated and cut into full rows), the training and evaluation masking rates,
dynamic masking, every source (text, array_record shards, TFDS) and a short training run."""

import numpy as np
import pytest
import test_pretraining_pipeline as nsp_tests
from helpers import assert_stopped_and_resumed_run_matches

from bert_jax import config as config_lib
from bert_jax.data import documents, sources
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.training import input as pipelines
from bert_jax.training import metrics, train

CONFIG = "configs/bert_pretrain.py:mlm_tiny"
KINDS = ("packed", "full_rows")
# The NSP pipeline tests' vocabulary of Emma (a module fixture) and helpers.
tokenizer_dir, take, with_data = nsp_tests.tokenizer_dir, nsp_tests.take, nsp_tests.with_data


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return tokenizer_lib.load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def text_config(shared_data, tokenizer_dir):
    """Two books and WikiText-2's articles (its `= Title =` headers make short documents)."""
    text = shared_data / "text"
    return config_lib.load(CONFIG, [
        f"data.tokenizer={tokenizer_dir}", f"data.train_files={text}/gutenberg/austen-emma.txt,"
        f"{text}/gutenberg/chesterton-ball.txt", "data.heldout_every=10", "model.vocab_size=4000",
        "train.batch_size=8", "data.shuffle_window=50"])


def originals(batch):
    """input_ids with each masked position's original id put back."""
    ids = batch["input_ids"].copy()
    for r in range(len(ids)):
        keep = batch["masked_lm_weights"][r] > 0
        ids[r, batch["masked_lm_positions"][r][keep]] = batch["masked_lm_ids"][r][keep]
    return ids


def real(batch):
    return (batch["segment_ids"] if "segment_ids" in batch else batch["attention_mask"]) > 0


def streams(config, split, tok):
    """Each document of the split as one token array (sentences joined), in split order."""
    docs, ids = pipelines.open_documents(config, split, tok)
    return [np.concatenate(docs[int(i)]) for i in ids]


def test_packed_rows_keep_documents_apart(text_config, tok):
    config = with_data(text_config, instances="packed", max_seq_length=128,
                       max_predictions_per_seq=40)
    def text(ids):
        return " " + " ".join(map(str, ids)) + " "

    whole = "|".join(text(s) for s in streams(config, "train", tok))  # "|": a document's end
    T, segments, shared_rows = 128, 0, 0
    for batch in take(pipelines.make(config, "train"), 6):
        assert set(batch) == {"input_ids", "token_type_ids", "segment_ids", "positions",
                              "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"}
        ids, seg, pos = originals(batch), batch["segment_ids"], batch["positions"]
        assert batch["input_ids"].shape == (8, T) and not batch["token_type_ids"].any()
        for r in range(len(ids)):
            n_seg = seg[r].max()
            shared_rows += n_seg > 1
            assert (np.diff(seg[r][seg[r] > 0]) >= 0).all()  # ids increase along the row
            for s in range(1, n_seg + 1):
                at = np.flatnonzero(seg[r] == s)
                assert (np.diff(at) == 1).all() and (pos[r, at] == np.arange(len(at))).all()
                piece = ids[r, at]
                assert piece[0] == tok.cls_id and piece[-1] == tok.sep_id and len(piece) <= T
                assert not np.isin(piece[1:-1], [tok.cls_id, tok.sep_id]).any()
                # Its text is one stretch of one document (never two documents' ends).
                assert text(piece[1:-1]) in whole
                segments += 1
        # Masked positions point at real tokens of the row, inside a sequence.
        w = batch["masked_lm_weights"] > 0
        rows = np.nonzero(w)[0]
        assert (seg[rows, batch["masked_lm_positions"][w]] > 0).all()
    assert segments > 48 and shared_rows > 0  # rows hold several documents' sequences


def test_full_rows_are_full_and_cross_documents(text_config, tok):
    """Evaluation rows come in order: after each [CLS], the held-out documents' tokens, each
    document closed by [SEP], cut every T - 1 tokens across the documents."""
    config = with_data(text_config, instances="full_rows")
    T = config.data.max_seq_length
    batches = list(pipelines.make(config, "validation", num_batches=12))
    rows = np.concatenate([originals(b) for b in batches])
    mask = np.concatenate([b["attention_mask"] for b in batches])
    assert mask.all()  # 12 batches do not reach the end of the held-out split
    assert (rows[:, 0] == tok.cls_id).all() and not (rows[:, 1:] == tok.cls_id).any()
    expected = np.concatenate([np.append(s, tok.sep_id) for s in streams(config, "validation", tok)])
    np.testing.assert_array_equal(rows[:, 1:].reshape(-1), expected[:rows.shape[0] * (T - 1)])
    inside = [(r[1:-1] == tok.sep_id).any() for r in rows]  # a document ends mid-row
    assert sum(inside) >= 2
    assert not any(b["token_type_ids"].any() for b in batches)


def test_the_last_full_row_of_an_evaluation_is_padded(text_config, tok):
    config = with_data(text_config, instances="full_rows", max_seq_length=256,
                       max_predictions_per_seq=77)
    batches = list(pipelines.make(config, "validation"))
    total = sum(len(s) + 1 for s in streams(config, "validation", tok))
    assert sum(int(b["attention_mask"].sum()) for b in batches) == total + -(-total // 255)
    last = batches[-1]
    assert 0 < last["example_weight"].sum() <= 8


@pytest.mark.parametrize("kind", KINDS)
def test_masking_rates_train_and_eval(text_config, kind):
    """data.masked_lm_prob (0.3) in training, data.eval_masked_lm_prob (0.15) held out,
    measured on 160 rows each; 80% of the chosen positions [MASK]."""
    config = with_data(text_config, instances=kind)
    for split, rate in (("train", 0.3), ("validation", 0.15)):
        batches = take(pipelines.make(config, split, num_batches=20), 20)
        masked = sum(b["masked_lm_weights"].sum() for b in batches)
        tokens = sum(real(b).sum() for b in batches)
        assert masked / tokens == pytest.approx(rate, abs=0.01), split
        w = np.concatenate([b["masked_lm_weights"] for b in batches]) > 0
        chosen = np.concatenate([np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)
                                 for b in batches])[w]
        assert (chosen == 4).mean() == pytest.approx(0.8, abs=0.05)  # [MASK] of this vocab
    same = with_data(config, eval_masked_lm_prob=0.0)  # 0: the training rate
    b = take(pipelines.make(same, "validation", num_batches=4), 4)
    assert sum(x["masked_lm_weights"].sum() for x in b) / sum(real(x).sum() for x in b) == \
        pytest.approx(0.3, abs=0.015)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_resume_exactly(text_config, kind):
    """The data position saved with a checkpoint resumes the exact rows (full_rows: grain's
    concat-then-split position, through the JSON the checkpoint stores)."""
    nsp_tests.assert_resumes_exactly(with_data(text_config, instances=kind))


@pytest.fixture(scope="module")
def one_document(shared_data, tmp_path_factory, tok):
    """A file holding one short real document (a few lines of a book), and its token count."""
    lines = (shared_data / "text" / "gutenberg" / "austen-emma.txt").read_text().splitlines()
    text = " ".join(lines[60:64])
    path = tmp_path_factory.mktemp("one") / "doc.txt"
    path.write_text(text + "\n")
    docs = documents.TextDocuments([str(path)], "document", tok)
    return path, sum(len(s) for s in docs[0])


@pytest.mark.parametrize("kind", KINDS)
def test_dynamic_masking_is_new_each_epoch(text_config, one_document, kind):
    """One document: every epoch gives the same rows (full_rows: T - 1 = its tokens + [SEP],
    one row an epoch), masked anew each epoch; dupe_factor=2 cycles two maskings."""
    path, n = one_document
    T = n + 2 if kind == "full_rows" else 32
    config = with_data(text_config, instances=kind, train_files=str(path), heldout_every=0,
                       text_format="document", max_seq_length=T, max_predictions_per_seq=T,
                       shuffle_window=1)
    config.train.batch_size = 1

    def sequences(config, count):
        """(original tokens, masked positions) of each packed sequence / row, in order."""
        out = []
        for b in take(pipelines.make(config, "train"), count):
            ids, seg = originals(b)[0], b.get("segment_ids", b.get("attention_mask"))[0]
            w = b["masked_lm_weights"][0] > 0
            for s in np.unique(seg[seg > 0]):
                at = np.flatnonzero(seg == s)
                pos = b["masked_lm_positions"][0][w]
                out.append((ids[at].tobytes(), tuple(pos[(pos >= at[0]) & (pos <= at[-1])] - at[0])))
        return out

    seen = sequences(config, 12)
    by_text: dict[bytes, list] = {}
    for text, masked in seen:
        by_text.setdefault(text, []).append(masked)
    assert len(by_text) < len(seen)  # the same sequences come back every epoch
    for text, masks in by_text.items():
        if len(text) >= 4 * 16:  # (a 3-token tail [CLS] x [SEP] has one maskable token)
            assert len(set(masks)) == len(masks)  # ... each time masked differently
    static = sequences(with_data(config, dupe_factor=2), 12)
    if kind == "full_rows":  # one row an epoch: epochs e and e + 2 mask alike, e + 1 not
        assert [m for _, m in static[:2]] == [m for _, m in static[2:4]]
        assert static[0][1] != static[1][1]
    static_masks = {}
    for text, masked in static:
        static_masks.setdefault(text, set()).add(masked)
    assert all(len(m) <= 2 for m in static_masks.values())


@pytest.mark.parametrize("kind", KINDS)
def test_array_record_shards_and_tfds_give_the_same_rows(text_config, kind, tmp_path, monkeypatch):
    """`bert-jax prepare` shards hold the same documents, so the same batches; TFDS records
    (the wikipedia layout through a patched tfds.data_source) build rows of the kind."""
    import tensorflow_datasets as tfds

    config = with_data(text_config, instances=kind)
    sources.prepare(config_lib.resolve(config), tmp_path / "shards", docs_per_shard=20)
    shards = with_data(config, name="array_record", train_files=str(tmp_path / "shards" / "train-*"),
                       eval_files=str(tmp_path / "shards" / "validation-*"))
    for split in ("train", "validation"):
        a = take(pipelines.make(config, split, num_batches=3), 3)
        b = take(pipelines.make(shards, split, num_batches=3), 3)
        for x, y in zip(a, b, strict=True):
            # The masking differs: it is seeded by a document's id, which counts the text's
            # held-out documents too, the shards' only their split's.
            assert x.keys() == y.keys()
            np.testing.assert_array_equal(originals(x), originals(y), err_msg=split)
            for k in set(x) - {"input_ids", "masked_lm_positions", "masked_lm_ids"}:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"{split} {k}")

    paragraphs = [" ".join(p.split()) for p in
                  open(config.data.train_files.split(",")[0]).read().split("\n\n") if len(p.split()) > 20]
    records = [{"text": "\n".join(paragraphs[i:i + 5]).encode()} for i in range(0, 200, 5)]
    monkeypatch.setattr(tfds, "data_source", lambda name, split, data_dir=None, download=True: records)
    tf_config = with_data(config, name="tfds", tfds_name="wikipedia/20230601.en")
    batch = next(pipelines.make(tf_config, "train"))
    assert batch["input_ids"].shape == (8, 64) and "next_sentence_labels" not in batch
    assert real(batch).mean() > 0.9


def train_tiny(config, workdir):
    """Trains a 1-layer model of config 4 steps with an evaluation at the end: (metrics lines,
    summary), checked to hold masked-LM terms only."""
    config.model.update(num_layers=1, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64)
    config.train.update(steps=4, eval_every=4, eval_steps=2, log_every=1, checkpoint_every=4)
    config.schedule.warmup_steps = 1
    config_lib.validate(config, 8)
    summary = train.train_and_evaluate(config, str(workdir))
    rows = [r for r in metrics.read_metrics(workdir / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["loss"] == pytest.approx(r["masked_lm_loss"]) for r in rows)
    assert not any("next_sentence" in k for r in rows for k in r)
    assert set(summary["eval"]) == {"eval/loss", "eval/masked_lm_loss", "eval/masked_lm_accuracy"}
    assert 0 <= summary["eval"]["eval/masked_lm_accuracy"] < 1
    assert summary["eval"]["eval/masked_lm_loss"] < np.log(4000) + 1  # finite, about uniform
    return rows, summary


def test_mlm_only_training_on_full_rows_with_eval(text_config, tmp_path):
    """A tiny MLM-only model trains a few steps and evaluates: masked-LM loss and accuracy
    only, no next-sentence term."""
    train_tiny(with_data(text_config, instances="full_rows", max_seq_length=32,
                         max_predictions_per_seq=10), tmp_path)


@pytest.mark.slow  # two compiles, one a phase
def test_mlm_only_training_packed_over_two_length_phases(text_config, tmp_path, caplog):
    config = with_data(text_config, instances="packed", max_seq_length=32,
                       max_predictions_per_seq=10, phases=((0, 32, 10), (2, 64, 20)))
    with caplog.at_level("INFO", logger="bert_jax.training.train"):
        train_tiny(config, tmp_path)
    assert "phase 1 from step 2: batch 8 x 64 tokens" in caplog.text


def test_the_model_has_no_nsp_head_or_pooler():
    from flax import nnx

    from bert_jax import models

    # The modules and the outputs' names and shapes, traced (nothing to compute for them).
    cfg = config_lib.load(CONFIG, ["model.num_layers=1", "model.emb_dim=32", "model.num_heads=2",
                                   "model.head_dim=16", "model.mlp_dim=64", "model.vocab_size=64"])
    model = models.abstract_model(config_lib.model_config(cfg))
    assert model.nsp is None and model.bert.pooler is None
    ids = np.full((2, 8), 5, np.int32)
    out = nnx.eval_shape(lambda m: m(ids, masked_positions=np.zeros((2, 3), np.int32)), model)
    assert set(out) == {"mlm_logits"} and out["mlm_logits"].shape == (2, 3, 64)
    cfg.model.nsp = True
    with_nsp = models.abstract_model(config_lib.model_config(cfg))
    assert with_nsp.nsp is not None and with_nsp.bert.pooler is not None
    assert set(nnx.eval_shape(lambda m: m(ids), with_nsp)) == {"mlm_logits", "nsp_logits"}


@pytest.mark.slow  # three short runs
def test_full_rows_run_resumes_exactly(text_config, tmp_path):
    """Stopped at step 3 and resumed, a full_rows run (its concat-then-split position restored
    from the checkpoint's JSON) logs the losses of the run that went straight through."""
    def config(steps):
        c = with_data(text_config, instances="full_rows", max_seq_length=32,
                      max_predictions_per_seq=10, shuffle_window=5)
        c.model.update(num_layers=1, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64)
        c.train.steps = steps
        c.schedule.update(name="constant", warmup_steps=0)
        return c

    assert_stopped_and_resumed_run_matches(config, tmp_path)


@pytest.mark.slow  # three short runs
def test_modernbert_run_resumes_exactly(shared_data, tokenizer_dir, tmp_path):
    """The ModernBERT recipe (packed documents, 30% masking, StableAdamW, rope, local and
    global layers), stopped at step 3 and resumed, logs the losses of the run that went
    straight through (docs/modernbert.md)."""
    book = shared_data / "text" / "gutenberg" / "austen-emma.txt"

    def config(steps):
        c = config_lib.load("configs/modernbert.py:tiny", [
            f"data.tokenizer={tokenizer_dir}", f"data.train_files={book}", "data.heldout_every=10",
            "model.vocab_size=4000", "train.batch_size=8", "data.shuffle_window=5",
            "data.max_seq_length=32", "data.max_predictions_per_seq=10", "model.attention_window=8"])
        c.train.steps = steps
        c.schedule.update(name="constant", warmup_steps=0)  # the same lr whatever train.steps
        return c

    assert_stopped_and_resumed_run_matches(config, tmp_path)
