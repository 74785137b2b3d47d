"""Embedding evaluation in plain numpy: STS (Pearson and Spearman of the pairs' cosine against
gold scores) and retrieval over a corpus (accuracy, precision, recall, MRR, nDCG and MAP at k),
each with a seeded percentile-bootstrap confidence interval, plus the readers of their data:
the GLUE STS-B tsv, a BEIR folder and SQuAD (a question retrieves its paragraph).

The values are those of sentence-transformers' EmbeddingSimilarityEvaluator and
InformationRetrievalEvaluator on the same embeddings (tests check to 1e-4): cosine in float32,
a query's hits ordered by (-score, corpus id) and cut at the largest k, binary relevance; only
queries with at least one relevant document count, and a relevant id absent from the corpus
still counts in recall's and nDCG's denominators, as there.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bert_jax import paths
from bert_jax.config import MissingExtra
from bert_jax.data.rows import open_text
from bert_jax.tasks import glue, scoring, squad

log = logging.getLogger(__name__)

# InformationRetrievalEvaluator's defaults, with recall also at 100 (the table).
ACCURACY_AT = (1, 3, 5, 10)
RECALL_AT = (1, 3, 5, 10, 100)
MRR_AT, NDCG_AT, MAP_AT = (10,), (10,), (100,)
RANK_DEPTH = max(ACCURACY_AT + RECALL_AT + MRR_AT + NDCG_AT + MAP_AT)  # documents ranked per query


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows over max(norm, 1e-12), in float32: torch.nn.functional.normalize as cos_sim uses it."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.float32(1e-12))


def _check_rows(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"{what}: embeddings of shapes {a.shape} and {b.shape}; expected [N, D] "
                         "and [M, D] with the same D")


def pair_cosines(emb1: np.ndarray, emb2: np.ndarray) -> np.ndarray:
    """[N] cosine of each pair of rows of two [N, D] arrays."""
    return (_unit(emb1) * _unit(emb2)).sum(-1)


def sts_metrics(emb1: np.ndarray, emb2: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman (average ranks for ties) of the pairs' cosine against `gold`; nan
    where either side is constant (scoring.pearson)."""
    emb1, emb2, gold = np.asarray(emb1), np.asarray(emb2), np.asarray(gold, np.float64)
    _check_rows(emb1, emb2, "sts_metrics")
    if not len(emb1) == len(emb2) == len(gold):
        raise ValueError(f"sts_metrics: {len(emb1)} and {len(emb2)} embeddings for {len(gold)} scores")
    cosine = pair_cosines(emb1, emb2)
    return {"pearson_cosine": scoring.pearson(gold, cosine),
            "spearman_cosine": scoring.spearman(gold, cosine)}


def rank(query_emb: np.ndarray, corpus_emb: np.ndarray, corpus_ids: Sequence[str], k: int,
         chunk: int = 1024) -> np.ndarray:
    """[Q, min(k, N)] corpus indices of each query's top k by cosine, ties by ascending id."""
    query_emb, corpus_emb = np.asarray(query_emb), np.asarray(corpus_emb)
    _check_rows(query_emb, corpus_emb, "rank")
    corpus = _unit(corpus_emb)
    return rank_by(lambda start, stop: _unit(query_emb[start:stop]) @ corpus.T, len(query_emb),
                   corpus_ids, k, chunk)


def rank_by(scores_of: Callable[[int, int], np.ndarray], n_queries: int, corpus_ids: Sequence[str],
            k: int, chunk: int = 1024) -> np.ndarray:
    """[Q, min(k, N)] corpus indices of each query's top k by `scores_of(start, stop)` (the
    [stop - start, N] scores of those queries against the corpus), ties by ascending id."""
    k = min(k, len(corpus_ids))
    if k < 1:
        raise ValueError("rank: an empty corpus, or k < 1")
    by_id = np.empty(len(corpus_ids), np.int64)  # each document's place in ascending id order
    by_id[sorted(range(len(corpus_ids)), key=corpus_ids.__getitem__)] = np.arange(len(corpus_ids))
    out = np.zeros((n_queries, k), np.int64)
    for start in range(0, n_queries, chunk):
        scores = scores_of(start, min(start + chunk, n_queries))
        # Every document scoring at least the k-th best score is a candidate (ties included), then
        # the candidates sort by (-score, id).
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
        for row, s in enumerate(scores):
            cand = np.flatnonzero(s >= kth[row])
            out[start + row] = cand[np.lexsort((by_id[cand], -s[cand]))][:k]
    return out


def import_bm25s():
    """The bm25s module, or MissingExtra saying how to install it."""
    try:
        import bm25s
    except ImportError:
        raise MissingExtra("BM25 needs the bm25s package: pip install 'bert_jax[retrieval]' "
                           "(or pip install bm25s)") from None
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # its "Building index" lines
    return bm25s


def bm25_scores(corpus_texts: Sequence[str]) -> Callable[[Sequence[str]], np.ndarray]:
    """BM25 of the corpus (the maintained `bm25s` package: Lucene's formula with bm25s's
    defaults k1 = 1.5, b = 0.75 (Lucene's own: 1.2, 0.75),
    lowercased words of 2+ letters or digits, English stop words removed, no stemming): a
    function of query texts giving their [Q, N] scores. A query of stop words only scores 0."""
    bm25s = import_bm25s()
    index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    index.index(bm25s.tokenize(list(corpus_texts), stopwords="en", show_progress=False),
                show_progress=False)
    n = len(corpus_texts)

    def scores(queries: Sequence[str]) -> np.ndarray:
        tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        return np.stack([index.get_scores(t) if t else np.zeros(n, np.float32) for t in tokens])
    return scores


def retrieval_per_query(hits: np.ndarray, n_relevant: np.ndarray) -> dict[str, np.ndarray]:
    """Each query's metrics from `hits` [Q, K] (is the r-th ranked document relevant) and its
    count of relevant documents, with InformationRetrievalEvaluator's formulas."""
    hits, n_rel = np.asarray(hits, bool), np.asarray(n_relevant, np.float64)
    hits = np.pad(hits, [(0, 0), (0, max(0, RANK_DEPTH - hits.shape[1]))])  # a corpus under k documents
    discount = 1 / np.log2(np.arange(RANK_DEPTH) + 2)
    out = {}
    for k in ACCURACY_AT:
        out[f"accuracy@{k}"] = hits[:, :k].any(1).astype(np.float64)
    for k in RECALL_AT:
        found = hits[:, :k].sum(1)
        out[f"precision@{k}"], out[f"recall@{k}"] = found / k, found / n_rel
    for k in MRR_AT:
        first = hits[:, :k].argmax(1)
        out[f"mrr@{k}"] = np.where(hits[:, :k].any(1), 1 / (first + 1), 0.0)
    for k in NDCG_AT:
        ideal = np.cumsum(discount[:k])[np.minimum(n_rel, k).astype(int) - 1]
        out[f"ndcg@{k}"] = (hits[:, :k] * discount[:k]).sum(1) / ideal
    for k in MAP_AT:
        precision = np.cumsum(hits[:, :k], 1) / np.arange(1, k + 1)
        out[f"map@{k}"] = (precision * hits[:, :k]).sum(1) / np.minimum(k, n_rel)
    return out


def retrieval_metrics(query_emb: np.ndarray, corpus_emb: np.ndarray, corpus_ids: Sequence[str],
                      relevant: Sequence[set[str]]) -> dict[str, np.ndarray]:
    """Per-query metrics (arrays [Q]) of queries that each have at least one relevant id."""
    if not relevant or len(query_emb) != len(relevant) or any(not r for r in relevant):
        raise ValueError(f"retrieval_metrics: {len(query_emb)} queries, {len(relevant)} sets of "
                         "relevant ids; each query needs at least one (and there must be a query)")
    if len(set(corpus_ids)) != len(corpus_ids) or len(corpus_ids) != len(corpus_emb):
        raise ValueError("retrieval_metrics: corpus ids must be unique, one per corpus embedding")
    return ranking_metrics(rank(query_emb, corpus_emb, corpus_ids, RANK_DEPTH), corpus_ids, relevant)


def ranking_metrics(top: np.ndarray, corpus_ids: Sequence[str], relevant: Sequence[set[str]]
                    ) -> dict[str, np.ndarray]:
    """Per-query metrics of rankings `top` ([Q, K] corpus indices, best first)."""
    hits = np.array([[corpus_ids[i] in rel for i in row] for row, rel in zip(top, relevant)], bool)
    return retrieval_per_query(hits.reshape(len(top), -1), np.array([len(r) for r in relevant]))


def bootstrap(statistic: Callable[[np.ndarray], Mapping[str, float]], n_items: int, *,
              n: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap intervals of each value of `statistic(indices)` over `n` resamples
    (with replacement) of the `n_items` items (queries or pairs), seeded. A resample where a
    value is undefined (nan: a correlation of a resample whose scores are all equal) is left
    out of that value's interval; nan if it is undefined in every one."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n):
        for name, value in statistic(rng.integers(0, n_items, n_items)).items():
            draws.setdefault(name, []).append(value)
    tail = 100 * (1 - level) / 2
    out = {}
    for name, values in draws.items():
        defined = np.asarray(values, np.float64)
        defined = defined[~np.isnan(defined)]
        out[name] = (tuple(float(v) for v in np.percentile(defined, [tail, 100 - tail]))
                     if defined.size else (math.nan, math.nan))
    return out


def with_intervals(values: Mapping[str, float], intervals: Mapping[str, tuple[float, float]]
                   ) -> dict[str, float | list[float]]:
    """{name: value, name_ci95: [low, high]} for one JSON line."""
    out: dict[str, float | list[float]] = {}
    for name, value in values.items():
        out[name] = round(float(value), 6)
        out[f"{name}_ci95"] = [round(v, 6) for v in intervals[name]]
    return out


def evaluate_sts(emb1: np.ndarray, emb2: np.ndarray, gold: Sequence[float], *, n: int = 1000,
                 seed: int = 0) -> dict[str, float | list[float]]:
    """sts_metrics with bootstrap intervals over the pairs."""
    emb1, emb2, gold = np.asarray(emb1), np.asarray(emb2), np.asarray(gold, np.float64)
    values = sts_metrics(emb1, emb2, gold)
    intervals = bootstrap(lambda i: sts_metrics(emb1[i], emb2[i], gold[i]), len(gold), n=n, seed=seed)
    return with_intervals(values, intervals)


def evaluate_retrieval(query_emb: np.ndarray, corpus_emb: np.ndarray, corpus_ids: Sequence[str],
                       relevant: Sequence[set[str]], *, n: int = 1000, seed: int = 0
                       ) -> dict[str, float | list[float]]:
    """The means of retrieval_metrics with bootstrap intervals over the queries."""
    return _with_bootstrap(retrieval_metrics(query_emb, corpus_emb, corpus_ids, relevant), n, seed)


def evaluate_bm25(queries: Sequence[str], corpus: Sequence[str], corpus_ids: Sequence[str],
                  relevant: Sequence[set[str]], *, n: int = 1000, seed: int = 0
                  ) -> dict[str, float | list[float]]:
    """evaluate_retrieval's metrics and intervals of BM25's rankings (bm25_scores)."""
    if not relevant or len(queries) != len(relevant) or any(not r for r in relevant):
        raise ValueError(f"evaluate_bm25: {len(queries)} queries, {len(relevant)} sets of relevant "
                         "ids; each query needs at least one (and there must be a query)")
    if len(set(corpus_ids)) != len(corpus_ids) or len(corpus_ids) != len(corpus):
        raise ValueError("evaluate_bm25: corpus ids must be unique, one per corpus text")
    scores = bm25_scores(corpus)
    top = rank_by(lambda start, stop: scores(queries[start:stop]), len(queries), corpus_ids,
                  RANK_DEPTH)
    return _with_bootstrap(ranking_metrics(top, corpus_ids, relevant), n, seed)


def _with_bootstrap(per_query: dict[str, np.ndarray], n: int, seed: int
                    ) -> dict[str, float | list[float]]:
    """The means of per-query metrics with bootstrap intervals over the queries."""
    values = {name: v.mean() for name, v in per_query.items()}
    n_queries = len(next(iter(per_query.values())))
    intervals = bootstrap(lambda i: {name: v[i].mean() for name, v in per_query.items()},
                          n_queries, n=n, seed=seed)
    return with_intervals(values, intervals)


# Readers -------------------------------------------------------------------------------------


def read_sts(path: str | os.PathLike) -> tuple[list[str], list[str], list[float]]:
    """(sentences1, sentences2, scores 0..5) of a GLUE STS-B tsv with its score column."""
    examples = glue.read_glue("stsb", path, skip_bad_rows=None)  # no config: no key skips
    if any(e.label is None for e in examples):
        raise ValueError(f"{path}: no score column (a test file?); STS needs the gold scores")
    scores = check_scores_differ(path, [e.label for e in examples], least=MIN_STS_PAIRS)
    return [e.text_a for e in examples], [e.text_b for e in examples], scores


# The fewest pairs an STS evaluation correlates: any 2 points lie on a line, so Pearson and
# Spearman of 2 pairs are +1 or -1 whatever the model.
MIN_STS_PAIRS = 3
# The fewest documents a retrieval evaluation ranks: with one, every query ranks it first and
# every @k metric is 1 whatever the model.
MIN_CORPUS = 2


def check_scores_differ(path, scores: Sequence[float], least: int = 2) -> Sequence[float]:
    """`scores`, the gold scores of a file of scored pairs, when there are at least `least`
    (MIN_STS_PAIRS to evaluate on) and two differ; else a ValueError naming the file: the
    Spearman and Pearson of constant scores are undefined (scoring's nan), those of 2 pairs
    are +-1, and CoSENT learns nothing from pairs none of which ranks above another."""
    if len(set(scores)) < 2:
        found = f"{len(scores)} pair(s), every score {scores[0]}" if scores else "no pairs"
        raise ValueError(f"{path}: {found}; scored pairs are ranked and correlated by their "
                         "scores, which must differ: give a file of pairs with varied scores "
                         "(as the STS-B train.tsv and dev.tsv)")
    if len(scores) < least:
        raise ValueError(f"{path}: {len(scores)} pairs; Pearson and Spearman of fewer than "
                         f"{least} pairs are +1 or -1 whatever the model: give a file of at "
                         f"least {least} scored pairs (as the STS-B dev.tsv)")
    return scores


def beir_record(path, line_no: int, line: str, fields: Sequence[str],
                optional: Sequence[str] = (), *, empty_ok: bool = False) -> dict:
    """One line of a BEIR JSON-lines file as its record, which must have "_id" and `fields`
    (strings), and may have `optional` (strings or null: a corpus's "title"); anything else is
    a ValueError naming the file, line and field, as is a record whose text is empty unless
    `empty_ok` (a corpus read for retrieval: published BEIR corpora hold such documents, FiQA
    five, which BEIR and sentence-transformers embed as empty texts and rank). A byte order
    mark opening line 1 (as Windows editors save UTF-8) is dropped, as the pair and text
    readers drop it."""
    try:
        record = json.loads(line.removeprefix("\ufeff") if line_no == 1 else line)
    except ValueError as e:
        raise ValueError(f"{path}:{line_no}: not JSON ({e})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}:{line_no}: a JSON {type(record).__name__}, expected an object "
                         f"(a BEIR record has _id and {', '.join(fields)})")
    for field in ("_id", *fields):
        if not isinstance(record.get(field), str):
            raise ValueError(f"{path}:{line_no}: field {field!r} missing or not a string; "
                             f"a BEIR record has _id and {', '.join(fields)}")
    for field in optional:
        if not isinstance(record.get(field) or "", str):
            raise ValueError(f"{path}:{line_no}: field {field!r} is not a string (found "
                             f"{record[field]!r}); give a string, null, or no {field}")
    if not empty_ok and not " ".join(record.get(f) or "" for f in (*optional, *fields)).strip():
        also = "".join(f" (and no {f})" for f in optional)
        raise ValueError(f"{path}:{line_no}: field {fields[0]!r} is empty{also}: nothing to "
                         "embed; remove the record or give it a text")
    return record


def document_text(record: dict) -> str:
    """A BEIR corpus record's text: its title and text joined by a space, stripped, as BEIR's
    sentence-transformers examples build it."""
    return f"{record.get('title') or ''} {record['text']}".strip()


def _jsonl(path, fields: Sequence[str], optional: Sequence[str] = (), *,
           empty_ok: bool = False) -> dict[str, dict]:
    """id -> record of a JSON-lines file whose records have "_id" and `fields` (strings)
    (beir_record)."""
    out: dict[str, dict] = {}
    with open_text(path, "utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = beir_record(path, line_no, line, fields, optional, empty_ok=empty_ok)
            if record["_id"] in out:
                raise ValueError(f"{path}:{line_no}: field '_id': {record['_id']!r} twice")
            out[record["_id"]] = record
    return out


def check_corpus(where, documents: int) -> None:
    """A retrieval set of `where` (a file or folder) whose corpus holds at least MIN_CORPUS
    documents; else a ValueError naming it: one document ranks first for every query."""
    if documents < MIN_CORPUS:
        raise ValueError(f"{where}: a corpus of {documents} document(s): every query ranks it "
                         f"first, so every @k metric is 1 whatever the model; give at least "
                         f"{MIN_CORPUS} distinct documents")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


MISSING_SCORED = ("scored as a miss, as BEIR and sentence-transformers score it; remove those rows "
                  "to leave them out")


def read_beir(folder: str | os.PathLike, split: str = "test", missing: str = MISSING_SCORED
              ) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """(corpus id -> "title text", query id -> text, query id -> relevant corpus ids) of a BEIR
    folder: corpus.jsonl, queries.jsonl and qrels/<split>.tsv (query-id, corpus-id, score; a
    header row; score > 0 is relevant). The corpus text is the title and the text joined by a
    space, stripped, as BEIR's sentence-transformers examples build it. A relevant id the
    corpus lacks is said once, with `missing` (what becomes of it, and what to do)."""
    root = paths.path(folder)
    corpus = {i: document_text(r) for i, r in _jsonl(root / "corpus.jsonl", ["text"], ["title"],
                                                      empty_ok=True).items()}
    if empty := sum(1 for text in corpus.values() if not text):
        log.warning(f"warning: {root / 'corpus.jsonl'}: {empty} document(s) with no title and no "
                    "text, embedded as empty texts (as BEIR does)")
    queries = {i: r["text"] for i, r in _jsonl(root / "queries.jsonl", ["text"]).items()}
    qrels_file = root / "qrels" / f"{split}.tsv"
    relevant: dict[str, set[str]] = {}
    scored: dict[tuple[str, str], tuple[int, float]] = {}  # (query, document) -> (line, score)
    absent: list[tuple[int, str]] = []  # (line, corpus id) of relevant ids the corpus lacks
    unasked: list[tuple[int, str]] = []  # (line, query id) of qrels rows queries.jsonl lacks
    with open_text(qrels_file, "utf-8") as f:
        for line_no, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if line_no == 1:  # the header, which BEIR's loader skips unread: a row there is lost
                if len(cols) != 3 or _is_number(cols[2]):
                    raise ValueError(f"{qrels_file}:1: {line.strip()[:60]!r} is not the header a "
                                     "qrels file starts with (query-id, corpus-id, score, "
                                     "tab-separated); add that line")
                continue
            if not line.strip():
                continue
            if len(cols) != 3:
                raise ValueError(f"{qrels_file}:{line_no}: {len(cols)} columns; expected query-id, "
                                 "corpus-id, score")
            try:
                score = float(cols[2])
            except ValueError:
                raise ValueError(f"{qrels_file}:{line_no}: field 'score' {cols[2]!r} is not a "
                                 "number") from None
            if cols[0] not in queries:  # no text to embed: left out (NFCorpus's test qrels
                unasked.append((line_no, cols[0]))  # name queries its queries.jsonl lacks)
                continue
            earlier = scored.setdefault((cols[0], cols[1]), (line_no, score))
            if earlier[1] != score:  # BEIR's loader keeps the last: which one is meant?
                raise ValueError(f"{qrels_file}:{line_no}: query-id {cols[0]!r} and corpus-id "
                                 f"{cols[1]!r} again with score {cols[2]!r} (line {earlier[0]}: "
                                 f"{earlier[1]:g}); keep one row per pair")
            if cols[1] not in corpus and score > 0:
                absent.append((line_no, cols[1]))
            if score > 0:
                relevant.setdefault(cols[0], set()).add(cols[1])
    if unasked and not relevant:
        raise ValueError(f"{qrels_file}:{unasked[0][0]}: field 'query-id' {unasked[0][1]!r} is not "
                         f"in {root / 'queries.jsonl'}, nor is any query-id of its rows with a "
                         "score > 0: the qrels of other queries")
    if unasked:
        logging.getLogger(__name__).warning(
            "%s:%d: query-id %r is not in %s (%d row(s) like it): left out, having no text to "
            "embed; remove those rows to silence this", qrels_file, *unasked[0],
            root / "queries.jsonl", len(unasked))
    if not relevant or not corpus:
        raise ValueError(f"{qrels_file if corpus else root / 'corpus.jsonl'}: "
                         f"{'no row with a score > 0' if corpus else 'no document'}: nothing to retrieve")
    # A relevant id absent from the corpus counts (as sentence-transformers counts it); none
    # present at all is a qrels file of another corpus, every score 0.
    if not any(d in corpus for docs in relevant.values() for d in docs):
        example = next(iter(next(iter(relevant.values()))))
        raise ValueError(f"{qrels_file}: none of its relevant corpus-ids is in {root / 'corpus.jsonl'} "
                         f"(e.g. {example!r}): the qrels of another corpus; every score would be 0")
    if absent:  # (published sets have a few: ArguAna's test qrels name a document it lacks)
        logging.getLogger(__name__).warning(
            "%s:%d: corpus-id %r is not in %s (%d relevant row(s) like it): %s", qrels_file,
            *absent[0], root / "corpus.jsonl", len(absent), missing)
    return corpus, queries, relevant


def squad_retrieval(path: str | os.PathLike
                    ) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """A SQuAD json file as retrieval (read_beir's triple): each question retrieves its
    paragraph; equal paragraphs are one document (SQuAD dev v1.1: 10,570 questions, 2,067
    paragraphs); ids are the question ids and p<first position of the paragraph>."""
    corpus: dict[str, str] = {}
    by_text: dict[str, str] = {}
    queries: dict[str, str] = {}
    relevant: dict[str, set[str]] = {}
    for qid, question, context in squad.questions(path):
        pid = by_text.setdefault(context, f"p{len(by_text)}")
        corpus[pid] = context
        queries[qid] = question
        relevant.setdefault(qid, set()).add(pid)
    if not queries:
        raise ValueError(f"{path}: no question with a paragraph; nothing to retrieve (give a "
                         "SQuAD file whose paragraphs have questions)")
    return corpus, queries, relevant
