"""SQuAD v1.1/v2.0 for BERT as google-research/bert run_squad.py, plus the official evaluation.

read_squad -> encode (sliding windows over the paragraph) -> model logits -> postprocess (n-best
spans projected back onto the original text) -> evaluate (official EM/F1) and write_predictions.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import json
import logging
import math
import os
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from bert_jax import paths, specs
from bert_jax.data.rows import BadRows, open_text
from bert_jax.data.tokenizer import SP_SPACE, Tokenizer
from bert_jax.data.wordpiece import SPECIAL_TOKENS, reference_basic_tokenize
from bert_jax.specs import RunSpec
from bert_jax.tasks.base import Task, register

# run_squad.py splits paragraphs on these only (U+202F too), not on every Unicode space.
_WORD = re.compile(r"[^ \t\r\n\u202f]+")
_UNK = SPECIAL_TOKENS[1]  # both tokenizer kinds name the unknown token "[UNK]"
_NO_NON_NULL = 1e9  # null_odds when no span survived the filters: surely no answer, and valid JSON
_JSON_NAMES = {str: "string", int: "integer", bool: "boolean", list: "array"}

log = logging.getLogger(__name__)


class SquadFormatError(ValueError):
    """A SQuAD file that is not JSON, lacks or mistypes a field, or has an answer not at answer_start."""


@dataclasses.dataclass(slots=True)
class SquadExample:
    """One question; positions are word indices into doc_tokens, set for training only."""

    qas_id: str
    question_text: str
    doc_tokens: list[str]  # the paragraph split on whitespace; one list shared by its questions
    orig_answer_text: str | None = None  # training: the answer ("" when impossible)
    start_position: int | None = None  # training: first answer word (-1 when impossible)
    end_position: int | None = None  # training: last answer word (-1 when impossible)
    is_impossible: bool = False  # v2.0 only; without the field in the file: answers == []
    answers: list[str] = dataclasses.field(default_factory=list)  # all gold texts; [] when impossible


def _field(obj: object, key: str, typ: type, where: str, path: Path) -> object:
    """obj[key] checked for presence and type, with errors naming the file and the field's path."""
    if not isinstance(obj, dict):
        raise SquadFormatError(f"{path}: {where} should be a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise SquadFormatError(f"{path}: {where}.{key} is missing")
    value = obj[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise SquadFormatError(f"{path}: {where}.{key} should be a JSON {_JSON_NAMES[typ]}, "
                               f"got {type(value).__name__} {str(value)[:60]!r}")
    return value


def _load_json(path: Path) -> list:
    """The file's "data" list (the articles)."""
    try:
        with open_text(path, "utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise SquadFormatError(f"{path}: not a SQuAD JSON file: {e.msg} at line {e.lineno} column "
                               f"{e.colno}; expected the JSON of a SQuAD release") from None
    except ValueError as e:  # not UTF-8 text (utf8_errors names the line)
        raise SquadFormatError(str(e)) from None
    return _field(doc, "data", list, "<top>", path)


def questions(path: str | Path) -> Iterator[tuple[str, str, str]]:
    """(id, question, paragraph) of each question of a SQuAD json file, in order, each field
    checked as read_squad checks it (a missing or mistyped one names the file and its place)."""
    path = paths.path(path)
    for a, article in enumerate(_load_json(path)):
        for p, para in enumerate(_field(article, "paragraphs", list, f"data[{a}]", path)):
            where_p = f"data[{a}].paragraphs[{p}]"
            context = _field(para, "context", str, where_p, path)
            for q, qa in enumerate(_field(para, "qas", list, where_p, path)):
                where = f"{where_p}.qas[{q}]"
                yield (_field(qa, "id", str, where, path), _field(qa, "question", str, where, path),
                       context)


def read_squad(path: str | Path, *, is_training: bool, version_2: bool,
               skip_bad_rows: bool = False) -> list[SquadExample]:
    """Examples of a SQuAD json file (local or gs://); training answers must sit at their
    answer_start."""
    path = paths.path(path)
    examples: list[SquadExample] = []
    bad = BadRows(path, skip_bad_rows, SquadFormatError,
                  "; fix the row, or set data.skip_bad_rows=True to skip such rows "
                  "(the original run_squad.py skips them with a warning)")
    for a, article in enumerate(_load_json(path)):
        title = article.get("title", "?") if isinstance(article, dict) else "?"
        for p, para in enumerate(_field(article, "paragraphs", list, f"data[{a}]", path)):
            where_p = f"data[{a}].paragraphs[{p}]"
            context = _field(para, "context", str, where_p, path)
            matches = list(_WORD.finditer(context))
            doc_tokens = [m.group() for m in matches]
            word_starts = [m.start() for m in matches]
            for q, qa in enumerate(_field(para, "qas", list, where_p, path)):
                where = f"{where_p}.qas[{q}]"
                qid, question = _field(qa, "id", str, where, path), _field(qa, "question", str, where, path)
                ex = SquadExample(qid, question, doc_tokens)
                raw = _field(qa, "answers", list, where, path) if is_training or "answers" in qa else []
                if version_2 and "is_impossible" in qa:
                    ex.is_impossible = _field(qa, "is_impossible", bool, where, path)
                elif version_2:  # the official v2.0 script: unanswerable = an empty answers list
                    ex.is_impossible = "answers" in qa and not raw
                ex.answers = [_field(ans, "text", str, f"{where}.answers[{i}]", path)
                              for i, ans in enumerate(raw)]
                if is_training:
                    error = _training_answer(ex, raw, context, word_starts, f"{where}.answers[0]", path)
                    if error:
                        bad(f"{path}: article {title!r}, question {ex.qas_id} ({where}.answers[0]): {error}")
                        continue
                examples.append(ex)
    # The original warns per row; one count (and the first row) is easier to read.
    bad.warn("read_squad", f"{bad.count} of {bad.count + len(examples)} training questions "
             "(data.skip_bad_rows=True)")
    return examples


def _training_answer(ex: SquadExample, raw: list, context: str, word_starts: list[int], where: str,
                     path: Path) -> str | None:
    """Sets the answer's word span on ex; returns what is wrong with the row, if anything."""
    if ex.is_impossible:
        ex.orig_answer_text, ex.start_position, ex.end_position = "", -1, -1
        return None
    if len(raw) != 1:  # as the original: one answer per training question
        hint = "; a SQuAD 2.0 file? pass version_2=True" if not raw else ""
        return f"a training question needs exactly 1 answer, got {len(raw)}{hint}"
    start = _field(raw[0], "answer_start", int, where, path)
    text = ex.answers[0]
    end = start + len(text) - 1
    if not text.strip() or not 0 <= start <= end < len(context):
        return f"answer_start={start} with text {text!r} does not fit the {len(context)}-char context"
    # Word of a char = the last word starting at or before it (whitespace maps to the word before).
    first, last = bisect.bisect_right(word_starts, start) - 1, bisect.bisect_right(word_starts, end) - 1
    found = " ".join(ex.doc_tokens[max(first, 0):last + 1])
    cleaned = " ".join(text.split())
    if first < 0 or found.find(cleaned) == -1:
        return (f"answer_start={start} points at {context[start:end + 1]!r} (words {found!r}), "
                f"expected the answer text {cleaned!r}")
    ex.orig_answer_text, ex.start_position, ex.end_position = text, first, last
    return None


@dataclasses.dataclass(slots=True)
class SquadFeatures:
    """Windows ([CLS] query [SEP] doc part [SEP]) as model inputs, plus what postprocess needs."""

    input_ids: np.ndarray  # int32 [F, T], padded with pad_id
    attention_mask: np.ndarray  # int32 [F, T]: 1 on real tokens
    token_type_ids: np.ndarray  # int32 [F, T]: 0 query, 1 doc part and its [SEP]
    start_positions: np.ndarray | None  # int32 [F], training: answer start in the window, 0 = [CLS] if absent
    end_positions: np.ndarray | None  # int32 [F], training
    example_index: np.ndarray  # int32 [F]: the window's example
    tokens: list[list[str]]  # token strings of each window, unpadded
    token_to_orig_map: list[np.ndarray]  # int32 [len(tokens)]: word index in doc_tokens; -1 off the doc
    token_is_max_context: list[np.ndarray]  # bool [len(tokens)]: this window has the most context for it
    kind: str  # tokenizer kind, to detokenize answers
    lowercase: bool  # tokenizer casing, to match answers against the original text

    def __len__(self) -> int:
        return len(self.input_ids)


def _doc_spans(n: int, max_doc: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) windows over n tokens, each starting stride after the last, as the original."""
    spans, start = [], 0
    while start < n:
        length = min(n - start, max_doc)
        spans.append((start, length))
        if start + length == n:
            break
        start += min(length, stride)
    return spans


def _max_context(spans: list[tuple[int, int]], n: int) -> np.ndarray:
    """Per doc token, the span where min(left, right context) + 0.01 * length is largest (first wins)."""
    starts, lengths = np.array(spans).T[:, :, None]
    pos, ends = np.arange(n), starts + lengths - 1
    score = np.minimum(pos - starts, ends - pos) + 0.01 * lengths
    return np.where((pos >= starts) & (pos <= ends), score, -np.inf).argmax(0)


def _improve_answer_span(doc: list[int], start: int, end: int, answer: list[int]) -> tuple[int, int]:
    """The first sub-span of [start, end] tokenized exactly as the answer text alone, else [start, end]."""
    # The original compares joined strings over all (start, end) pairs; only equal-length spans can match.
    for new_start in range(start, end - len(answer) + 2 if answer else start):
        if doc[new_start:new_start + len(answer)] == answer:
            return new_start, new_start + len(answer) - 1
    return start, end


def encode(examples: Sequence[SquadExample], tokenizer: Tokenizer, *, max_seq_length: int = 384,
           doc_stride: int = 128, max_query_length: int = 64, is_training: bool) -> SquadFeatures:
    """Windows of every example as run_squad.py convert_examples_to_features builds them."""
    if max_seq_length - max_query_length - 3 < 1 or doc_stride < 1:
        raise ValueError(f"encode: need max_seq_length - max_query_length - 3 >= 1 and doc_stride >= 1, got "
                         f"max_seq_length={max_seq_length}, max_query_length={max_query_length}, "
                         f"doc_stride={doc_stride}")
    if is_training and any(ex.start_position is None for ex in examples):
        raise ValueError("encode(is_training=True) needs answer positions: read the file with "
                         "read_squad(..., is_training=True)")
    # Each whitespace word is tokenized alone, as the original does; one batch for all distinct words.
    docs = {id(ex.doc_tokens): ex.doc_tokens for ex in examples}
    words = list(dict.fromkeys(w for doc in docs.values() for w in doc))
    word_ids = dict(zip(words, tokenizer.encode_batch(words)))
    queries = tokenizer.encode_batch([ex.question_text for ex in examples])
    answers = tokenizer.encode_batch([ex.orig_answer_text or "" for ex in examples] if is_training else [])
    tokenized = {}  # id(doc_tokens) -> (token ids, token -> word, word -> first token)
    for key, doc in docs.items():
        pieces = [word_ids[w] for w in doc]
        counts = np.array([len(p) for p in pieces], np.int32)
        ids = np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)
        tokenized[key] = (ids, np.repeat(np.arange(len(doc), dtype=np.int32), counts),
                          np.cumsum(counts) - counts)
    rows, positions, example_index, doc_offsets, maps, max_ctx = [], [], [], [], [], []
    context_cache = {}
    for e, ex in enumerate(examples):
        doc_ids, tok_to_orig, orig_to_tok = tokenized[id(ex.doc_tokens)]
        query = queries[e][:max_query_length]
        offset, max_doc = len(query) + 2, max_seq_length - len(query) - 3
        spans = _doc_spans(len(doc_ids), max_doc, doc_stride)
        if spans and (key := (id(ex.doc_tokens), max_doc)) not in context_cache:
            context_cache[key] = _max_context(spans, len(doc_ids))
        tok_start = tok_end = -1
        if is_training and not ex.is_impossible:
            tok_start = orig_to_tok[ex.start_position]
            tok_end = (orig_to_tok[ex.end_position + 1] - 1 if ex.end_position < len(ex.doc_tokens) - 1
                       else len(doc_ids) - 1)
            tok_start, tok_end = _improve_answer_span(doc_ids.tolist(), tok_start, tok_end,
                                                      answers[e].tolist())
        for s, (start, length) in enumerate(spans):
            rows.append(np.concatenate([[tokenizer.cls_id], query, [tokenizer.sep_id],
                                        doc_ids[start:start + length], [tokenizer.sep_id]]))
            to_orig = np.full(len(rows[-1]), -1, np.int32)
            to_orig[offset:offset + length] = tok_to_orig[start:start + length]
            is_max = np.zeros(len(rows[-1]), bool)
            is_max[offset:offset + length] = context_cache[key][start:start + length] == s
            inside = tok_start >= start and tok_end <= start + length - 1 and tok_start >= 0
            positions.append((tok_start - start + offset, tok_end - start + offset) if inside else (0, 0))
            example_index.append(e)
            doc_offsets.append(offset)
            maps.append(to_orig)
            max_ctx.append(is_max)
    input_ids = np.full((len(rows), max_seq_length), tokenizer.pad_id, np.int32)
    token_type_ids = np.zeros((len(rows), max_seq_length), np.int32)
    attention_mask = np.zeros((len(rows), max_seq_length), np.int32)
    tokens = []
    for f, row in enumerate(rows):
        input_ids[f, :len(row)], attention_mask[f, :len(row)] = row, 1
        token_type_ids[f, doc_offsets[f]:len(row)] = 1
        tokens.append(tokenizer.tokens(row))
    pos = np.array(positions, np.int32).reshape(-1, 2)
    return SquadFeatures(input_ids, attention_mask, token_type_ids, pos[:, 0] if is_training else None,
                         pos[:, 1] if is_training else None, np.array(example_index, np.int32), tokens,
                         maps, max_ctx, tokenizer.kind, tokenizer.lowercase)


def _strip_spaces(text: str) -> tuple[str, list[int]]:
    """text without " ", and each kept char's index in text."""
    kept = [i for i, c in enumerate(text) if c != " "]
    return text.replace(" ", ""), kept


@functools.lru_cache(maxsize=1 << 17)
def _basic_words(word: str, lowercase: bool) -> str:
    """One whitespace word as BERT's BasicTokenizer splits it, space-joined (cached: it is slow)."""
    return " ".join(reference_basic_tokenize(word, lowercase))


def _final_text(pieces: list[str], i: int, j: int, words: list[str], lowercase: bool, kind: str) -> str:
    """Answer pieces[i:j] projected onto the words that pieces covers (get_final_text).

    The original finds the answer's detokenized text in the words' BasicTokenizer split and returns
    all the words when that fails (any [UNK]). We first align all of pieces to that split, [UNK]s as
    wildcards, which pins the answer down even when its text occurs twice; the original's search is
    the fallback (e.g. when the window cut a word, so pieces does not cover it all).
    """
    orig_text = " ".join(words)
    lead, pred, tail = (_detokenize(p, kind) for p in (pieces[:i], pieces[i:j], pieces[j:]))
    if kind == "wordpiece":
        tok_text = " ".join(w for w in (_basic_words(w, lowercase) for w in words) if w)
        haystack, unk = tok_text, "[^ ]+"  # WordPiece's [UNK] stands for one whole word
        gap = ["" if not part else "" if nxt.startswith("##") else " "
               for part, nxt in ((lead, pieces[i]), (tail, pieces[j % len(pieces)]))]
    else:  # SentencePiece keeps punctuation on words, so match without spaces
        tok_text = orig_text.lower() if lowercase else orig_text
        haystack, unk, gap = _strip_spaces(tok_text)[0], ".+?", ["", ""]
        lead, pred, tail = (x.replace(" ", "") for x in (lead, pred, tail))
    start = -1
    if _UNK not in pred + lead + tail:
        if lead + gap[0] + pred + gap[1] + tail == haystack:
            start = len(lead + gap[0])
    else:  # a pattern of its own; its literal ends are compared as strings (compiling is slow)
        wild = lambda x: unk.join(map(re.escape, x.split(_UNK)))  # noqa: E731
        head, after = lead.split(_UNK, 1) if _UNK in lead else (lead + gap[0], None)
        before, last = tail.rsplit(_UNK, 1) if _UNK in tail else (None, gap[1] + tail)
        pattern = ("" if after is None else f"{unk}{wild(after)}{gap[0]}") + f"({wild(pred)})" + (
            "" if before is None else f"{gap[1]}{wild(before)}{unk}")
        end = len(haystack) - len(last)
        if (len(head) <= end and haystack.startswith(head) and haystack.endswith(last)
                and (found := re.compile(pattern).fullmatch(haystack, len(head), end))):
            start, pred = found.start(1), found.group(1)
    if start == -1:
        start = haystack.find(pred)
    pred_len = len(pred)
    if start == -1 or pred_len == 0:
        return orig_text
    orig_ns, orig_map = _strip_spaces(orig_text)
    if len(orig_ns) != len(tok_text) - tok_text.count(" "):  # normalization changed the length
        return orig_text
    end = start + pred_len - 1
    if kind == "wordpiece":  # start/end index tok_text with spaces; map them to no-space positions
        if tok_text[start] == " " or tok_text[end] == " ":
            return orig_text
        start, end = start - tok_text.count(" ", 0, start), end - tok_text.count(" ", 0, end)
    return orig_text[orig_map[start]:orig_map[end] + 1]


def _detokenize(tokens: list[str], kind: str) -> str:
    """Tokens joined back into (normalized) text: WordPiece "##" glued on, SentencePiece "▁" = space."""
    if kind == "wordpiece":
        text = " ".join(tokens).replace(" ##", "").replace("##", "")
    else:
        text = "".join(tokens).replace(SP_SPACE, " ")
    return " ".join(text.split())


def _softmax(scores: list[float]) -> list[float]:
    """Probabilities of the n-best scores (max subtracted first, as the original)."""
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    return [e / sum(exps) for e in exps]


def postprocess(examples: Sequence[SquadExample], features: SquadFeatures, start_logits: np.ndarray,
                end_logits: np.ndarray, *, n_best_size: int = 20, max_answer_length: int = 30,
                version_2: bool = False, null_score_diff_threshold: float = 0.0,
                lowercase: bool | None = None) -> tuple[dict[str, str], dict[str, list], dict[str, float]]:
    """(predictions, n-best lists, v2 null odds) per question id, as run_squad.py write_predictions.

    lowercase: casing for matching answers to the original text; None = the tokenizer's (features).
    """
    # float64 holds float32 logits exactly, as the original's float(x); sums then match it too.
    start_logits, end_logits = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    if start_logits.shape != end_logits.shape or start_logits.shape[:1] != (len(features),):
        raise ValueError(f"postprocess: logits {start_logits.shape} and {end_logits.shape} should both be "
                         f"[{len(features)} features, T]")
    lowercase = features.lowercase if lowercase is None else lowercase
    by_example = collections.defaultdict(list)
    for f, e in enumerate(features.example_index.tolist()):
        by_example[e].append(f)
    predictions, all_nbest, null_odds = {}, {}, {}
    for e, ex in enumerate(examples):
        prelim, null = [], None  # null: (score, feature, start logit, end logit) of the min null score
        for f in by_example[e]:
            starts, ends = start_logits[f], end_logits[f]
            if version_2 and (null is None or starts[0] + ends[0] < null[0]):
                null = (starts[0] + ends[0], f, float(starts[0]), float(ends[0]))
            n, to_orig = len(features.tokens[f]), features.token_to_orig_map[f]
            is_max = features.token_is_max_context[f]
            # Stable sorts on negated logits keep the original's tie order (lower index first).
            s = np.argsort(-starts, kind="stable")[:n_best_size, None]
            t = np.argsort(-ends, kind="stable")[None, :n_best_size]
            sc, tc = np.minimum(s, n - 1), np.minimum(t, n - 1)
            ok = ((s < n) & (t < n) & (to_orig[sc] >= 0) & (to_orig[tc] >= 0) & is_max[sc]
                  & (t >= s) & (t - s + 1 <= max_answer_length))
            for i, j in zip(*np.nonzero(ok)):
                prelim.append((f, int(s[i, 0]), int(t[0, j]), float(starts[s[i, 0]]), float(ends[t[0, j]])))
        if version_2 and null is not None:
            prelim.append((null[1], 0, 0, null[2], null[3]))
        prelim.sort(key=lambda p: p[3] + p[4], reverse=True)  # stable, as sorted(reverse=True)
        nbest, seen = [], set()
        for f, start, end, start_logit, end_logit in prelim:
            if len(nbest) >= n_best_size:
                break
            text = ""
            if start > 0:  # not the null ([CLS]) answer
                to_orig = features.token_to_orig_map[f]
                first, last = start, end  # widened to all the window's pieces of the first/last word
                while to_orig[first - 1] == to_orig[start]:  # to_orig[0] ([CLS]) is -1: stops there
                    first -= 1
                while last + 1 < len(to_orig) and to_orig[last + 1] == to_orig[end]:
                    last += 1
                text = _final_text(features.tokens[f][first:last + 1], start - first, end + 1 - first,
                                   ex.doc_tokens[to_orig[start]:to_orig[end] + 1], lowercase, features.kind)
                if text in seen:
                    continue
            seen.add(text)
            nbest.append((text, start_logit, end_logit))
        if version_2 and "" not in seen and null is not None:
            nbest.append(("", null[2], null[3]))
        if not nbest:  # no valid span (or no window) at all: the original's "nonce" prediction
            nbest.append(("" if version_2 else "empty", 0.0, 0.0))
        probs = _softmax([s + t for _, s, t in nbest])
        all_nbest[ex.qas_id] = [{"text": text, "probability": p, "start_logit": s, "end_logit": t}
                                for (text, s, t), p in zip(nbest, probs)]
        best = next(((s, t, text) for text, s, t in nbest if text), None)
        if not version_2:
            predictions[ex.qas_id] = nbest[0][0]
            continue
        null_score = null[0] if null is not None else 0.0
        diff = null_score - best[0] - best[1] if best else _NO_NON_NULL
        null_odds[ex.qas_id] = float(diff)
        predictions[ex.qas_id] = "" if best is None or diff > null_score_diff_threshold else best[2]
    return predictions, all_nbest, null_odds


def write_predictions(out_dir: str | Path, predictions: Mapping[str, str], nbest: Mapping[str, list],
                      null_odds: Mapping[str, float]) -> Path:
    """predictions.json, nbest_predictions.json and (v2, when null_odds) null_odds.json in out_dir."""
    out_dir = paths.path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"predictions.json": predictions, "nbest_predictions.json": nbest}
    if null_odds:
        files["null_odds.json"] = null_odds
    for name, value in files.items():
        (out_dir / name).write_text(json.dumps(value, indent=4) + "\n", "utf-8")
    return out_dir


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)  # deletes each


def normalize_answer(text: str) -> str:
    """The official normalization: lowercase, drop ASCII punctuation and articles, collapse spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalized texts are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, *, v2_empty_rule: bool = True) -> float:
    """Token F1 of the normalized texts; v2.0 scores an empty side 1 iff both are empty (v1.1: 0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if v2_empty_rule and (not pred or not ref):
        return float(pred == ref)
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def evaluate(dataset: str | Path | Sequence[SquadExample], predictions: Mapping[str, str], *,
             version_2: bool = False) -> dict[str, float]:
    """Official SQuAD EM/F1 in percent (v2.0 adds HasAns_*/NoAns_*); a missing prediction scores 0."""
    if isinstance(dataset, str | os.PathLike):
        dataset = read_squad(dataset, is_training=False, version_2=version_2)
    scores, missing = {True: [], False: []}, 0  # has answer -> [(em, f1)]
    for ex in dataset:
        if version_2:  # gold answers that normalize to "" do not count; none left = no answer
            golds = [a for a in ex.answers if normalize_answer(a)] or [""]
        elif not (golds := ex.answers):
            raise ValueError(f"evaluate: question {ex.qas_id} has no gold answers (a v2.0 file? "
                             "pass version_2=True)")
        if ex.qas_id not in predictions:
            missing += 1
            scores[bool(ex.answers)].append((0.0, 0.0))
            continue
        pred = predictions[ex.qas_id]
        scores[bool(ex.answers)].append((max(exact_match(pred, g) for g in golds),
                                         max(f1(pred, g, v2_empty_rule=version_2) for g in golds)))
    if missing:
        log.warning(f"evaluate: {missing} of {len(dataset)} questions have no prediction; they score 0")
    result = _percent(scores[True] + scores[False])
    if version_2:
        for name, has in (("HasAns", True), ("NoAns", False)):
            if scores[has]:  # as the official script: only groups that occur
                part = _percent(scores[has])
                result |= {f"{name}_exact": part["exact_match"], f"{name}_f1": part["f1"],
                           f"{name}_total": part["total"]}
    return result


def _percent(scores: list[tuple[float, float]]) -> dict[str, float]:
    total = max(len(scores), 1)
    return {"exact_match": 100.0 * sum(s[0] for s in scores) / total,
            "f1": 100.0 * sum(s[1] for s in scores) / total, "total": len(scores)}


@register
class SquadTask(Task):
    """SQuAD v1.1 / v2.0 span extraction; official EM / F1 (percent, as the official script)."""

    name = "squad"
    main_metric = "f1"
    file_kind = "a SQuAD JSON file"

    @classmethod
    def defaults(cls, config):
        super().defaults(config)
        config.optimizer.learning_rate = 5e-5

    @dataclasses.dataclass(frozen=True)
    class Data(specs.TaskData):
        # Not packed: a window already fills its max_seq_length row (doc_stride), and the span
        # softmax runs over the whole row.
        pack: bool = False
        version_2: bool = False  # SQuAD 2.0: questions may have no answer
        doc_stride: int = specs.valid(128, ">= 1")  # tokens between consecutive windows' starts
        max_query_length: int = specs.valid(64, ">= 1")
        n_best_size: int = specs.valid(20, ">= 1")
        max_answer_length: int = specs.valid(30, ">= 1")
        # v2: predict "" when null score - best span > this
        null_score_diff_threshold: float = specs.valid(0.0, "any")

    @classmethod
    def looks_like(cls, head: bytes) -> bool:
        return head.lstrip().startswith(b"{") and b'"paragraphs"' in head

    @classmethod
    def run_name(cls, data) -> str:
        return f"squad {'v2.0' if data.get('version_2') else 'v1.1'}"

    def __init__(self, config: RunSpec):
        super().__init__(config)
        self.version_2 = self.data.version_2

    def labeled(self, split: str) -> bool:
        return all(e.answers or e.is_impossible for e in self.examples(split))

    def read(self, path: Path, training: bool = False):
        # Training needs the answer spans (and checks them).
        return read_squad(path, is_training=training, version_2=self.version_2,
                          skip_bad_rows=self.data.skip_bad_rows)

    def encode(self, examples, training: bool):
        d = self.data
        f = encode(examples, self.tokenizer, max_seq_length=d.max_seq_length,
                   doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                   is_training=training)
        keys = ["input_ids", "token_type_ids", "attention_mask"]
        keys += ["start_positions", "end_positions"] if training else []
        return {k: getattr(f, k) for k in keys}, f

    def _postprocess(self, split: str, outputs):
        examples, d = self.examples(split), self.data
        return postprocess(
            examples, self.meta(split), outputs["start_logits"], outputs["end_logits"],
            n_best_size=d.n_best_size, max_answer_length=d.max_answer_length,
            version_2=self.version_2, null_score_diff_threshold=d.null_score_diff_threshold,
            lowercase=self.tokenizer.lowercase)

    def score(self, split: str, outputs) -> dict[str, float]:
        predictions, _, _ = self._postprocess(split, outputs)
        return evaluate(self.examples(split), predictions, version_2=self.version_2)

    def write_predictions(self, split: str, outputs, out_dir: Path) -> list:
        predictions, nbest, null_odds = self._postprocess(split, outputs)
        return [write_predictions(out_dir, predictions, nbest, null_odds if self.version_2 else {})]
