"""BERT pretraining examples (Google's create_pretraining_data.py), one document at a time.

Besides BERT's sentence-pair instances, MLM-only data (RoBERTa, ModernBERT; data.instances
"packed" and "full_rows", below `mask_tokens`). Every output is a pure function of (seed,
document index, epoch): draw
`rng = document_rng(seed, doc_index, epoch)`, pass it to `create_instances`, then to
`to_features` (or unpadded `instance_features`, for packing) for each instance, in that
order. Static masking (the original's dupe_factor) is epoch = copy index in
range(dupe_factor); dynamic masking is epoch = pass over the data.
Random-next segments read other documents through `get_doc(index)`, so memory is bounded by
a few documents. The original shuffles all instances before writing; a pipeline shuffles.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from bert_jax.data import text as text_lib
from bert_jax.data.tokenizer import Tokenizer, pair_lengths

TokenizedDocument = list[np.ndarray]  # int32 token ids per sentence; no empty sentences
FORMATS = ("sentences", "paragraphs", "document")

# A period after these (lowercased, with the period) does not end a sentence. "no.", "etc."
# and "a.m." are left out: in books they end sentences more often than not.
_ABBREVIATIONS = frozenset(
    "mr. mrs. ms. messrs. dr. st. jr. sr. prof. rev. gen. col. capt. lt. sgt. mt. hon. gov. "
    "e.g. i.e. vs. cf. viz. fig.".split())
# Terminator run, closing quotes/brackets, whitespace; then what may open a sentence.
_BOUNDARY = re.compile(r"""([.!?]+)['"’”)\]_]*\s+(?=['"‘“(\[_]*[A-Z0-9])""")
_OPENERS = "'\"‘“([_"
_INITIAL = re.compile(r"[A-HJ-Z]")  # "G. K. Chesterton"; "I." usually ends a sentence


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph: whitespace collapsed, split after . ! ? before a capital."""
    text = " ".join(paragraph.split())
    sentences, start = [], 0
    for m in _BOUNDARY.finditer(text):
        if m.group(1) == ".":
            word = text[max(start, text.rfind(" ", start, m.start()) + 1):m.start()]
            word = word.lstrip(_OPENERS)
            if (word + ".").lower() in _ABBREVIATIONS or _INITIAL.fullmatch(word):
                continue
        sentences.append(text[start:m.end()].rstrip())
        start = m.end()
    if start < len(text):
        sentences.append(text[start:])
    return sentences


def _lines(path: str | Path) -> Iterator[str]:
    """The lines of a plain or gzipped UTF-8 file (local or gs://); a line that is not UTF-8
    text stops with data.text's one error naming it, as vocab's reader does."""
    return text_lib.utf8_lines(str(path))


def _blocks(lines: Iterable[str]) -> Iterator[list[str]]:
    """Runs of stripped non-blank lines, separated by blank (or whitespace-only) lines."""
    block: list[str] = []
    for line in lines:
        if line := line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def iter_documents(path: str | Path, fmt: str = "sentences", *,
                   doc_sentences: int = 32) -> Iterator[list[str]]:
    """Streams documents (lists of sentences) from a text file, plain or .gz.

    "sentences": the original format, one sentence per line, blank lines between documents.
    "paragraphs": ordinary prose, paragraphs separated by blank lines; each paragraph's lines
    are joined and split into sentences, and a document is a run of whole paragraphs closed
    at the first paragraph end where it holds >= doc_sentences sentences, so a book becomes
    many documents (NSP needs random segments from other documents). Empty ones are skipped.
    "document": ordinary prose like "paragraphs", the whole file one document (a book: long
    instances, e.g. 4,096 tokens, need documents at least that long).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} (data.text_format); choose one of {list(FORMATS)}")
    f = _lines(path)
    if fmt == "sentences":
        yield from _blocks(f)
        return
    doc: list[str] = []
    for block in _blocks(f):
        doc += split_sentences(" ".join(block))
        if len(doc) >= doc_sentences and fmt == "paragraphs":
            yield doc
            doc = []
    if doc:
        yield doc


def tokenize_document(sentences: Iterable[str], tokenizer: Tokenizer) -> TokenizedDocument:
    """Token ids per sentence, dropping empty ones like the original."""
    return [ids for ids in tokenizer.encode_batch(list(sentences)) if len(ids)]


def document_rng(seed: int, doc_index: int, epoch: int) -> np.random.Generator:
    """The generator for one document in one epoch (or one dupe_factor copy)."""
    return np.random.default_rng((seed, doc_index, epoch))


@dataclasses.dataclass(frozen=True, eq=False)
class Instance:
    """One NSP pair before masking; is_random_next: B is a random segment of another doc."""

    tokens_a: np.ndarray
    tokens_b: np.ndarray
    is_random_next: bool


def _trim(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Keeps n tokens, each removed one taken from the front or the back with prob 1/2."""
    front = int(rng.binomial(len(x) - n, 0.5)) if len(x) > n else 0
    return x[front:front + n]


def truncate_seq_pair(a: np.ndarray, b: np.ndarray, max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """create_pretraining_data's truncation: the lengths of vocab.truncate_seq_pair (drop from
    the longer side, B on ties), but each dropped token from the front or the back at random."""
    # Which side loses a token does not depend on the rng, so the lengths are the closed form's;
    # the front/back coin flips then sum to a binomial count per side.
    len_a, len_b = pair_lengths(len(a), len(b), max_num_tokens)
    return _trim(a, len_a, rng), _trim(b, len_b, rng)


def _random_segment(doc_index: int, num_docs: int, get_doc: Callable[[int], TokenizedDocument],
                    target_length: int, rng: np.random.Generator) -> np.ndarray:
    """Sentences from a random start in a random other document, up to target_length."""
    for _ in range(10):  # the original's retries: with one document it ends up using itself
        other = int(rng.integers(num_docs))
        if other != doc_index:
            break
    doc = get_doc(other)
    if not doc:
        raise ValueError(f"document {other} is empty; skip empty documents when indexing")
    pieces, n = [], 0
    for sentence in doc[int(rng.integers(len(doc))):]:
        pieces.append(sentence)
        n += len(sentence)
        if n >= target_length:
            break
    return np.concatenate(pieces)


def create_instances(doc: TokenizedDocument, doc_index: int, *, num_docs: int,
                     get_doc: Callable[[int], TokenizedDocument], max_seq_length: int,
                     short_seq_prob: float, rng: np.random.Generator) -> list[Instance]:
    """NSP instances of one document, as the original create_instances_from_document."""
    max_num_tokens = max_seq_length - 3  # room for [CLS] A [SEP] B [SEP]
    # Mostly fill the sequence (padding is wasted compute) but sometimes aim short, so that
    # pretraining also sees fine-tuning's short inputs; chosen once per document, as originally.
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens, endpoint=True))
    instances: list[Instance] = []
    chunk: list[np.ndarray] = []
    length, i = 0, 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = np.concatenate(chunk[:a_end])
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                b = _random_segment(doc_index, num_docs, get_doc, target - len(a), rng)
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                b = np.concatenate(chunk[a_end:])
            a, b = truncate_seq_pair(a, b, max_num_tokens, rng)
            instances.append(Instance(a, b, is_random_next))
            chunk, length = [], 0
        i += 1
    return instances


def _random_ids(n: int, vocab_size: int, special: np.ndarray, rng: np.random.Generator,
                random_token_ids: np.ndarray | None) -> np.ndarray:
    """n uniform ids from random_token_ids, or else from the vocab's non-special ids."""
    if random_token_ids is not None:
        return np.asarray(random_token_ids)[rng.integers(len(random_token_ids), size=n)]
    # The r-th non-special id, without building the (vocab-sized) list of them.
    r = rng.integers(vocab_size - len(special), size=n)
    for s in special:  # ascending
        r += r >= s
    return r


def _whole_word_positions(candidates: np.ndarray, word_starts: np.ndarray, special: np.ndarray,
                          num_to_predict: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of randomly chosen whole words, a word only if it fits in the budget."""
    # A special token also ends a word: unlike the original, a '##' piece starting B (cut by
    # truncation) does not join the last word of A across the [SEP].
    after_special = np.concatenate([[True], special[:-1]])
    bounds = np.flatnonzero((word_starts | after_special)[candidates])
    sizes = np.diff(bounds, append=len(candidates))
    chosen, n = [], 0
    for g in rng.permutation(len(bounds)):
        if n >= num_to_predict:
            break
        if n + sizes[g] <= num_to_predict:
            chosen.append(candidates[bounds[g]:bounds[g] + sizes[g]])
            n += sizes[g]
    return np.concatenate(chosen) if chosen else candidates[:0]


def mask_instance(tokens: np.ndarray, *, rng: np.random.Generator, vocab_size: int,
                  special_ids: Iterable[int], mask_id: int, max_predictions_per_seq: int,
                  masked_lm_prob: float = 0.15, word_starts: np.ndarray | None = None,
                  random_token_ids: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT's masked LM on one sequence -> (masked ids, sorted positions, original ids).

    Chooses min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob))) non-
    special positions (len counts [CLS]/[SEP], as the original); whole words when word_starts
    is given. Of those: 80% [MASK], 10% a random id (random_token_ids, default every
    non-special id; the original drew from the whole vocab), 10% unchanged.
    """
    tokens = np.asarray(tokens)
    special_set = {int(s) for s in special_ids} | {int(mask_id)}
    special = (tokens[:, None] == np.array(list(special_set))).any(1)  # a few ids: beats isin
    candidates = np.flatnonzero(~special)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    if word_starts is None:
        positions = rng.permutation(candidates)[:num_to_predict]
    else:
        positions = _whole_word_positions(candidates, np.asarray(word_starts, bool), special,
                                          num_to_predict, rng)
    positions = np.sort(positions)
    labels = tokens[positions]
    masked = tokens.copy()
    u = rng.random(len(positions))  # one draw, same odds as the original's two coin flips
    masked[positions[u < 0.8]] = mask_id
    replace = positions[u >= 0.9]
    in_vocab = np.array(sorted(s for s in special_set if 0 <= s < vocab_size), np.int64)
    masked[replace] = _random_ids(len(replace), vocab_size, in_vocab, rng, random_token_ids)
    return masked, positions.astype(np.int32), labels


def instance_features(instance: Instance, *, rng: np.random.Generator, cls_id: int, sep_id: int,
                      max_seq_length: int, max_predictions_per_seq: int, vocab_size: int,
                      special_ids: Iterable[int], mask_id: int, masked_lm_prob: float = 0.15,
                      starts_word: np.ndarray | None = None,
                      random_token_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Masks `[CLS] A [SEP] B [SEP]`: the instance's features, unpadded (n tokens, k masked
    positions, one NSP label; `pad_features` pads them, `pack_row` packs several per row).

    starts_word: per vocab id, whether it starts a word (`tokenizer.word_starts(all ids)`),
    for whole-word masking; None masks single wordpieces.
    """
    a, b = instance.tokens_a, instance.tokens_b
    tokens = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]]).astype(np.int32)
    if len(tokens) > max_seq_length:
        raise ValueError(f"instance has {len(tokens)} tokens > max_seq_length={max_seq_length}")
    f = mask_tokens(tokens, rng=rng, vocab_size=vocab_size, special_ids=special_ids,
                    mask_id=mask_id, max_predictions_per_seq=max_predictions_per_seq,
                    masked_lm_prob=masked_lm_prob, starts_word=starts_word,
                    random_token_ids=random_token_ids)
    f["token_type_ids"][len(a) + 2:] = 1
    f["next_sentence_labels"] = np.array([int(instance.is_random_next)], np.int32)  # 1 = random
    return f


def mask_tokens(tokens: np.ndarray, *, rng: np.random.Generator, vocab_size: int,
                special_ids: Iterable[int], mask_id: int, max_predictions_per_seq: int,
                masked_lm_prob: float, starts_word: np.ndarray | None = None,
                random_token_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`mask_instance` of one sequence as unpadded features (token types all 0)."""
    masked, positions, labels = mask_instance(
        tokens, rng=rng, vocab_size=vocab_size, special_ids=special_ids, mask_id=mask_id,
        max_predictions_per_seq=max_predictions_per_seq, masked_lm_prob=masked_lm_prob,
        word_starts=None if starts_word is None else np.asarray(starts_word)[tokens],
        random_token_ids=random_token_ids)
    return {"input_ids": masked.astype(np.int32), "token_type_ids": np.zeros(len(tokens), np.int32),
            "masked_lm_positions": positions, "masked_lm_ids": labels.astype(np.int32)}


# MLM-only data (data.instances; model.nsp=False): no sentence pairs, no NSP labels.
#   "packed"     each document's tokens (its sentences joined) cut into pieces of at most
#                T - 2, each a sequence `[CLS] piece [SEP]`, masked alone; packing.first_fit
#                packs the sequences into rows (segment ids, positions restarting), so
#                attention stays within a document (RoBERTa's DOC-SENTENCES, ModernBERT).
#   "full_rows"  the documents' tokens concatenated, each document closed by [SEP], cut into
#                rows of `[CLS]` + T - 1 tokens (RoBERTa's FULL-SENTENCES): every row full,
#                attention across the documents a row holds. Each token carries its document,
#                epoch and offset, so a row's masking is a pure function of where it starts.


def document_pieces(doc: TokenizedDocument, max_tokens: int) -> list[np.ndarray]:
    """The document's tokens (sentences joined) in consecutive pieces of max_tokens, the
    last shorter."""
    tokens = np.concatenate(doc).astype(np.int32)
    return [tokens[i:i + max_tokens] for i in range(0, len(tokens), max_tokens)]


def sequence_features(piece: np.ndarray, *, cls_id: int, sep_id: int, max_seq_length: int,
                      **mask) -> dict[str, np.ndarray]:
    """`[CLS] piece [SEP]` masked (mask_tokens' arguments), unpadded: one sequence of a packed
    row (data.instances="packed")."""
    tokens = np.concatenate([[cls_id], piece, [sep_id]]).astype(np.int32)
    if len(tokens) > max_seq_length:
        raise ValueError(f"sequence has {len(tokens)} tokens > max_seq_length={max_seq_length}")
    return mask_tokens(tokens, **mask)


STREAM_KEYS = ("tokens", "doc", "epoch", "offset")  # full_rows' per-token arrays


def document_stream(doc: TokenizedDocument, doc_index: int, epoch: int, sep_id: int
                    ) -> dict[str, np.ndarray]:
    """A document as full_rows concatenates it: its tokens then [SEP], and per token its
    document, epoch and offset in the document (which seed the masking of a row it starts)."""
    tokens = np.concatenate([*doc, [sep_id]]).astype(np.int32)
    n = len(tokens)
    return {"tokens": tokens, "doc": np.full(n, doc_index, np.int32),
            "epoch": np.full(n, epoch, np.int32), "offset": np.arange(n, dtype=np.int32)}


def full_row_features(row: dict[str, np.ndarray], *, seed: int, cls_id: int, max_seq_length: int,
                      max_predictions_per_seq: int, **mask) -> dict[str, np.ndarray]:
    """A row of concatenated document streams (T - 1 tokens from grain's concat-then-split;
    fewer only at the end of an evaluation pass) -> `[CLS]` + the tokens, masked with a
    generator seeded by (seed, document, epoch, offset) of its first token, padded features."""
    n = int((row["tokens_segment_ids"] > 0).sum())
    rng = np.random.default_rng((seed, int(row["doc"][0]), int(row["epoch"][0]),
                                 int(row["offset"][0])))
    tokens = np.concatenate([[cls_id], row["tokens"][:n]]).astype(np.int32)
    f = mask_tokens(tokens, rng=rng, max_predictions_per_seq=max_predictions_per_seq, **mask)
    return pad_features(f, max_seq_length, max_predictions_per_seq)


def pad_features(f: dict[str, np.ndarray], max_seq_length: int, max_predictions_per_seq: int
                 ) -> dict[str, np.ndarray]:
    """One instance's features padded into the trainer's row (padding is id 0, as the original)."""
    n, k = len(f["input_ids"]), len(f["masked_lm_positions"])
    T, P = max_seq_length, max_predictions_per_seq
    return {"input_ids": np.pad(f["input_ids"], (0, T - n)),
            "token_type_ids": np.pad(f["token_type_ids"], (0, T - n)),
            "attention_mask": (np.arange(T) < n).astype(np.int32),
            "masked_lm_positions": np.pad(f["masked_lm_positions"], (0, P - k)),
            "masked_lm_ids": np.pad(f["masked_lm_ids"], (0, P - k)),
            "masked_lm_weights": (np.arange(P) < k).astype(np.float32),
            **({"next_sentence_labels": f["next_sentence_labels"].reshape(())}
               if "next_sentence_labels" in f else {})}


def to_features(instance: Instance, **kwargs) -> dict[str, np.ndarray]:
    """`instance_features` padded to max_seq_length tokens and max_predictions_per_seq."""
    f = instance_features(instance, **kwargs)
    return pad_features(f, kwargs["max_seq_length"], kwargs["max_predictions_per_seq"])


# Each key's room in a packed row: T tokens, P predictions, S instances (NSP labels; None:
# MLM only, any number of sequences a row).
def pack_lengths(max_seq_length: int, max_predictions_per_seq: int, max_instances: int | None
                 ) -> dict[str, int]:
    T, P = max_seq_length, max_predictions_per_seq
    lengths = {"input_ids": T, "token_type_ids": T, "masked_lm_positions": P, "masked_lm_ids": P}
    if max_instances is not None:
        lengths["next_sentence_labels"] = max_instances
    return lengths


def pack_row(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A row of several instances from packing.first_fit (each key padded to its pack_lengths,
    with `<key>_segment_ids` 1, 2, ... per instance and 0 for padding) -> a packed BERT row
    (data/packing.py): segment_ids hold each token's instance id, positions restart at 0 in
    each instance, masked_lm_positions point into the row, and each instance's NSP label is
    read at its [CLS], next_sentence_positions (next_sentence_weights 0 = empty slot; MLM-only
    sequences have no NSP keys).
    """
    token_seg = packed["input_ids_segment_ids"]
    starts = np.zeros(len(token_seg) + 1, np.int32)  # row offset of each instance id
    ids, first = np.unique(token_seg, return_index=True)
    starts[ids] = first
    mlm_seg = packed["masked_lm_positions_segment_ids"]
    row = {"input_ids": packed["input_ids"], "token_type_ids": packed["token_type_ids"],
           "segment_ids": token_seg.astype(np.int32),
           "positions": packed["input_ids_positions"].astype(np.int32),
           "masked_lm_positions": np.where(mlm_seg > 0, packed["masked_lm_positions"]
                                           + starts[mlm_seg], 0).astype(np.int32),
           "masked_lm_ids": packed["masked_lm_ids"],
           "masked_lm_weights": (mlm_seg > 0).astype(np.float32)}
    if "next_sentence_labels" not in packed:  # MLM only (data.instances="packed")
        return row
    nsp_seg = packed["next_sentence_labels_segment_ids"]
    return {**row, "next_sentence_labels": packed["next_sentence_labels"],
            "next_sentence_positions": np.where(nsp_seg > 0, starts[nsp_seg], 0).astype(np.int32),
            "next_sentence_weights": (nsp_seg > 0).astype(np.float32)}
