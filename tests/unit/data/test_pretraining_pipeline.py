"""The grain pretraining pipeline on real text: determinism, exact resume, host shares,
eval padding, sequence-length phases, and a short pretraining whose MLM loss falls."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config as config_lib
from bert_jax import models
from bert_jax.data import documents, pretraining, sources
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.training import input as pipelines
from bert_jax.training import metrics, objectives, train

CONFIG = "configs/bert_pretrain.py:tiny"


@pytest.fixture(scope="module")
def tokenizer_dir(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab")
    lines = (shared_data / "text" / "gutenberg" / "austen-emma.txt").read_text().splitlines()
    tokenizer_lib.train_vocab(lines, size=4000, kind="wordpiece", out_dir=out)
    return out


BOOKS = ("austen-emma.txt", "chesterton-ball.txt")
HEAD = 4000  # lines of each book the pipeline tests read: 112 documents, a tenth held out


def _config(tokenizer_dir, books):
    return config_lib.load(CONFIG, [
        f"data.tokenizer={tokenizer_dir}", f"data.train_files={books[0]},{books[1]}",
        "data.heldout_every=10", "data.max_seq_length=64", "data.max_predictions_per_seq=10",
        "model.vocab_size=4000", "train.batch_size=8", "data.shuffle_window=50"])


@pytest.fixture(scope="module")
def text_config(shared_data, tokenizer_dir, tmp_path_factory):
    """The two books' first HEAD lines, as they are (each make() tokenizes its files anew: the
    whole books cost most of these tests' time and test nothing more)."""
    out = tmp_path_factory.mktemp("books")
    for name in BOOKS:
        with open(shared_data / "text" / "gutenberg" / name, "rb") as f:
            (out / name).write_bytes(b"".join(f.readline() for _ in range(HEAD)))
    return _config(tokenizer_dir, [out / name for name in BOOKS])


@pytest.fixture(scope="module")
def book_config(shared_data, tokenizer_dir):
    """The two whole books, for the training runs."""
    return _config(tokenizer_dir, [shared_data / "text" / "gutenberg" / name for name in BOOKS])


def take(pipeline, n):
    return [next(pipeline) for _ in range(n)]


def assert_same(batches_a, batches_b):
    for a, b in zip(batches_a, batches_b, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def with_data(config, **fields):
    """A copy of config with config.data fields changed."""
    config = config.copy_and_resolve_references()
    config.data.update(fields)
    return config


@pytest.mark.parametrize("pack", [False, True])
def test_same_seed_same_examples_and_exact_resume(text_config, pack):
    text_config = with_data(text_config, pack=pack)
    first = take(pipelines.make(text_config, "train"), 6)
    again = pipelines.make(text_config, "train")
    assert_same(first, take(again, 6))
    other = text_config.copy_and_resolve_references()
    other.seed = 1
    assert not np.array_equal(take(pipelines.make(other, "train"), 1)[0]["input_ids"],
                              first[0]["input_ids"])
    assert_resumes_exactly(text_config)


def assert_resumes_exactly(config):
    """Resumed mid-stream from a JSON round trip of its state (as the checkpoint stores it),
    the training pipeline gives the batches it would have given."""
    p = pipelines.make(config, "train")
    take(p, 3)
    state = json.loads(json.dumps(p.get_state()))
    expected = take(p, 4)
    resumed = pipelines.make(config, "train")
    resumed.set_state(state)
    assert_same(expected, take(resumed, 4))


@pytest.mark.parametrize("pack", [False, True])
def test_a_position_of_the_other_layout_is_refused_naming_the_change(text_config, pack):
    """A resume that switches data.pack: the saved position (other pipeline stages, other state
    keys) does not fit, refused in one line naming the changed key and the stored config."""
    saved = pipelines.make(with_data(text_config, pack=pack), "train")
    take(saved, 1)
    position = {"phase": 0, "pipeline": json.loads(json.dumps(saved.get_state())),
                "checkpoint": "w/checkpoints/4",
                "changes": f"data.pack: {pack} in the checkpoint, {not pack} here"}
    with pytest.raises(config_lib.ConfigError) as e:
        train._set_position(pipelines.make(with_data(text_config, pack=not pack), "train"), position)
    said = str(e.value)
    assert said.startswith("checkpoint w/checkpoints/4: its data position does not fit this config's "
                           f"data pipeline (data changed: data.pack: {pack} in the checkpoint, "
                           f"{not pack} here; KeyError: "), said
    assert said.endswith("resume with the stored config (w/checkpoints/4/config), or train in a new "
                         "--workdir (--config.init_from may start it from this run's weights)"), said


def test_batches_are_well_formed(text_config):
    b = take(pipelines.make(text_config, "train"), 1)[0]
    assert b["input_ids"].shape == (8, 64) and b["masked_lm_ids"].shape == (8, 10)
    assert set(np.unique(b["next_sentence_labels"])) <= {0, 1}
    lengths = b["attention_mask"].sum(1)
    assert (b["input_ids"][np.arange(8), lengths - 1] == 3).all()  # ends in [SEP]
    assert (b["input_ids"][:, 0] == 2).all()  # [CLS]


def test_two_hosts_get_disjoint_complete_shares(text_config):
    def rows(pipeline):
        out = set()
        for batch in pipeline:
            for ids, w in zip(batch["input_ids"], batch["example_weight"], strict=True):
                if w:
                    out.add(ids.tobytes())
        return out

    tokenizer = tokenizer_lib.load_tokenizer(text_config.data.tokenizer)
    docs, ids = pipelines.open_documents(text_config, "validation", tokenizer)
    n_batches = len(list(pipelines.make(text_config, "validation")))  # batches of 8
    # Each host: batches of 4, all hosts the same number (padding once a host runs out).
    shares = [pipelines.PretrainingPipeline(docs, ids, tokenizer, text_config.data.to_dict(),
                                            seed=0, batch_size=4, train=False, process_index=i,
                                            process_count=2, num_batches=2 * n_batches)
              for i in range(2)]
    host0, host1 = rows(shares[0]), rows(shares[1])
    single = rows(pipelines.make(text_config, "validation"))
    assert host0 and host1 and not host0 & host1
    assert host0 | host1 == single


def test_eval_pads_the_last_batch(text_config):
    batches = list(pipelines.make(text_config, "validation"))
    assert all(b["input_ids"].shape == (8, 64) for b in batches)
    weights = np.concatenate([b["example_weight"] for b in batches])
    assert weights[:-8].all() and weights.sum() >= 1
    assert weights.sum() < len(weights) or weights.all()


def instances(batches, outputs=None, *, cls_id=2):
    """Every instance of the batches, as (token ids, token types, masked positions within
    the instance, masked ids, NSP label) bytes, sorted; checks the packed rows' layout. With
    the model's `outputs` per batch: {instance: (its MLM logits, its NSP logits)}."""
    out, logits = [], {}
    for i, b in enumerate(batches):
        for r in range(len(b["input_ids"])):
            if not b.get("example_weight", np.ones(len(b["input_ids"])))[r]:
                continue
            row = {k: v[r] for k, v in b.items()}
            if "positions" not in row:
                row |= {"positions": np.arange(len(row["input_ids"])),
                        "next_sentence_positions": np.zeros(1, int),
                        "next_sentence_labels": row["next_sentence_labels"][None],
                        "next_sentence_weights": np.ones(1)}
            for slot, (start, label, w) in enumerate(zip(
                    row["next_sentence_positions"], row["next_sentence_labels"],
                    row["next_sentence_weights"], strict=True)):
                if not w:
                    continue
                seq = row["segment_ids"] if "segment_ids" in row else row["attention_mask"]
                at = np.flatnonzero(seq == seq[start])
                assert seq[start] > 0 and row["input_ids"][start] == cls_id
                np.testing.assert_array_equal(at, start + np.arange(len(at)))  # contiguous
                np.testing.assert_array_equal(row["positions"][at], np.arange(len(at)))
                mine = (row["masked_lm_weights"] > 0) & (row["masked_lm_positions"] >= start) & (
                    row["masked_lm_positions"] < start + len(at))
                out.append(b"|".join(x.astype(np.int64).tobytes() for x in (
                    row["input_ids"][at], row["token_type_ids"][at],
                    row["masked_lm_positions"][mine] - start, row["masked_lm_ids"][mine],
                    np.array([label]))))
                if outputs is not None:
                    nsp = outputs[i]["nsp_logits"][r]
                    logits[out[-1]] = (outputs[i]["mlm_logits"][r][mine],
                                       nsp[slot] if nsp.ndim == 2 else nsp)
    return logits if outputs is not None else sorted(out)


@pytest.fixture(scope="module")
def long_rows(text_config):
    """Rows of 256 tokens: many instances are short of that (a document's end, short targets)."""
    return with_data(text_config, max_seq_length=256, max_predictions_per_seq=40)


def test_packed_rows_hold_every_instance_once_intact(long_rows):
    plain = list(pipelines.make(long_rows, "validation"))
    packed = list(pipelines.make(with_data(long_rows, pack=True), "validation"))
    assert instances(packed) == instances(plain)
    rows = lambda batches: sum(int(b.get("example_weight", np.ones(8)).sum()) for b in batches)  # noqa: E731
    assert rows(packed) < rows(plain)  # short instances share rows
    b = packed[0]
    S = long_rows.data.max_instances_per_row
    assert b["next_sentence_labels"].shape == (8, S) and b["positions"].shape == (8, 256)
    assert (b["next_sentence_weights"].sum(1) >= 1).all()
    assert (b["masked_lm_weights"].sum(1) <= 40).all()


@pytest.mark.slow
def test_packed_instances_give_the_same_outputs_and_loss_terms(long_rows):
    """Each instance's MLM and NSP logits, and the summed loss terms, are the same packed or
    one per row: an instance sees only itself, at its own positions, NSP read at its [CLS]."""
    config = with_data(long_rows)
    config.model.update(num_layers=2, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64)
    model = models.create_model(config_lib.model_config(config))
    objective = objectives.for_config(config)
    # The outputs and the loss terms, compiled once per batch layout (plain, packed) rather
    # than run op by op.
    outputs_and_terms = nnx.jit(lambda m, b: (objective.forward(m, b, None), objective(m, b, None)[0]))

    def run(cfg):
        batches, outputs, sums = list(pipelines.make(cfg, "validation")), [], {}
        for b in batches:
            b = {k: jnp.asarray(v) for k, v in b.items()}
            out, terms = outputs_and_terms(model, b)
            outputs.append({k: np.asarray(v) for k, v in out.items()})
            for k, v in {**terms, **{f"n_{k}": w for k, w in objective.weights(b).items()}}.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        return instances(batches, outputs), sums

    (plain, plain_sums), (packed, packed_sums) = run(config), run(with_data(config, pack=True))
    assert plain.keys() == packed.keys()
    for key, (mlm, nsp) in plain.items():
        np.testing.assert_allclose(packed[key][0], mlm, atol=2e-5)
        np.testing.assert_allclose(packed[key][1], nsp, atol=2e-5)
    assert plain_sums.keys() == packed_sums.keys()
    for k, v in plain_sums.items():
        assert packed_sums[k] == pytest.approx(v, rel=1e-5), k


@pytest.mark.slow
def test_packed_pretraining_trains_with_accumulation(book_config, tmp_path):
    config = with_data(book_config, pack=True, max_seq_length=128, max_predictions_per_seq=20)
    config.train.steps, config.train.eval_every, config.train.log_every = 4, 4, 1
    config.train.grad_accum_steps, config.schedule.warmup_steps = 2, 1
    config.train.batch_size = 16
    summary = train.train_and_evaluate(config, str(tmp_path))
    rows = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in rows)
    assert 0 < summary["eval"]["eval/next_sentence_accuracy"] < 1


def test_synthetic_data_refuses_packing():
    config = config_lib.load(CONFIG, ["data.name=synthetic", "data.pack=true"])
    with pytest.raises(config_lib.ConfigError, match="data.pack"):
        pipelines.make(config, "train")


@pytest.mark.slow
def test_phases_switch_length_and_resume_exactly(tmp_path):
    args = ["data.name=synthetic", "model.vocab_size=256", "train.batch_size=8",
            "train.log_every=1", "schedule.name=constant", "schedule.warmup_steps=0",
            "data.phases=((0, 32, 5), (5, 64, 10))", "train.checkpoint_every=3"]
    full = config_lib.load(CONFIG, args + ["train.steps=9"])
    train.train_and_evaluate(full, str(tmp_path / "full"))
    part = config_lib.load(CONFIG, args + ["train.steps=6"])  # stops in phase 1
    train.train_and_evaluate(part, str(tmp_path / "part"))
    train.train_and_evaluate(full, str(tmp_path / "part"))  # resumes at 6, in phase 1
    a = {r["step"]: r["loss"] for r in metrics.read_metrics(tmp_path / "full" / "metrics.jsonl")
         if "loss" in r}
    b = {r["step"]: r["loss"] for r in metrics.read_metrics(tmp_path / "part" / "metrics.jsonl")
         if "loss" in r}
    assert a == b and len(a) == 9


@pytest.mark.slow
def test_short_pretraining_on_real_text_lowers_mlm_loss(book_config, tmp_path):
    config = book_config.copy_and_resolve_references()
    config.train.steps, config.train.eval_every, config.train.log_every = 60, 60, 10
    config.schedule.warmup_steps, config.train.batch_size = 10, 16
    summary = train.train_and_evaluate(config, str(tmp_path))
    rows = [r for r in metrics.read_metrics(tmp_path / "metrics.jsonl") if "masked_lm_loss" in r]
    assert rows[-1]["masked_lm_loss"] < rows[0]["masked_lm_loss"] - 1.0
    assert summary["eval"]["eval/masked_lm_loss"] < rows[0]["masked_lm_loss"] - 1.0
    assert jax.device_count() == 8  # ran on the simulated 8-device mesh


def test_prepare_writes_shards_the_pipeline_reads(text_config, tmp_path):
    counts = sources.prepare(config_lib.resolve(text_config), tmp_path / "shards", docs_per_shard=20)
    train_docs, train_ids = pipelines.open_documents(text_config, "train", tokenizer_lib.load_tokenizer(
        text_config.data.tokenizer))
    assert counts["train"] == len(train_ids) and counts["validation"] > 0
    config = text_config.copy_and_resolve_references()
    config.data.name = "array_record"
    config.data.train_files = str(tmp_path / "shards" / "train-*")
    config.data.eval_files = str(tmp_path / "shards" / "validation-*")
    shards = documents.ArrayRecordDocuments(documents.expand(config.data.train_files))
    # Same documents, same order, same token ids as reading the text directly.
    for i in (0, 7, counts["train"] - 1):
        assert [s.tolist() for s in shards[i]] == [s.tolist() for s in train_docs[int(train_ids[i])]]
    batch = next(pipelines.make(config, "train"))
    assert batch["input_ids"].shape == (8, 64)
    with pytest.raises(FileExistsError):
        sources.prepare(config_lib.resolve(text_config), tmp_path / "shards")


def test_tfds_source_through_data_source(text_config, shared_data, monkeypatch):
    """data.name=tfds reads records' `text` through tfds.data_source (no real TFDS data offline:
    a list of records in the wikipedia builder's layout stands in for the array_record source)."""
    import tensorflow_datasets as tfds  # only this test needs it (and only to patch it)

    book = (shared_data / "text" / "gutenberg" / "austen-emma.txt").read_text()
    paragraphs = [" ".join(p.split()) for p in book.split("\n\n") if len(p.split()) > 20][:200]
    records = [{"title": f"doc {i}", "text": "\n".join(paragraphs[i:i + 5]).encode()}
               for i in range(0, 200, 5)]
    calls = []

    def data_source(name, split, data_dir=None, download=True):
        calls.append((name, split, data_dir, download))
        return records

    monkeypatch.setattr(tfds, "data_source", data_source)
    config = text_config.copy_and_resolve_references()
    config.data.name, config.data.tfds_name = "tfds", "wikipedia/20230601.en"
    tok = tokenizer_lib.load_tokenizer(config.data.tokenizer)
    docs, ids = pipelines.open_documents(config, "train", tok)
    assert calls == [("wikipedia/20230601.en", "train", None, False)]  # never downloads
    assert len(docs) == 40 and len(ids) == 36  # every 10th document held out
    sentences = [s for p in paragraphs[:5] for s in pretraining.split_sentences(p)]
    assert [s.tolist() for s in docs[0]] == [tok.encode(s).tolist() for s in sentences]
    batch = next(pipelines.make(config, "train"))
    assert batch["input_ids"].shape == (8, 64) and (batch["input_ids"][:, 0] == tok.cls_id).all()
