"""The WordPiece engine behind tokenizer.Tokenizer: BERT tokenization from a vocab.txt, matching the
reference BertTokenizer exactly. Use tokenizer.load_tokenizer; this module is its implementation."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bert_jax import paths
from bert_jax.data.rows import utf8_errors

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCAB_NAME, CONFIG_NAME, JSON_NAME = "vocab.txt", "tokenizer_config.json", "tokenizer.json"
# The reference's CJK ideograph blocks (google-research/bert tokenization._is_chinese_char).
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def load_vocab(path: str | Path) -> list[str]:
    """Reads vocab.txt (local or gs://): one token per line, id = line number."""
    path = paths.path(path)
    if not path.is_file():
        raise FileNotFoundError(f"BERT vocab file not found: {path}; expected the model's vocab.txt "
                                "(one token per line) there")
    # As HF load_vocab: text-mode readlines (universal newlines, so \r\n and \r end a line but
    # \x0b, \x1c, \u2028 ... do not, unlike str.splitlines) and only the "\n" is stripped.
    with utf8_errors(path), path.open(encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f.readlines()]


# What to do with a tokenizer.json that cannot be read, wherever it is (an HF folder, a checkpoint).
JSON_ADVICE = ("replace it with the model's own tokenizer.json (download or copy it again), or "
               "remove it where the folder has the model's other tokenizer files")


def tokenizer_json_state(path: str | Path) -> dict:
    """A tokenizer.json's content (local or gs://): a file that is not JSON, or has no tokenizer
    model with a type, is a ValueError naming it and what to do."""
    state = paths.read_json(path, JSON_ADVICE)
    model = state.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        raise ValueError(f"{path}: not a tokenizer.json (no \"model\" object with a \"type\" such as "
                         f"BPE or WordPiece); {JSON_ADVICE}")
    return state


def tokenizer_json(path: str | Path) -> Tokenizer:
    """The tokenizers library's Tokenizer in a tokenizer.json: one it cannot build is a
    ValueError naming the file and what to do, rather than the library's bare Exception."""
    state = tokenizer_json_state(path)
    try:
        return Tokenizer.from_str(json.dumps(state))
    except Exception as e:  # noqa: BLE001 (the Rust library raises a bare Exception)
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"{path}: a {state['model']['type']} tokenizer.json the tokenizers library "
                         f"cannot read ({reason}); {JSON_ADVICE}") from None


def read_tokenizer_json(path: str | Path) -> list[str]:
    """The vocab (by id) of a fast tokenizer's tokenizer.json with a BERT WordPiece model: what
    transformers 5 saves for a BERT (no vocab.txt). Its normaliser is not read: transformers
    rebuilds it from tokenizer_config.json's do_lower_case (default true), strip_accents and
    tokenize_chinese_chars, as from_pretrained_dir does. What BertTokenizer's vocab cannot
    state is an error naming it."""
    path = paths.path(path)
    state = tokenizer_json_state(path)
    model = state["model"]
    if model.get("type") != "WordPiece":
        raise ValueError(f"{path}: a {model.get('type')} model, not WordPiece")
    odd = {k: model.get(k) for k, want in (("continuing_subword_prefix", "##"), ("unk_token", "[UNK]"),
                                          ("max_input_chars_per_word", 100)) if model.get(k, want) != want}
    if odd:
        raise ValueError(f"{path}: WordPiece with {odd}; BERT's is '##' pieces, [UNK], 100 characters")
    ids = model.get("vocab") or {}
    if not ids or not all(isinstance(i, int) and i >= 0 for i in ids.values()):
        raise ValueError(f"{path}: the WordPiece vocab is empty or has ids that are not integers >= 0")
    added = sorted(t["content"] for t in state.get("added_tokens") or () if t.get("content") not in ids)
    if added:
        raise ValueError(f"{path}: tokens added beyond the WordPiece vocab ({', '.join(added[:5])}): "
                         f"not supported; add them to the vocab, or give the model's {VOCAB_NAME}")
    # An id no token has (a vocab.txt with a duplicate line: HF keeps the later id) gets a
    # placeholder no text can produce (the pre-tokenizer splits at its brackets), as in HF.
    vocab = [f"[no token {i}]" for i in range(max(ids.values()) + 1)]
    for token, i in ids.items():
        vocab[i] = token
    return vocab


def vocab_file(directory: str | Path) -> Path:
    """A BERT folder's vocab.txt, or its tokenizer.json where only that is there (transformers 5
    saves a BERT so)."""
    directory = paths.path(directory)
    if not (directory / VOCAB_NAME).is_file() and (directory / JSON_NAME).is_file():
        return directory / JSON_NAME
    return directory / VOCAB_NAME


def load_wordpiece_vocab(path: str | Path) -> list[str]:
    """The tokens by id of a vocab_file(): vocab.txt's lines or tokenizer.json's WordPiece vocab."""
    return read_tokenizer_json(path) if paths.path(path).name == JSON_NAME else load_vocab(path)


@functools.cache
def _is_punctuation(c: str) -> bool:
    """Unicode P* or any ASCII non-alphanumeric symbol, e.g. $ + ^ `."""
    cp = ord(c)
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(c).startswith("P"))


Span = tuple[int, int]  # (start, end) character offsets into the original text


@functools.cache
def _clean_char(c: str, chinese: bool) -> str:
    """What the reference's cleaning makes of one character: "" (control characters etc.
    dropped), " " (whitespace), " c " (a CJK ideograph, if chinese) or c itself."""
    category = unicodedata.category(c)
    if c in "\0\ufffd" or (category[0] == "C" and c not in "\t\n\r"):  # C*: control etc.
        return ""
    if c in " \t\n\r" or category == "Zs":
        return " "
    if chinese and any(lo <= ord(c) <= hi for lo, hi in _CJK):
        return f" {c} "
    return c


def _cleaned(text: str, chinese: bool) -> tuple[str, list[int]]:
    """The reference's cleaning (control characters dropped, whitespace to " ", spaces around CJK
    ideographs) and, for each character kept, its index in text."""
    pieces = [_clean_char(c, chinese) for c in text]
    cleaned = "".join(pieces)
    if len(cleaned) == len(text) and "" not in pieces:  # one character each: the usual case
        return cleaned, list(range(len(text)))
    return cleaned, [i for i, piece in enumerate(pieces) for _ in piece]


def _normalize_word(word: str, lowercase: bool, strip_accents: bool | None, final_sigma: bool) -> str:
    """A whitespace-separated word NFC-normalized, lowercased and accent-stripped as the reference."""
    if word.isascii():  # NFC, NFD and accent stripping leave it as it is
        return word.lower() if lowercase else word
    word = unicodedata.normalize("NFC", word)
    if lowercase:  # per word, so Greek final sigma depends on the whole word
        word = word.lower() if final_sigma else "".join(c.lower() for c in word)
    if strip_accents or (strip_accents is None and lowercase):
        word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
    return word


def _split_punctuation(chars: Sequence) -> list[list]:
    """chars (a str, or (char, span) pairs) split into words, each punctuation character one of its own."""
    words, piece = [], []
    for item in chars:
        if _is_punctuation(item[0]):
            words += [piece, [item]] if piece else [[item]]
            piece = []
        else:
            piece.append(item)
    return words + [piece] if piece else words


def reference_basic_tokenize(text: str, lowercase: bool, strip_accents: bool | None = None,
                             chinese: bool = True, final_sigma: bool = True) -> list[str]:
    """The reference BasicTokenizer in Python (HF BertTokenizer's, i.e. with NFC); final_sigma=False
    lowercases character by character, as the Rust BertNormalizer does (Σ -> σ, never ς)."""
    # Splitting on whitespace before NFC, not after, is the same: NFC never composes across a
    # whitespace character nor makes or removes one (checked over all code points).
    words = []
    for word in _cleaned(text, chinese)[0].split():
        word = _normalize_word(word, lowercase, strip_accents, final_sigma)
        if any(map(_is_punctuation, word)):
            words += ["".join(w) for w in _split_punctuation(word)]
        elif word:  # stripping accents can leave nothing
            words.append(word)
    return words


def _aligned_word(word: str, origin: list[int], normalize) -> list[tuple[str, Span]]:
    """Each character of normalize(word) with the span of the original characters it comes from.

    The word is cut into the shortest pieces whose normalizations, concatenated, are the word's
    (a composed accent, a final sigma or a ligature stays in one piece with what it depends on); a
    piece's characters map one to one when it keeps its length, else each spans the whole piece.
    A piece that normalizes to nothing (a stripped combining mark) is in no span, as a removed
    control character, and as in HF's fast tokenizer."""
    target = normalize(word)
    if len(target) == len(word) and all(normalize(c) == t for c, t in zip(word, target)):
        return [(t, (i, i + 1)) for t, i in zip(target, origin)]  # the usual case, in linear time
    out: list[tuple[str, Span]] = []
    done, start = 0, 0
    while start < len(word):
        end = start + 1
        while end < len(word):
            piece = normalize(word[start:end])
            if target.startswith(piece, done) and target[done + len(piece):] == normalize(word[end:]):
                break
            end += 1
        piece = normalize(word[start:end]) if end < len(word) else target[done:]
        if len(piece) == end - start:
            out += [(t, (i, i + 1)) for t, i in zip(piece, origin[start:end])]
        else:
            out += [(t, (origin[start], origin[end - 1] + 1)) for t in piece]
        done += len(piece)
        start = end
    return out


def reference_basic_tokenize_with_offsets(text: str, lowercase: bool, strip_accents: bool | None = None,
                                          chinese: bool = True, final_sigma: bool = True
                                          ) -> list[tuple[str, list[Span]]]:
    """reference_basic_tokenize's words, each with the span in text of each of its characters."""
    cleaned, origin = _cleaned(text, chinese)
    words = []
    for m in re.finditer(r"\S+", cleaned):  # \S: str.split's whitespace
        chars = _aligned_word(m.group(), origin[m.start():m.end()],
                              lambda w: _normalize_word(w, lowercase, strip_accents, final_sigma))
        words += [("".join(c for c, _ in w), [span for _, span in w]) for w in _split_punctuation(chars)]
    return words


@functools.cache
def _rust_may_differ(c: str) -> bool:
    """Whether the Rust normalizer may treat this character unlike Python's unicodedata."""
    # Rust's Unicode tables are older than Python's and miss Cn (unassigned); for characters
    # already in Unicode 3.2 with an unchanged category the two agree (checked per code point).
    old = unicodedata.ucd_3_2_0.category(c)
    return old == "Cn" or old != unicodedata.category(c)


class WordPieceTokenizer:
    """BERT WordPiece tokenizer: Rust `tokenizers` fast path, Python reference for rare text.

    Only [UNK] is required of the vocab (as in Google's tokenization.py); an absent [PAD],
    [CLS], [SEP] or [MASK] has id None. final_sigma: lowercase an uppercase Greek word-final
    sigma to 'ς' (Python's str.lower: Google's and HF's slow tokenizer) rather than 'σ' (the
    Rust BertNormalizer of HF's fast tokenizers). keep_special_tokens: a literal special token
    in the text ("[MASK]") is that token (HF's behaviour) rather than split ("[", "mask", "]",
    Google's, so that text cannot inject a mask into pretraining data)."""

    def __init__(self, vocab: list[str], *, lowercase: bool, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, final_sigma: bool = True,
                 keep_special_tokens: bool = False, source: str = "vocab") -> None:
        self.vocab = list(vocab)
        self.vocab_size = len(self.vocab)  # rows an embedding needs (= HF's len(vocab) w/o dups)
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.final_sigma, self.keep_special_tokens = final_sigma, keep_special_tokens
        # Later duplicates win, as in HF's OrderedDict-based load_vocab.
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        if "[UNK]" not in self._ids:
            raise ValueError(f"{source}: vocab has no special token '[UNK]'; a BERT vocab needs it "
                             f"(and {' '.join(t for t in SPECIAL_TOKENS if t != '[UNK]')} to build "
                             "model inputs)")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self._ids.get(t) for t in SPECIAL_TOKENS)
        present = [t for t in SPECIAL_TOKENS if t in self._ids]
        # Longest first, so that a special token that is a prefix of another never wins.
        self._specials = re.compile("(" + "|".join(map(re.escape, sorted(present, key=len, reverse=True)))
                                    + ")") if keep_special_tokens else None
        tok = Tokenizer(models.WordPiece(self._ids, unk_token="[UNK]",
                                         max_input_chars_per_word=100))
        # HF's BertTokenizer NFC-normalizes after cleaning and CJK spacing, before lower/strip;
        # the Rust BertNormalizer does not, so it is split around an NFC step.
        tok.normalizer = normalizers.Sequence([
            normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                       strip_accents=False, lowercase=False),
            normalizers.NFC(),
            normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                       strip_accents=strip_accents, lowercase=lowercase)])
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._tok = tok  # no post-processor: tokenizer.Tokenizer adds [CLS]/[SEP] itself

    @classmethod
    def from_vocab(cls, vocab_file: str | Path, *, lowercase: bool,
                   strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                   final_sigma: bool = True, keep_special_tokens: bool = False) -> WordPieceTokenizer:
        """Loads a BERT vocab.txt; strip_accents=None means "same as lowercase"."""
        return cls(load_vocab(vocab_file), lowercase=lowercase, strip_accents=strip_accents,
                   tokenize_chinese_chars=tokenize_chinese_chars, final_sigma=final_sigma,
                   keep_special_tokens=keep_special_tokens, source=str(vocab_file))

    @classmethod
    def from_pretrained_dir(cls, directory: str | Path, *, lowercase: bool | None = None,
                            final_sigma: bool = True,
                            keep_special_tokens: bool = False) -> WordPieceTokenizer:
        """Loads vocab.txt and the HF tokenizer_config.json options; `lowercase` overrides its
        do_lower_case, and both absent means lowercase (HF BertTokenizer's default)."""
        directory = paths.path(directory)
        config_path = directory / CONFIG_NAME
        try:
            config = json.loads(config_path.read_text("utf-8")) if config_path.is_file() else {}
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{config_path}: not valid JSON ({e}); fix the file or remove it") from None
        if not isinstance(config, dict):
            raise ValueError(f"{config_path}: a JSON {type(config).__name__}, expected an object of "
                             "tokenizer options; fix the file or remove it")
        # Switches HF's BertTokenizer reads as booleans (strip_accents: null too, "as lowercase")
        for key, value in config.items():
            if key not in ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                           "do_basic_tokenize") or isinstance(value, bool):
                continue
            if not (key == "strip_accents" and value is None):
                raise ValueError(f"{config_path}: {key}={value!r}, expected true or false; fix the "
                                 "file or remove it")
        if not config.get("do_basic_tokenize", True):
            raise ValueError(f"{config_path}: do_basic_tokenize=false is not supported")
        source = vocab_file(directory)
        vocab = load_wordpiece_vocab(source)
        if lowercase is None:
            lowercase = config.get("do_lower_case", True)
        return cls(vocab, lowercase=lowercase, strip_accents=config.get("strip_accents"),
                   tokenize_chinese_chars=config.get("tokenize_chinese_chars", True),
                   final_sigma=final_sigma, keep_special_tokens=keep_special_tokens, source=str(source))

    def save(self, directory: str | Path) -> None:
        """Writes vocab.txt and an HF-style tokenizer_config.json (local or gs://)."""
        directory = paths.path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / VOCAB_NAME).write_bytes("".join(tok + "\n" for tok in self.vocab).encode("utf-8"))
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  **{key: tok for key, tok in zip(
                      ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS)
                     if tok in self._ids}}  # an absent one would be added by HF as a new id
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", "utf-8")

    def _fast_ok(self, text: str) -> bool:
        """Whether the Rust pipeline is known to give the reference result for this text."""
        if text.isascii():
            return True
        if self.lowercase and self.final_sigma and "Σ" in text:  # Python's lower() has it, Rust not
            return False
        return not any(map(_rust_may_differ, set(text)))

    def basic_tokenize(self, text: str) -> list[str]:
        """Words after cleaning, lowercasing/accent stripping and punctuation splitting."""
        if not self._fast_ok(text):
            return reference_basic_tokenize(text, self.lowercase, self.strip_accents,
                                            self.tokenize_chinese_chars, self.final_sigma)
        normalized = self._tok.normalizer.normalize_str(text)
        return [w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(normalized)]

    def _pieces(self, texts: list[str], offsets: bool = False) -> list[tuple[list[str], list[int], list]]:
        """Wordpieces, ids and (with offsets) each one's span in the text, per text; with
        keep_special_tokens, the text between literal special tokens is tokenized as a text of its
        own (as HF's added-token split does), a special token spanning its literal."""
        if self._specials is None:
            return self._text_pieces(texts, offsets)
        parts = [self._specials.split(text) for text in texts]  # odd indices: special tokens
        between = iter(self._text_pieces([p for ps in parts for p in ps[::2]], offsets))
        out = []
        for ps in parts:
            tokens, ids, spans, at = [], [], [], 0
            for j, part in enumerate(ps):
                t, i, o = ([part], [self._ids[part]], [(0, len(part))]) if j % 2 else next(between)
                tokens += t
                ids += i
                spans += [(lo + at, hi + at) for lo, hi in o]
                at += len(part)
            out.append((tokens, ids, spans))
        return out

    def _text_pieces(self, texts: list[str], offsets: bool) -> list[tuple[list[str], list[int], list]]:
        """Wordpieces, ids and spans (if offsets, else []) per text: batched in Rust, rare texts
        via the Python reference."""
        out: list = [None] * len(texts)
        # Rust's NFC maps a composed character to its first source character only ("e" of
        # "e\u0301"), so offsets of a text NFC changes come from the reference alignment.
        fast = [i for i, text in enumerate(texts) if self._fast_ok(text)
                and not (offsets and not unicodedata.is_normalized("NFC", text))]
        encodings = self._tok.encode_batch([texts[i] for i in fast], add_special_tokens=False)
        for i, enc in zip(fast, encodings):
            out[i] = (enc.tokens, enc.ids, enc.offsets if offsets else [])
        for i, text in enumerate(texts):
            if out[i] is None:
                out[i] = self._reference_pieces(text, offsets)
        return out

    def _reference_pieces(self, text: str, offsets: bool) -> tuple[list[str], list[int], list]:
        """_text_pieces of one text through the Python reference basic tokenization."""
        options = (self.lowercase, self.strip_accents, self.tokenize_chinese_chars, self.final_sigma)
        words = (reference_basic_tokenize_with_offsets(text, *options) if offsets
                 else [(w, None) for w in reference_basic_tokenize(text, *options)])
        tokens, ids, spans = [], [], []
        for word, chars in words:
            at = 0
            for piece in self._tok.model.tokenize(word):
                tokens.append(piece.value)
                ids.append(piece.id)
                if chars:  # pieces cut the word in order; [UNK] is always the whole word
                    n = len(word) if piece.id == self.unk_id else len(piece.value) - 2 * (at > 0)
                    spans.append((chars[at][0], chars[at + n - 1][1]))
                    at += n
        return tokens, ids, spans

    def tokenize(self, text: str) -> list[str]:
        """Wordpieces of one text, without special tokens."""
        return self._pieces([text])[0][0]

    def tokenize_with_offsets(self, text: str) -> tuple[list[str], list[Span]]:
        """Wordpieces of one text and the (start, end) characters of text each covers, as HF's
        return_offsets_mapping: "##x" its characters, [UNK] its whole word, a kept special token
        its literal."""
        tokens, _, spans = self._pieces([text], offsets=True)[0]
        return tokens, [tuple(span) for span in spans]

    def tokenize_batch(self, texts: list[str]) -> list[list[str]]:
        """Wordpieces of many texts (parallel in Rust)."""
        return [tokens for tokens, _, _ in self._pieces(list(texts))]

    def tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Vocab ids; tokens not in the vocab map to [UNK] like the reference."""
        return [self._ids.get(tok, self.unk_id) for tok in tokens]

    def ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Vocab tokens; an id outside the vocab is an error rather than a silent [UNK]."""
        ids = [int(i) for i in ids]
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:
            raise ValueError(f"token ids {bad[:5]} outside vocab of size {self.vocab_size}")
        return [self.vocab[i] for i in ids]
