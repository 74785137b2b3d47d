"""The tokenizer API: trains WordPiece or SentencePiece vocabularies and loads either, or a
RoBERTa-style byte-level BPE, behind one Tokenizer (ids of text and their character offsets,
BERT's [CLS] A [SEP] B [SEP] inputs or RoBERTa's <s> A </s></s> B </s>, tokens and word starts
of ids)."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import heapq
import itertools
import json
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import sentencepiece as spm
from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as tokenizer_models

from bert_jax import paths
from bert_jax.data.rows import utf8_errors
from bert_jax.data.wordpiece import (
    CONFIG_NAME,
    JSON_NAME,
    SPECIAL_TOKENS,
    VOCAB_NAME,
    WordPieceTokenizer,
    load_vocab,  # noqa: F401  (the tokenizer API's: tokenizer.load_vocab)
    load_wordpiece_vocab,
    tokenizer_json,
    vocab_file,
)

META_NAME, SPM_NAME, SPM_VOCAB_NAME = "bert_jax_tokenizer.json", "spm.model", "spm.vocab"
# The tokenizer_config.json of the Hugging Face folder a checkpoint was converted from, kept as
# it was: `export` writes its decoding settings back (interop/export.py).
HF_SOURCE_NAME = "hf_source_tokenizer_config.json"
SP_SPACE = "\u2581"  # "▁": SentencePiece's marker for a preceding space, i.e. a word start
# Byte-level BPE (GPT-2, RoBERTa): HF's fast tokenizer.json, or the vocab.json + merges.txt pair.
BPE_JSON, BPE_VOCAB, BPE_MERGES = JSON_NAME, "vocab.json", "merges.txt"
# The files of each kind whose SHA-256 bert_jax_tokenizer.json records (_write_meta).
RECORDED_FILES = {"wordpiece": (VOCAB_NAME,), "sentencepiece": (SPM_NAME,),
                  "bpe": (BPE_JSON, BPE_VOCAB, BPE_MERGES)}
Kind = Literal["wordpiece", "sentencepiece", "bpe"]


def _text_lines(inputs: Iterable[str], source: str) -> Iterator[str]:
    """The non-blank lines, with at least one checked up front (trainers fail obscurely on
    none); `source` names the inputs in that error."""
    if isinstance(inputs, str | Path):  # iterating a path or a str would train on its characters
        raise TypeError(f"train_vocab: inputs must be an iterable of text lines, got {inputs!r}")
    lines = (line for line in inputs if line.strip())
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{source}: no text to train on (empty, or blank lines only); give text "
                         "to learn the vocabulary from")
    return itertools.chain([first], lines)


def _train_wordpiece(lines: Iterator[str], size: int, out_dir: Path, lowercase: bool,
                     min_frequency: int = 2, limit_alphabet: int = 1000) -> int:
    """Writes vocab.txt (+ HF tokenizer_config.json); returns the vocab size (may be < size).

    The algorithm of tokenizers' WordPieceTrainer (BPE over words split the BERT way, with
    '##' on word-internal symbols; its min_frequency and limit_alphabet defaults), written
    out here because that trainer breaks ties between equally frequent pairs in hash-map
    order, so its vocab changed from run to run. Here ties go to the smaller pair (as
    strings): the same text always gives the same vocab.txt."""
    # NFC first because WordPieceTokenizer (like HF's BertTokenizer) composes before lowercasing,
    # so the vocab holds the forms it will look up; lowercase + strip accents is BERT uncased.
    normalizer = normalizers.Sequence([
        normalizers.NFC(), normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)])
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    word_counts: collections.Counter[str] = collections.Counter()
    for line in lines:
        word_counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    char_counts: collections.Counter[str] = collections.Counter()
    for word, n in word_counts.items():
        for ch in word:
            char_counts[ch] += n
    alphabet = set(sorted(char_counts, key=lambda c: (-char_counts[c], c))[:limit_alphabet])
    # Words with a character outside the alphabet are [UNK] anyway: left out.
    kept = [w for w in sorted(word_counts) if set(w) <= alphabet]
    words = [[w[0]] + ["##" + c for c in w[1:]] for w in kept]
    counts = [word_counts[w] for w in kept]
    vocab = list(SPECIAL_TOKENS) + sorted({s for syms in words for s in syms} - set(SPECIAL_TOKENS))
    if len(vocab) > size:
        raise ValueError(f"train_vocab: size={size} is too small for this text: the "
                         f"{len(SPECIAL_TOKENS)} special tokens and its characters (alone and "
                         f"'##'-prefixed) already need {len(vocab)}; use size > {len(vocab)}")
    known = set(vocab)
    pair_counts: collections.Counter[tuple[str, str]] = collections.Counter()
    where: dict[tuple[str, str], set[int]] = collections.defaultdict(set)  # words with the pair
    for i, syms in enumerate(words):
        for pair in zip(syms, syms[1:]):
            pair_counts[pair] += counts[i]
            where[pair].add(i)
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < size and heap:
        n, a, b = heapq.heappop(heap)
        if -n != pair_counts.get((a, b)):
            continue  # stale: the pair's count changed and was pushed again
        if -n < min_frequency:
            break
        merged = a + b.removeprefix("##")
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        changed = set()
        for i in where.pop((a, b)):
            syms, c = words[i], counts[i]
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            if len(out) == len(syms):
                continue
            for pair in zip(syms, syms[1:]):
                pair_counts[pair] -= c
                changed.add(pair)
            for pair in zip(out, out[1:]):
                pair_counts[pair] += c
                where[pair].add(i)
                changed.add(pair)
            words[i] = out
        pair_counts.pop((a, b), None)
        changed.discard((a, b))
        for pair in sorted(changed):
            if pair_counts[pair] > 0:
                heapq.heappush(heap, (-pair_counts[pair], *pair))
            else:
                pair_counts.pop(pair)
    WordPieceTokenizer(vocab, lowercase=lowercase).save(out_dir)
    return len(vocab)


def _train_sentencepiece(lines: Iterator[str], size: int, out_dir: Path, lowercase: bool,
                         model_type: str, size_name: str = "train_vocab: size") -> int:
    """Writes spm.model and spm.vocab; returns the vocab size (may be < size)."""
    failed: list[Exception] = []

    def checked_lines() -> Iterator[str]:  # sentencepiece wraps the input's errors in its own
        try:
            yield from lines
        except Exception as e:
            failed.append(e)
            raise

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=checked_lines(), model_prefix=str(out_dir / "spm"), model_type=model_type,
            vocab_size=size, hard_vocab_limit=False,  # size is a maximum, as for WordPiece
            # [PAD]=0 [UNK]=1, then [CLS] [SEP] [MASK] = 2 3 4 as control symbols: ids that
            # sentencepiece reserves but never produces from text, so a literal "[MASK]" in the
            # text is split like any other word (as BERT's own tokenizer does).
            pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=SPECIAL_TOKENS[0],
            unk_piece=SPECIAL_TOKENS[1], control_symbols=list(SPECIAL_TOKENS[2:]),
            # "_cf" adds case folding; it is stored in spm.model, so encoding lowercases too.
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            # Sample at most 10M lines (sentencepiece holds its input in memory) and keep
            # paragraphs up to 64 KiB rather than dropping those over the 4 KiB default.
            input_sentence_size=10_000_000, shuffle_input_sentence=True, max_sentence_length=1 << 16,
            minloglevel=2)
    except RuntimeError as e:  # e.g. "Vocabulary size is smaller than required_chars. 20 vs 42."
        if failed:
            raise failed[0] from None
        raise ValueError(f"sentencepiece cannot train a {model_type} vocab of "
                         f"{size_name}={size} on this text: {str(e).split('] ')[-1]}") from e
    return spm.SentencePieceProcessor(model_file=str(out_dir / SPM_NAME)).get_piece_size()


def train_vocab(inputs: Iterable[str], *, size: int, kind: Kind, out_dir: str | Path,
                lowercase: bool = True, sp_model_type: Literal["unigram", "bpe"] = "unigram",
                source: str = "train_vocab: inputs", size_name: str = "train_vocab: size",
                **options: bool) -> Path:
    """Trains a vocab of at most `size` tokens on text lines into out_dir (local or gs://: written
    locally, then uploaded); returns out_dir. WordPiece `options` (final_sigma,
    keep_special_tokens; see WordPieceTokenizer) are stored for load_tokenizer; `source` and
    `size_name` name the inputs and the size in errors (the command's flags)."""
    if kind not in ("wordpiece", "sentencepiece"):
        raise ValueError(f"train_vocab: kind={kind!r}, expected 'wordpiece' or 'sentencepiece'")
    if sp_model_type not in ("unigram", "bpe"):
        raise ValueError(f"train_vocab: sp_model_type={sp_model_type!r}, expected 'unigram' or 'bpe'")
    if bad := sorted(set(options) - set(WORDPIECE_OPTIONS if kind == "wordpiece" else ())):
        raise ValueError(f"train_vocab: unknown option(s) {bad} for kind={kind!r}; only WordPiece "
                         f"has options: {' '.join(WORDPIECE_OPTIONS)}")
    if size <= len(SPECIAL_TOKENS):
        raise ValueError(f"{size_name}={size} leaves no room beside the special tokens "
                         f"{' '.join(SPECIAL_TOKENS)}; use at least {len(SPECIAL_TOKENS) + 1}")
    lines = _text_lines(inputs, source)
    with paths.staged_output(out_dir) as local:
        fresh = not local.exists()
        local.mkdir(parents=True, exist_ok=True)
        try:
            if kind == "wordpiece":
                n = _train_wordpiece(lines, size, local, lowercase)
            else:
                n = _train_sentencepiece(lines, size, local, lowercase, sp_model_type, size_name)
        except BaseException:  # e.g. a bad input line: leave no empty folder behind
            if fresh:
                shutil.rmtree(local, ignore_errors=True)
            raise
        defaults = WORDPIECE_OPTIONS if kind == "wordpiece" else {}
        _write_meta(local, kind, lowercase, n, **{**defaults, **options})
    return paths.path(out_dir)


def _write_meta(directory: Path, kind: Kind, lowercase: bool, vocab_size: int, **options: bool) -> None:
    """bert_jax_tokenizer.json: what load_tokenizer needs beyond the vocab file (the options too,
    so that a tokenizer saved with a run or by convert tokenizes the same when loaded), and the
    vocab's size and files' SHA-256 (RECORDED_FILES), which load_tokenizer checks: a vocab file
    changed after it was saved would give a model trained with it other ids, silently."""
    digests = {name: _sha256(directory / name) for name in RECORDED_FILES[kind]
               if (directory / name).is_file()}
    meta = {"kind": kind, "lowercase": lowercase, "vocab_size": vocab_size, **options, "sha256": digests}
    (directory / META_NAME).write_text(json.dumps(meta, indent=2) + "\n", "utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_record(tok: Tokenizer) -> None:
    """A tokenizer against its folder's bert_jax_tokenizer.json (written with it): its number of
    tokens, and the SHA-256 of its files where the record holds them (folders saved before it
    did are checked by the count alone). A disagreement is a ValueError naming both files."""
    meta = _metadata(tok.directory)
    record = tok.directory / META_NAME
    fix = (f"the tokenizer files were changed after they were saved, and a model trained with them "
           f"would read other ids: restore them from a copy of the folder; if you edited a vocab "
           f"folder on purpose (not a checkpoint's), delete \"vocab_size\" and \"sha256\" from {record}")
    recorded = meta.get("vocab_size")  # (absent: a folder written before the record held it)
    if type(recorded) is int and recorded != tok.vocab_size:
        raise ValueError(f"{tok.vocab_file}: {tok.vocab_size} tokens, but {record} records "
                         f"vocab_size={recorded}; {fix}")
    digests = meta.get("sha256", {})
    if not isinstance(digests, dict):
        raise ValueError(f"{record}: sha256={digests!r}, expected an object of file names and "
                         f"digests; fix the file or remove the key")
    for name, digest in sorted(digests.items()):
        if (tok.directory / name).is_file() and _sha256(tok.directory / name) != digest:
            raise ValueError(f"{tok.directory / name}: its content differs from the one {record} "
                             f"records (SHA-256); {fix}")


# transformers' clean_up_tokenization (tokenization_utils_base.py): what HF's slow BertTokenizer,
# and a fast one with clean_up_tokenization_spaces=True, apply to decoded text, in this order.
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """Decoded WordPiece text with HF's spacing: no space before . ? ! , and English contractions."""
    for old, new in _CLEAN_UP:
        text = text.replace(old, new)
    return text


def pair_lengths(len_a: int, len_b: int, max_length: int) -> tuple[int, int]:
    """How many tokens of A and B the original _truncate_seq_pair keeps: it pops the last token of
    the longer side (B on a tie) until len_a + len_b <= max_length. In closed form."""
    if len_a + len_b <= max_length:
        return len_a, len_b
    keep_a = min(len_a, max(-(-max_length // 2), max_length - len_b))
    return keep_a, max_length - keep_a


def truncate_seq_pair(a: Sequence, b: Sequence | None, max_length: int) -> tuple[Sequence, Sequence | None]:
    """A and B cut to their pair_lengths (the original run_classifier truncation); b None cuts a alone."""
    if b is None:
        return a[:max_length], None
    keep_a, keep_b = pair_lengths(len(a), len(b), max_length)
    return a[:keep_a], b[:keep_b]


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """One example: [CLS] A [SEP] (B [SEP]) as tokens, their ids and segment (token type) ids."""

    tokens: list[str]
    input_ids: list[int]
    token_type_ids: list[int]


class Tokenizer:
    """A vocab's ids for text, BERT inputs, tokens for ids and word starts; built by load_tokenizer.

    A WordPiece vocab needs only [UNK] to tokenize; pad_id, cls_id, sep_id and mask_id raise,
    naming the vocab file and the token, where a use needs one the vocab lacks."""

    def __init__(self, directory: Path, kind: Kind, pieces: list[str], lowercase: bool,
                 ids: Sequence[int | None], starts: np.ndarray, vocab_file: Path) -> None:
        self.directory, self.kind, self.lowercase = directory, kind, lowercase
        self.pieces = pieces  # token string of each id
        self.vocab_size = len(pieces)
        self._special = dict(zip(SPECIAL_TOKENS, ids))  # None: not in the vocab
        self.unk_id = ids[1]
        self.special_ids = {i for i in ids if i is not None}
        self._starts = starts  # [vocab_size] bool
        self.vocab_file = vocab_file

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, {self.vocab_size} tokens, {str(self.directory)!r})"

    def _special_id(self, token: str) -> int:
        """The id of a special token, or a ValueError naming the vocab file that lacks it."""
        if (i := self._special[token]) is None:
            if self.kind == "bpe":  # its tokens are named by tokenizer_config.json
                role = BPE_ROLES[token]
                raise ValueError(f"{self.vocab_file}: the vocab has no {role} token "
                                 f"{self._bpe_names[role]!r}, which this use needs; set {role} in "
                                 f"{CONFIG_NAME} to one it has")
            raise ValueError(f"{self.vocab_file}: the vocab has no {token} token, which this use needs "
                             f"(BERT inputs need [CLS] [SEP] [PAD], pretraining [MASK]); add {token} "
                             "to the vocab or use a vocab made by `bert-jax vocab`")
        return i

    def missing(self, tokens: Sequence[str] = ("[CLS]", "[SEP]", "[PAD]")) -> list[str]:
        """Which of the special tokens `tokens` (by their BERT names; default: what every BERT
        input holds) the vocab lacks, each by its name in this vocab (a BPE vocab's own)."""
        return [repr(self._bpe_names[BPE_ROLES[t]]) if self.kind == "bpe" else t
                for t in tokens if self._special[t] is None]

    pad_id = property(lambda self: self._special_id("[PAD]"))
    cls_id = property(lambda self: self._special_id("[CLS]"))
    sep_id = property(lambda self: self._special_id("[SEP]"))
    mask_id = property(lambda self: self._special_id("[MASK]"))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, without [CLS]/[SEP] (batched and parallel in C++/Rust)."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int], clean_up_spaces: bool = False) -> str:
        """Readable text of the ids: [PAD] dropped, other special tokens shown by name;
        clean_up_spaces: WordPiece text with transformers' clean_up_tokenization."""
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32) of one text, without [CLS]/[SEP]."""
        return self.encode_batch([text])[0]

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """encode's ids and, for each, the (start, end) characters of text it covers ([n, 2]
        int32), as HF's return_offsets_mapping."""
        raise NotImplementedError

    def save(self, directory: str | Path) -> None:
        """Writes the tokenizer files into directory (so a checkpoint carries its tokenizer)."""
        raise NotImplementedError

    # [SEP]s between A and B, and B's segment id: BERT's; RoBERTa's is </s></s> and one segment.
    pair_seps, segment_b = 1, 1

    def n_special(self, pair: bool) -> int:
        """How many special tokens a row of one text (pair=False) or of two holds."""
        return 2 + pair * self.pair_seps

    def pair_rows(self, ids_a: Sequence[np.ndarray], ids_b: Sequence[np.ndarray | None],
                  max_seq_length: int) -> dict[str, np.ndarray]:
        """[CLS] a [SEP] (b [SEP]) rows (RoBERTa's: <s> a </s> (</s> b </s>)), truncated and
        padded: input_ids, token_type_ids (A/B), attention_mask [N, T] (data/packing.py)."""
        n = len(ids_a)
        cls, sep = [self.cls_id], [self.sep_id]
        rows = []  # (the row, the length of its [CLS] A [SEP])
        for a, b in zip(ids_a, ids_b):
            a, b = truncate_seq_pair(a, b, max_seq_length - self.n_special(b is not None))
            first = np.concatenate([cls, a, sep])
            rows.append((first if b is None else
                         np.concatenate([first, *[sep] * (self.pair_seps - 1), b, sep]), first.size))
        # [PAD] only where a row needs padding: encode_pair's exact-length rows need none.
        pad = self.pad_id if any(row.size < max_seq_length for row, _ in rows) else 0
        input_ids = np.full((n, max_seq_length), pad, np.int32)
        token_type_ids = np.zeros((n, max_seq_length), np.int32)
        attention_mask = np.zeros((n, max_seq_length), np.int32)
        for i, (row, n_first) in enumerate(rows):
            input_ids[i, :row.size] = row
            attention_mask[i, :row.size] = 1
            token_type_ids[i, n_first:row.size] = self.segment_b
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}

    def encode_pairs(self, texts_a: Sequence[str], texts_b: Sequence[str | None],
                     max_seq_length: int) -> dict[str, np.ndarray]:
        """pair_rows of the texts (a text_b of None: a single sentence), encoded in two batches."""
        ids_a = self.encode_batch(texts_a)
        encoded_b = iter(self.encode_batch([t for t in texts_b if t is not None]))
        ids_b = [None if t is None else next(encoded_b) for t in texts_b]
        return self.pair_rows(ids_a, ids_b, max_seq_length)

    def encode_pair(self, text_a: str, text_b: str | None = None,
                    max_length: int | None = None) -> Encoded:
        """One example's [CLS] A [SEP] (B [SEP]), truncated to max_length as BERT's run_classifier."""
        ids = self.encode_batch([text_a] if text_b is None else [text_a, text_b])
        a, b = ids[0], None if text_b is None else ids[1]
        n_special = self.n_special(b is not None)
        if max_length is None:  # no truncation: exactly as long as the example
            max_length = len(a) + n_special + (0 if b is None else len(b))
        elif max_length < n_special:
            raise ValueError(f"max_length={max_length} < {n_special} special tokens")
        row = {k: v[0] for k, v in self.pair_rows([a], [b], max_length).items()}
        n = int(row["attention_mask"].sum())
        input_ids = row["input_ids"][:n].tolist()
        return Encoded(self.tokens(input_ids), input_ids, row["token_type_ids"][:n].tolist())

    def _checked(self, ids: Iterable[int]) -> np.ndarray:
        ids = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), np.int64)
        if (bad := ids[(ids < 0) | (ids >= self.vocab_size)]).size:
            raise ValueError(f"token ids {bad[:5].tolist()} outside vocab of size {self.vocab_size}")
        return ids

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of the ids (flattened)."""
        return [self.pieces[i] for i in self._checked(ids).ravel().tolist()]

    def word_starts(self, ids: Iterable[int]) -> np.ndarray:
        """True where a token begins a word (whole-word masking); any shape; specials are words."""
        return self._starts[self._checked(ids)]

    def check_fits(self, model_vocab_size: int, where: str) -> None:
        """Raises unless a model embedding of model_vocab_size rows covers every id (larger is fine)."""
        if self.vocab_size > model_vocab_size:
            raise ValueError(
                f"tokenizer in {self.directory} has {self.vocab_size} tokens but model.vocab_size="
                f"{model_vocab_size} ({where}); set --config.model.vocab_size={self.vocab_size} or "
                f"train a vocab of size <= {model_vocab_size}")


class _WordPiece(Tokenizer):
    """BERT WordPiece over our WordPieceTokenizer (Rust fast path, exact reference results)."""

    def __init__(self, directory: Path, lowercase: bool | None, final_sigma: bool | None = None,
                 keep_special_tokens: bool | None = None) -> None:
        meta = _metadata(directory)
        if lowercase is None:
            hf = _json_or_empty(directory / CONFIG_NAME)  # HF tokenizer_config.json, if any
            lowercase = meta.get("lowercase", hf.get("do_lower_case"))
        if lowercase is None:  # no stated casing: uncased unless the vocab has an uppercase token
            vocab = load_wordpiece_vocab(vocab_file(directory))
            lowercase = not any(t != t.lower() for t in vocab if not (t[:1] == "[" and t[-1:] == "]"))
        # Ours are in bert_jax_tokenizer.json; absent (a folder from before them, or from HF):
        # WORDPIECE_OPTIONS, i.e. Google's behaviour.
        self.final_sigma = _option(directory, meta, "final_sigma", final_sigma)
        self.keep_special_tokens = _option(directory, meta, "keep_special_tokens", keep_special_tokens)
        # The other options (strip_accents, ...) come from tokenizer_config.json, as in HF.
        self._wp = wp = WordPieceTokenizer.from_pretrained_dir(
            directory, lowercase=lowercase, final_sigma=self.final_sigma,
            keep_special_tokens=self.keep_special_tokens)
        starts = np.array([not t.startswith("##") for t in wp.vocab], bool)
        super().__init__(directory, "wordpiece", wp.vocab, lowercase,
                         (wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id), starts,
                         vocab_file(directory))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, without [CLS]/[SEP] (batched and parallel in Rust)."""
        return [np.asarray(self._wp.tokens_to_ids(t), np.int32) for t in self._wp.tokenize_batch(texts)]

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and character spans: a "##x" piece spans its characters (through lowercasing,
        accent stripping and NFC), [UNK] its whole word, a kept special token its literal."""
        tokens, spans = self._wp.tokenize_with_offsets(text)
        return (np.asarray(self._wp.tokens_to_ids(tokens), np.int32),
                np.asarray(spans, np.int32).reshape(-1, 2))

    def decode(self, ids: Iterable[int], clean_up_spaces: bool = False) -> str:
        """Wordpieces joined as BERT does ("##" glued on: "life ' s ."); [PAD] dropped.
        clean_up_spaces: then transformers' clean_up_tokenization ("life's."), as HF's decode."""
        text = " ".join(t for t in self.tokens(ids) if t != "[PAD]").replace(" ##", "")
        return clean_up_tokenization(text) if clean_up_spaces else text

    def save(self, directory: str | Path) -> None:
        """Writes vocab.txt and an HF tokenizer_config.json stating every option, and our options
        in bert_jax_tokenizer.json where one is not the default (or that file is already there)."""
        self._wp.save(directory)
        directory = paths.path(directory)
        options = {"final_sigma": self.final_sigma, "keep_special_tokens": self.keep_special_tokens}
        # Only then: a folder that `export` writes for transformers stays as transformers writes one.
        if options != WORDPIECE_OPTIONS or (directory / META_NAME).is_file():
            _write_meta(directory, "wordpiece", self.lowercase, self.vocab_size, **options)


class _SentencePiece(Tokenizer):
    """A SentencePiece model with BERT's special pieces; casing is fixed inside spm.model."""

    def __init__(self, directory: Path, lowercase: bool | None) -> None:
        path = directory / SPM_NAME
        if paths.is_remote(path):  # sentencepiece opens only local files: give it the bytes
            self._sp = sp = spm.SentencePieceProcessor(model_proto=path.read_bytes())
        else:
            self._sp = sp = spm.SentencePieceProcessor(model_file=str(path))
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        ids = [sp.piece_to_id(t) for t in SPECIAL_TOKENS]  # an absent piece maps to unk's id
        if missing := [t for t, i in zip(SPECIAL_TOKENS, ids) if pieces[i] != t]:
            raise ValueError(f"{path}: sentencepiece model has no special piece(s) {missing}")
        folds = sp.normalize("A") == sp.normalize("a")
        if lowercase is not None and lowercase != folds:
            raise ValueError(f"lowercase={lowercase} but {path} was trained with lowercase={folds}; "
                             "case folding is part of a sentencepiece model, so retrain to change it")
        # [PAD] [CLS] [SEP] [MASK] (control) count as words; [UNK] does not: it stands for
        # unknown characters, usually inside a word after a "▁" piece.
        starts = np.array([p.startswith(SP_SPACE) or sp.is_control(i)
                           for i, p in enumerate(pieces)], bool)
        super().__init__(directory, "sentencepiece", pieces, folds, ids, starts, path)
        self._named = self.special_ids - {self.pad_id, self.unk_id}

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, without [CLS]/[SEP] (batched and parallel in C++)."""
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(list(texts), out_type=int)]

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and the characters each piece comes from, by sentencepiece's own alignment: a "▁"
        spans the whitespace it stands for, a piece its NFKC source (or nothing, (i, i), when an
        earlier piece holds it, as "f" of "\ufb01")."""
        proto = self._sp.encode(text, return_type="proto")
        char_at = [i for i, c in enumerate(text) for _ in c.encode("utf-8")] + [len(text)]  # of bytes
        spans = [(char_at[p.begin], char_at[p.end]) for p in proto.pieces]
        return (np.asarray([p.id for p in proto.pieces], np.int32),
                np.asarray(spans, np.int32).reshape(-1, 2))

    def decode(self, ids: Iterable[int], clean_up_spaces: bool = False) -> str:
        """Detokenized text; [CLS] [SEP] [MASK] (which sentencepiece decodes to "") by name.
        clean_up_spaces changes nothing: sentencepiece restores the text's own spaces."""
        parts, run = [], []
        for i in self._checked(ids).ravel().tolist():
            if i in self._named:
                parts += [self._sp.decode(run), self.pieces[i]]
                run = []
            elif i != self.pad_id:
                run.append(i)
        return " ".join(p for p in [*parts, self._sp.decode(run)] if p)

    def save(self, directory: str | Path) -> None:
        """Copies spm.model (and spm.vocab, bert_jax_tokenizer.json when present)."""
        directory = paths.path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if _same_dir(directory, self.directory):
            return
        for name in (SPM_NAME, SPM_VOCAB_NAME, META_NAME):
            if (self.directory / name).is_file():
                paths.copy_file(self.directory / name, directory / name)


# The API's roles (pad, unk, cls, sep, mask: SPECIAL_TOKENS' order) -> tokenizer_config.json's key
# for them and RoBERTa's token (what HF's RobertaTokenizer defaults to).
BPE_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>",
                "sep_token": "</s>", "mask_token": "<mask>"}
BPE_ROLES = dict(zip(SPECIAL_TOKENS, BPE_SPECIALS))  # "[PAD]" -> "pad_token", ...


def _token_text(value: str | dict) -> str:
    """A special token as tokenizer_config.json states it: a string or a serialised AddedToken."""
    return value["content"] if isinstance(value, dict) else value


# Pair layouts of tokenizer.json's fixed post-processors: (special tokens between A and B, B's
# segment id).
_PAIR_LAYOUTS = {"BertProcessing": (1, 1), "RobertaProcessing": (2, 0)}


def _template_layout(post_processor: dict | None) -> tuple[int, int] | None:
    """(special tokens between A and B, B's segment id) of a tokenizer.json's post-processor:
    a TemplateProcessing pair template (e.g. ModernBERT's [CLS] A [SEP] B [SEP]: (1, its type
    id)) or BERT's or RoBERTa's; None without one."""
    if post_processor and post_processor.get("type") == "Sequence":
        found = [p for p in post_processor.get("processors", [])
                 if p.get("type") in ("TemplateProcessing", *_PAIR_LAYOUTS)]
        post_processor = found[0] if found else None
    if post_processor and post_processor.get("type") in _PAIR_LAYOUTS:
        return _PAIR_LAYOUTS[post_processor["type"]]
    if not post_processor or post_processor.get("type") != "TemplateProcessing":
        return None
    pair = post_processor.get("pair", [])
    sequences = [i for i, piece in enumerate(pair) if "Sequence" in piece]
    if len(sequences) != 2:
        return None
    a, b = sequences
    return b - a - 1, pair[b]["Sequence"].get("type_id", 0)


class _ByteLevelBPE(Tokenizer):
    """Byte-level BPE as HF's RobertaTokenizer: tokenizer.json if present (what the fast
    tokenizer loads), else vocab.json + merges.txt built the way transformers builds them;
    special tokens from tokenizer_config.json, else RoBERTa's (<s> ...) or, where the vocab has
    not those, BERT's ([CLS] ..., as ModernBERT's); pairs as RoBERTa's, or as tokenizer.json's
    TemplateProcessing (ModernBERT's: [CLS] A [SEP] B [SEP])."""

    pair_seps, segment_b = 2, 0

    def __init__(self, directory: Path) -> None:
        hf = _json_or_empty(directory / CONFIG_NAME)
        self._prefix_space = hf.get("add_prefix_space", False)
        if (directory / BPE_JSON).is_file():
            source = directory / BPE_JSON
            self._tok = tok = tokenizer_json(source)
            if not isinstance(tok.model, tokenizer_models.BPE):
                raise ValueError(f"{source}: a {type(tok.model).__name__} tokenizer; {BPE_JSON} is read "
                                 "with byte-level BPE (RoBERTa, ModernBERT) or BERT's WordPiece")
            tok.no_truncation()  # a saved tokenizer.json may say to cut or pad: rows do that here
            tok.no_padding()
            layout = _template_layout(json.loads(tok.to_str()).get("post_processor"))
            if layout is not None:
                self.pair_seps, self.segment_b = layout
            vocab = tok.get_vocab(with_added_tokens=True)
        else:
            source = directory / BPE_VOCAB
            if not source.is_file():
                raise FileNotFoundError(f"{source}: not found; a byte-level BPE tokenizer is "
                                        f"{BPE_VOCAB} + {BPE_MERGES} (or {BPE_JSON})")
            vocab = _json_or_empty(source)
            bad = [t for t, i in vocab.items() if type(i) is not int or i < 0]
            if bad:
                raise ValueError(f"{source}: token {bad[0]!r} has the id {vocab[bad[0]]!r}, not an "
                                 f"integer >= 0 (a {BPE_VOCAB} maps each token to its id); {REFETCH}")
            specials = self._specials(hf, vocab)
            merges = _merges(directory / BPE_MERGES, vocab)
            self._tok = tok = HFTokenizer(tokenizer_models.BPE(
                vocab, merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=self._prefix_space)
            tok.decoder = decoders.ByteLevel()
            # As transformers 5 builds it: special tokens written in the text are those tokens.
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in specials if t in vocab])
        specials = self._specials(hf, vocab)
        ids = [tok.token_to_id(t) for t in specials]
        if tok.post_processor is None and None not in ids[2:4]:  # what export's HF folder encodes with
            tok.post_processor = processors.RobertaProcessing(
                (specials[3], ids[3]), (specials[2], ids[2]), add_prefix_space=self._prefix_space)
        pieces = [tok.id_to_token(i) or "" for i in range(tok.get_vocab_size(with_added_tokens=True))]
        # A word starts after a space ("Ġ"), at punctuation and at special tokens (the first word
        # of a text, with no space before it, is glued to what precedes it).
        starts = np.array([not p[:1].isalnum() for p in pieces], bool)
        super().__init__(directory, "bpe", pieces, False, ids, starts, source)

    def _specials(self, hf: dict, vocab: dict[str, int]) -> list[str]:
        """The special tokens in BPE_SPECIALS' order: tokenizer_config.json's, else RoBERTa's,
        else BERT's where the vocab has that and not RoBERTa's."""
        specials = [_token_text(hf[key]) if key in hf else token if token in vocab or bert not in vocab
                    else bert for (key, token), bert in zip(BPE_SPECIALS.items(), SPECIAL_TOKENS)]
        self._bpe_names = dict(zip(BPE_SPECIALS, specials))
        return specials

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, without <s>/</s> (batched and parallel in Rust)."""
        return [np.asarray(e.ids, np.int32)
                for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and character spans as the tokenizers library gives them (the space a "Ġ" token
        starts with left out, as HF's RobertaTokenizer with trim_offsets)."""
        e = self._tok.encode(text, add_special_tokens=False)
        return np.asarray(e.ids, np.int32), np.asarray(e.offsets, np.int32).reshape(-1, 2)

    def decode(self, ids: Iterable[int], clean_up_spaces: bool = False) -> str:
        """The text of the ids (byte-level BPE keeps its spaces); <pad> dropped, other special
        tokens by name; clean_up_spaces changes nothing."""
        ids = [i for i in self._checked(ids).ravel().tolist() if i != self._special["[PAD]"]]
        return self._tok.decode(ids, skip_special_tokens=False)

    def save(self, directory: str | Path) -> None:
        """Writes tokenizer.json, vocab.json + merges.txt, a tokenizer_config.json naming the
        special tokens, and bert_jax_tokenizer.json (kind "bpe")."""
        directory = paths.path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = json.loads(self._tok.to_str())
        (directory / BPE_JSON).write_text(json.dumps(state, ensure_ascii=False), "utf-8")
        model = state["model"]
        (directory / BPE_VOCAB).write_text(json.dumps(model["vocab"], ensure_ascii=False), "utf-8")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        (directory / BPE_MERGES).write_text("\n".join(["#version: 0.2", *merges]) + "\n", "utf-8")
        options = {key: self.pieces[i] for key, i in zip(BPE_SPECIALS, self._special.values())
                   if i is not None}
        # RoBERTa's pairs: its class; another layout: the tokenizer.json as it is (fast class).
        roberta = (self.pair_seps, self.segment_b) == (2, 0)
        options.update(tokenizer_class="RobertaTokenizer" if roberta else "PreTrainedTokenizerFast",
                       add_prefix_space=self._prefix_space,
                       bos_token=options.get("cls_token"), eos_token=options.get("sep_token"))
        (directory / CONFIG_NAME).write_text(json.dumps(options, indent=2) + "\n", "utf-8")
        _write_meta(directory, "bpe", False, self.vocab_size)


def _same_dir(a, b) -> bool:
    """Whether two folders (local or URLs) are the same."""
    if paths.is_remote(a) or paths.is_remote(b):
        return str(a).rstrip("/") == str(b).rstrip("/")
    return Path(a).resolve() == Path(b).resolve()


REFETCH = "replace the tokenizer files with the model's own (download or copy them again)"


def _merges(path: Path, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """merges.txt's pairs, in order (its '#version' line aside): a line that is not two tokens
    of `vocab` whose join is one too (else the tokenizers library panics) is an error naming it."""
    with utf8_errors(path):
        lines = path.read_text("utf-8").splitlines()
    pairs = [(number, tuple(line.split(" "))) for number, line in enumerate(lines, 1)
             if line and not line.startswith("#version")]
    for number, pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"{path}:{number}: {' '.join(pair)[:60]!r} is not a merge (two tokens "
                             f"separated by one space); {REFETCH}")
        missing = [t for t in (*pair, "".join(pair)) if t not in vocab]
        if missing:
            raise ValueError(f"{path}:{number}: the merge {' '.join(pair)!r} needs {missing[0]!r}, "
                             f"which {path.with_name(BPE_VOCAB)} lacks: the two files are not of "
                             f"one tokenizer; {REFETCH}")
    return [pair for _, pair in pairs]


def _json_or_empty(path: Path) -> dict:
    """The JSON object in `path`, {} if there is no such file."""
    return paths.read_json(path, "fix the file or remove it") if path.is_file() else {}


def _metadata(directory: Path) -> dict:
    """Our bert_jax_tokenizer.json, or {}."""
    meta = _json_or_empty(directory / META_NAME)
    return meta if "kind" in meta else {}


# WordPiece options stored in bert_jax_tokenizer.json, with the value of a folder without them
# (Google's tokenization.py; the slow HF BertTokenizer agrees). See WordPieceTokenizer.
WORDPIECE_OPTIONS = {"final_sigma": True, "keep_special_tokens": False}


def _option(directory: Path, meta: dict, key: str, given: bool | None) -> bool:
    """An option: `given` if not None, else bert_jax_tokenizer.json's, else WORDPIECE_OPTIONS'."""
    value = meta.get(key, WORDPIECE_OPTIONS[key]) if given is None else given
    if not isinstance(value, bool):
        raise ValueError(f"{directory / META_NAME}: {key}={value!r}, expected true or false; fix "
                         "the file or remove the key")
    return value


TOKENIZER_FILES = (VOCAB_NAME, CONFIG_NAME, META_NAME, SPM_NAME, SPM_VOCAB_NAME, BPE_JSON, BPE_VOCAB,
                   BPE_MERGES, HF_SOURCE_NAME)


def copy_tokenizer(src: str | Path, dst: str | Path) -> list[str]:
    """Copies the tokenizer files in src (those of TOKENIZER_FILES present) into dst, so a
    training workdir, like a `bert-jax convert` output, carries its tokenizer and can be
    given as init_from. Files already in dst are kept when they are src's (a resumed run);
    tokenizer files of another tokenizer there (a vocab folder given as the workdir, a run
    resumed with another data.tokenizer) are a ValueError naming them: the folder would then
    tokenize with a mixture. Returns the names copied."""
    src, dst = paths.path(src), paths.path(dst)
    if _same_dir(src, dst):
        return []
    other = [n for n in TOKENIZER_FILES if (dst / n).is_file() and not (
        (src / n).is_file() and (src / n).read_bytes() == (dst / n).read_bytes())]
    if other:
        raise ValueError(f"{dst}: already holds tokenizer files of another tokenizer than {src} "
                         f"({', '.join(other)}: not {src}'s); a checkpoint folder carries the one "
                         "tokenizer its model reads: choose a new folder, or give the tokenizer "
                         "it was made with")
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file() and not (dst / n).exists()]
    for name in copied:
        paths.copy_file(src / name, dst / name)
    return copied


def _kinds_found(directory: Path) -> list[str]:
    """The tokenizer kinds whose files `directory` holds; a tokenizer.json counts (as BPE) only
    alone, since an exported BERT folder has one beside its vocab.txt."""
    files = {"wordpiece": VOCAB_NAME, "sentencepiece": SPM_NAME, "bpe": BPE_MERGES}
    found = [kind for kind, name in files.items() if (directory / name).is_file()]
    if found or not (directory / BPE_JSON).is_file():
        return found
    # tokenizer.json alone: byte-level BPE (RoBERTa, ModernBERT), or a BERT saved by transformers 5
    try:
        wordpiece = json.loads((directory / BPE_JSON).read_text("utf-8"))["model"]["type"] == "WordPiece"
    except (ValueError, KeyError, TypeError):  # not a tokenizer.json: the BPE reader says why
        wordpiece = False
    return ["wordpiece" if wordpiece else "bpe"]


def has_tokenizer(directory: str | Path) -> bool:
    """Whether `directory` holds tokenizer files (vocab.txt, spm.model, merges.txt or
    tokenizer.json)."""
    return bool(_kinds_found(paths.path(directory)))


def required_dir(directory: str | Path, key: str = "data.tokenizer", init_from: str = "") -> str | Path:
    """`directory`, or a ValueError naming `key` when it is empty (and the run's `init_from`
    folder where that holds a tokenizer: the one its model was trained with)."""
    if not str(directory):
        if init_from and has_tokenizer(init_from):
            raise ValueError(f"{key} is empty: set --config.{key}={init_from} (init_from's folder "
                             "holds the tokenizer its model was trained with; this run does not "
                             "take it by itself)")
        raise ValueError(f"{key} is empty: set --config.{key}=<directory with vocab.txt or spm.model> "
                         "(`bert-jax vocab` makes one)")
    return directory


def checkpoint_tokenizer(checkpoint_dir: str | Path, data_tokenizer: str = "") -> Tokenizer:
    """The tokenizer a checkpoint directory carries, else its run's data.tokenizer; with
    neither, load_tokenizer's error naming the checkpoint directory and the files it lacks."""
    directory = checkpoint_dir if has_tokenizer(checkpoint_dir) or not data_tokenizer else data_tokenizer
    return load_tokenizer(directory)


def load_tokenizer(directory: str | Path, *, lowercase: bool | None = None,
                   final_sigma: bool | None = None, keep_special_tokens: bool | None = None) -> Tokenizer:
    """Loads the vocab in directory: vocab.txt -> WordPiece, spm.model -> SentencePiece,
    merges.txt or a tokenizer.json alone -> byte-level BPE.

    WordPiece casing: `lowercase` if given, else bert_jax_tokenizer.json's, else HF tokenizer_config.json's
    do_lower_case, else uncased iff no vocab token outside [brackets] has an uppercase letter.
    final_sigma, keep_special_tokens (WordPiece; see WordPieceTokenizer): if given, else
    bert_jax_tokenizer.json's, else WORDPIECE_OPTIONS. `directory` may be local or gs://.
    """
    directory = paths.path(directory)
    found = _kinds_found(directory)
    kind = _metadata(directory).get("kind")
    if kind is None and len(found) > 1:
        raise ValueError(f"{directory} has the files of several tokenizers ({', '.join(found)}); "
                         f'add a {META_NAME} with "kind" to say which to use')
    kind = kind or (found[0] if found else None)
    if kind not in found:
        if wrong := paths.wrong_kind(directory, "", paths.FOLDER_KINDS, "a tokenizer's folder"):
            raise NotADirectoryError(wrong)  # (a vocab.txt given: its folder is meant)
        said = f" ({META_NAME} says kind={kind!r})" if kind else ""
        raise FileNotFoundError(f"no tokenizer in {directory}{said}: looked for {VOCAB_NAME} (WordPiece), "
                                f"{SPM_NAME} (SentencePiece) and {BPE_MERGES} or {BPE_JSON} (byte-level BPE)")
    if kind == "bpe":
        if lowercase or final_sigma is not None or keep_special_tokens is not None:
            raise ValueError(f"{directory}: lowercase, final_sigma and keep_special_tokens are "
                             "WordPiece options; a byte-level BPE tokenizer keeps the text as it is")
        tok: Tokenizer = _ByteLevelBPE(directory)
    elif kind == "sentencepiece":
        if final_sigma is not None or keep_special_tokens is not None:
            raise ValueError(f"{directory / SPM_NAME}: final_sigma and keep_special_tokens are "
                             "WordPiece options; a sentencepiece model fixes its normalization and "
                             "never makes its special pieces from text")
        tok = _SentencePiece(directory, lowercase)
    else:
        tok = _WordPiece(directory, lowercase, final_sigma, keep_special_tokens)
    _check_record(tok)
    return tok


def load_hf_tokenizer(directory: str | Path, prefer: Kind = "wordpiece") -> Tokenizer:
    """A Hugging Face BERT folder's vocab.txt read as its BertTokenizer reads it: lowercase unless
    tokenizer_config.json says do_lower_case=false (HF's default, unlike load_tokenizer's guess),
    and 'Σ' lowercased to 'σ' as the Rust tokenizer every HF user of the checkpoint loads does
    (a folder transformers 5 saved has tokenizer.json's WordPiece and no vocab.txt: its vocab is
    read from there, the casing from tokenizer_config.json as transformers does);
    a RoBERTa folder's byte-level BPE as its RobertaTokenizer reads it (`prefer`: the kind the
    folder's model family reads, its files read first where others are beside them)."""
    directory = paths.path(directory)
    kinds = _kinds_found(directory)
    if "bpe" in kinds and (kinds == ["bpe"] or prefer == "bpe"):
        return _ByteLevelBPE(directory)
    if not kinds and prefer == "bpe":  # (WordPiece's reader would ask for a vocab.txt)
        half = f" ({BPE_VOCAB} is here without {BPE_MERGES})" if (directory / BPE_VOCAB).is_file() else ""
        raise FileNotFoundError(f"{directory}: no tokenizer files; this model's byte-level BPE "
                                f"tokenizer is {BPE_JSON}, or {BPE_VOCAB} and {BPE_MERGES}{half}: copy "
                                "them from the model's repository")
    return _WordPiece(directory, _json_or_empty(directory / CONFIG_NAME).get("do_lower_case", True),
                      final_sigma=False)
