"""A sentence-embedding model trained through the command line (configs/embeddings.py: the
pairs task, the contrastive objectives), evaluated by its retrieval or STS metrics, and
exported to a sentence-transformers folder that encodes as our checkpoint does."""

import json
import random

import numpy as np
import pytest
from helpers import REPO, assert_stopped_and_resumed_run_matches

from bert_jax import config as config_lib
from bert_jax import tasks
from bert_jax.interop import sentence_models
from bert_jax.tasks import pairs, retrieval
from bert_jax.training import input as input_lib

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed "
                         "(pyproject's [test] extras)")


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory, shared_data):
    """From the real STS-B files: close pairs (score >= 4) as query and positive, with another
    pair's sentence as a hard negative (train); dev as retrieval pairs and as scored pairs."""
    out = tmp_path_factory.mktemp("pairs")
    s1, s2, score = retrieval.read_sts(shared_data / "glue" / "STS-B" / "train.tsv")
    close = [(a, b) for a, b, s in zip(s1, s2, score) if s >= 4]
    rng = random.Random(0)
    for name, part in (("train.jsonl", close[:96]), ("train2.jsonl", close[96:136])):
        with open(out / name, "w") as f:  # train2: a second dataset (training on several)
            for a, b in part:
                f.write(json.dumps({"anchor": a, "positive": b,
                                    "negatives": [rng.choice(part)[1]]}) + "\n")
    d1, d2, dscore = retrieval.read_sts(shared_data / "glue" / "STS-B" / "dev.tsv")
    with open(out / "dev.tsv", "w") as f:
        f.write("query\tpositive\n")
        f.writelines(f"{a}\t{b}\n" for a, b, s in zip(d1, d2, dscore) if s >= 4)
    with open(out / "sts_dev.jsonl", "w") as f:
        f.writelines(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
                     for a, b, s in list(zip(d1, d2, dscore))[:64])
    return out


def _train(cli, workdir, vocab, files, *args):
    return cli(["train", "--config", "configs/embeddings.py:contrastive,tiny", f"--workdir={workdir}",
                f"--config.data.tokenizer={vocab.parent}", f"--config.data.data_dir={files}",
                "--config.data.train_file=train.jsonl", "--config.data.dev_file=dev.tsv",
                "--config.model.vocab_size=1500", "--config.model.num_layers=1",
                "--config.data.max_seq_length=32", "--config.train.batch_size=16",
                "--config.train.steps=4", "--config.train.checkpoint_every=4", *args])


def test_contrastive_training_evaluates_retrieval_and_exports_a_sentence_transformers_folder(
        cli, tmp_path, wordpiece_vocab, pair_files):
    code, out, err = _train(cli, tmp_path / "run", wordpiece_vocab, pair_files,
                            "--config.data.num_negatives=1", "--config.train.grad_accum_steps=2")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    n_dev = len(pairs.read_pairs(pair_files / "dev.tsv"))
    assert n_dev > 100
    for key in ("eval/ndcg@10", "eval/mrr@10", "eval/recall@100", "eval/map@100", "eval/loss"):
        assert np.isfinite(summary["eval"][key]), key
    assert 0 < summary["eval"]["eval/ndcg@10"] <= 1
    assert summary["metrics"]["similarity_scale"] == 20.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("contrastive_accuracy" in r for r in rows)

    # The scored dev file: STS metrics, spearman_cosine the main one.
    code, out, err = cli(["eval", "--config", "configs/embeddings.py:contrastive,tiny",
                          f"--workdir={tmp_path / 'run'}", "--step=latest",
                          f"--split={pair_files / 'sts_dev.jsonl'}"])
    assert code == 0, err
    assert "spearman_cosine" in out and "pearson_cosine" in out, out

    # Exported: sentence-transformers loads the folder and encodes as our checkpoint does.
    code, _, err = cli(["export", str(tmp_path / "run"), f"st:{tmp_path / 'st'}"])
    assert code == 0, err
    texts = [line.split("\t")[0] for line in (pair_files / "dev.tsv").read_text().splitlines()[1:21]]
    ours = sentence_models.embed(tmp_path / "run", texts)
    theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    cos = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cos.min() >= 0.99999, cos.min()

    # Hard negatives mined with the trained model: each query's nearest non-positive documents.
    mined = tmp_path / "mined.jsonl"
    code, out, err = cli(["mine", f"--checkpoint={tmp_path / 'run'}",
                          f"--input={pair_files / 'dev.tsv'}", f"--output={mined}", "--negatives=2"])
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"rows": n_dev, "output": str(mined), "negatives": 2}
    rows = pairs.read_pairs(mined, num_negatives=2)
    docs = list(dict.fromkeys(r.positive for r in rows))
    positives = {}
    for r in rows:
        positives.setdefault(r.query, set()).add(r.positive)
    q = sentence_models.embed(tmp_path / "run", [r.query for r in rows[:10]])
    d = sentence_models.embed(tmp_path / "run", docs)
    for r, scores in zip(rows, q @ d.T):  # (normalised vectors: dot = cosine)
        nearest = [docs[i] for i in np.argsort(-scores)
                   if docs[i] not in positives[r.query] and docs[i] != r.query]
        assert r.negatives == tuple(nearest[:2])
    code, _, err = cli(["mine", f"--checkpoint={tmp_path / 'run'}",
                        f"--input={pair_files / 'dev.tsv'}", f"--output={mined}"])
    assert code != 0 and "already exists" in err


def test_several_training_files_give_each_batch_from_one_of_them(cli, tmp_path, wordpiece_vocab,
                                                                pair_files):
    """data.train_file naming two files: a batch's queries all come from one of them (in turn
    with mix=round_robin), and the run trains, logs and evaluates as with one."""
    files = ["train.jsonl", "train2.jsonl"]
    overrides = [f"data.tokenizer={wordpiece_vocab.parent}", f"data.data_dir={pair_files}",
                 f"data.train_file={','.join(files)}", "data.dev_file=dev.tsv",
                 "data.num_negatives=1", "data.mix=round_robin", "model.vocab_size=1500",
                 "model.num_layers=1", "data.max_seq_length=32", "train.batch_size=16"]
    spec = config_lib.resolve(config_lib.load(f"{REPO}/configs/embeddings.py:contrastive,tiny",
                                              overrides))
    task = tasks.from_config(spec)
    queries = [{e.query for e in pairs.read_pairs(pair_files / f, num_negatives=1)} for f in files]
    assert task.train_datasets() == ((96, 40), "round_robin")
    batches = input_lib.make(spec, "train", task=task)
    ids = task.tokenizer.encode_batch([q for part in queries for q in part])
    known = {tuple(i): d for d, part in enumerate(queries) for i in ids[:len(part)] if d == 0} | {
        tuple(i): 1 for i in ids[len(queries[0]):]}
    for expected in (0, 1, 0, 1):
        rows = next(batches)["query_input_ids"]
        lengths = (rows != 0).sum(-1)  # [CLS] ids [SEP], padded with 0
        assert {known[tuple(r[1:n - 1])] for r, n in zip(rows, lengths)} == {expected}

    code, out, err = _train(cli, tmp_path / "run", wordpiece_vocab, pair_files,
                            "--config.data.num_negatives=1", "--config.train.grad_accum_steps=2",
                            f"--config.data.train_file={','.join(files)}")
    assert code == 0, err
    assert 0 < json.loads(out.strip().splitlines()[-1])["eval"]["eval/ndcg@10"] <= 1
    # Resumed with another mix: it trains on, and says its batches are not the stored stream's.
    code, out, err = _train(cli, tmp_path / "run", wordpiece_vocab, pair_files,
                            "--config.data.num_negatives=1", "--config.train.grad_accum_steps=2",
                            f"--config.data.train_file={','.join(files)}", "--config.train.steps=5",
                            "--config.data.mix=round_robin", "--config.data.dev_file=train2.jsonl")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["step"] == 5
    assert (f"resuming {tmp_path / 'run'}/checkpoints/4 with other training data (data.mix: "
            f"'proportional' in the checkpoint, 'round_robin' here): the batches") in err, err
    assert "data.dev_file" not in err  # what is evaluated is not the training stream

    code, _, err = _train(cli, tmp_path / "bad", wordpiece_vocab, pair_files,
                          "--config.data.train_file=train.jsonl,,train2.jsonl")
    assert code != 0 and "an empty name between commas" in err, err
    code, _, err = _train(cli, tmp_path / "bad2", wordpiece_vocab, pair_files,
                          f"--config.data.train_file={','.join(files)}", "--config.data.mix=shuffle")
    assert code != 0 and "data.mix='shuffle'; choose one of ['proportional', 'round_robin']" in err, err
    code, _, err = _train(cli, tmp_path / "bad3", wordpiece_vocab, pair_files,
                          f"--config.data.train_file={','.join(files)}", "--config.data.pack=true")
    assert code != 0 and "names 2 files, which are batched unpacked: set --config.data.pack=false" in err, err
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_a_beir_folder_trains_as_its_qrels_pairs(tmp_path, wordpiece_vocab, pair_files):
    """A BEIR folder (or one of its qrels files) as a training file: each query with each of
    its relevant documents (score > 0; ids the corpus lacks left out), beside a pair file."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    corpus = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(
        ["A man plays a guitar.", "A dog runs.", "Two kids swim in a lake."])]
    queries = [{"_id": "q1", "text": "who plays music?"}, {"_id": "q2", "text": "an animal"}]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (beir / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (beir / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq2\td1\t1\nq1\td2\t0\nq1\td0\t2\nq1\tgone\t1\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")

    def task(train_file, *more):
        return tasks.from_config(config_lib.resolve(config_lib.load(
            f"{REPO}/configs/embeddings.py:contrastive,tiny",
            [f"data.tokenizer={wordpiece_vocab.parent}", f"data.data_dir={pair_files}",
             f"data.train_file={train_file}", "data.dev_file=dev.tsv", "model.vocab_size=1500",
             *more])))

    got = [(e.query, e.positive, e.negatives, e.score) for e in task(beir).examples("train")]
    assert got == [("an animal", "A dog runs.", (), None),
                   ("who plays music?", "A man plays a guitar.", (), None)]
    [one] = task(beir / "qrels" / "test.tsv").examples("train")
    assert (one.query, one.positive) == ("who plays music?", "A man plays a guitar.")
    mixed = task(f"{beir},train.jsonl")
    assert mixed.train_datasets() == ((2, 96), "proportional")

    with pytest.raises(pairs.PairsFormatError, match="a BEIR folder has no hard negatives"):
        task(beir, "data.num_negatives=1").examples("train")
    with pytest.raises(FileNotFoundError, match=r"without .*qrels/train.tsv \(its qrels: \['test'\]\)"):
        (beir / "qrels" / "train.tsv").unlink()
        task(beir).examples("train")
    with pytest.raises(config_lib.ConfigError, match="eval-embeddings --beir"):
        task("train.jsonl", f"data.dev_file={beir}").examples("dev")


def test_pair_files_refuse_bad_rows_naming_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "a", "positive": "b"}\n{"query": "c"}\n')
    with pytest.raises(pairs.PairsFormatError, match=r"bad.jsonl:2: field 'positive': found None, "
                                                     r"expected a non-empty string"):
        pairs.read_pairs(bad)
    bad.write_text('{"query": "a", "positive": "b", "negatives": ["x"]}\n')
    with pytest.raises(pairs.PairsFormatError, match=r"bad.jsonl:1: negatives: found '1', expected "
                                                     r"at least data.num_negatives=2"):
        pairs.read_pairs(bad, num_negatives=2)
    bad.write_text('{"query": "a", "positive": "b", "score": 1}\n{"query": "a", "positive": "c"}\n')
    with pytest.raises(pairs.PairsFormatError, match="some rows have a score and some not"):
        pairs.read_pairs(bad)
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("a\tb\nx\ty\n")
    with pytest.raises(pairs.PairsFormatError, match=r"bad.tsv:1: header \['a', 'b'\]: expected a header"):
        pairs.read_pairs(tsv)
    # pandas' to_csv(sep="\t"): an unnamed index column; every row is kept, every negative read
    tsv.write_text("\tquery\tpositive\n0\tqa\tpa\n1\tqb\tpb\n2\tqc\tpc\n")
    assert [e.query for e in pairs.read_pairs(tsv)] == ["qa", "qb", "qc"]
    bad.write_text('{"query": "a", "positive": "b", "negatives": ["x", "y"]}\n')
    assert pairs.read_pairs(bad)[0].negatives == ("x", "y")
    tsv.write_text("query\tpositive\tscore\nx\ty\tlots\n")
    with pytest.raises(pairs.PairsFormatError, match=r"bad.tsv:2: field 'score': found 'lots'"):
        pairs.read_pairs(tsv)


def test_the_data_beside_the_repo_reads_as_pairs(shared_data):
    """STS-B as scored pairs, MRPC's paraphrases as queries with positives, SQuAD's questions
    with their paragraphs (dev: 2,067 distinct paragraphs, the retrieval corpus)."""
    sts = pairs.read_pairs(shared_data / "glue" / "STS-B" / "dev.tsv")
    assert len(sts) == 1500 and sts[0].score == 5.0
    mrpc = pairs.read_pairs(shared_data / "glue" / "MRPC" / "dev.tsv")
    lines = (shared_data / "glue" / "MRPC" / "dev.tsv").read_text("utf-8-sig").splitlines()[1:]
    assert len(mrpc) == sum(line.startswith("1\t") for line in lines) == 279
    assert mrpc[0].score is None and mrpc[0].positive == lines[0].split("\t")[4]
    squad = pairs.read_pairs(shared_data / "squad" / "dev-v1.1.json")
    assert len(squad) == 10570 and len({e.positive for e in squad}) == 2067


@pytest.mark.slow  # three short runs
def test_a_contrastive_run_with_gradcache_resumes_exactly(tmp_path, wordpiece_vocab, pair_files):
    """Hard negatives, GradCache in 2 chunks: stopped at step 3 and resumed, the run logs the
    losses of the run that went straight through (the pairs' order restored)."""
    def config(steps):
        c = config_lib.load(f"{REPO}/configs/embeddings.py:contrastive,tiny", [
            f"data.tokenizer={wordpiece_vocab.parent}", f"data.data_dir={pair_files}",
            "data.train_file=train.jsonl", "data.dev_file=dev.tsv", "data.num_negatives=1",
            "model.vocab_size=1500", "model.num_layers=1", "data.max_seq_length=32",
            "train.batch_size=16", "train.grad_accum_steps=2"])
        c.train.update(steps=steps, epochs=0.0)
        c.schedule.update(name="constant", warmup_steps=0, warmup_fraction=0.0)
        return c

    assert_stopped_and_resumed_run_matches(config, tmp_path)

