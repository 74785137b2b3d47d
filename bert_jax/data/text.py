"""What is text: the one reader of UTF-8 text files (plain or .gz, local or gs://) for vocab,
prepare and training, and the one error of every reader for a file that is not UTF-8 text."""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import os
import re
import zlib
from collections.abc import Iterator
from typing import IO

from bert_jax import paths

log = logging.getLogger(__name__)


# Multi-byte encodings of East Asian text, tried on a line that is not UTF-8.
MULTI_BYTE = ("shift_jis", "gbk", "euc_kr", "big5")


def _decodes(raw: bytes, encoding: str) -> bool:
    try:
        raw.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def not_text(path: str | os.PathLike, number: int, raw: bytes,
             error: UnicodeDecodeError | None = None) -> ValueError:
    """The one error of every reader of text for line `number` of `path` (its bytes `raw`),
    which is not UTF-8 text: what it looks like instead (UTF-32, UTF-16, binary, another 8-bit
    encoding) and how to fix it."""
    where = f"{path}:{number}"
    # UTF-32 first: its byte-order mark starts as UTF-16's, and 3 of every 4 bytes are NUL
    quarters = [raw[i::4] for i in range(4)]
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")) or (
            len(raw) >= 8 and sum(q.count(0) >= 0.8 * len(q) for q in quarters) >= 3):
        return ValueError(f"{where}: UTF-32 text (a byte-order mark or three NUL bytes beside each "
                          f"letter), expected UTF-8; re-save the file as UTF-8 (e.g. `iconv -f "
                          f"utf-32 -t utf-8`)")
    halves = (raw[0::2], raw[1::2])
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (
            len(raw) >= 4 and any(h.count(0) >= 0.8 * len(h) for h in halves)):
        return ValueError(f"{where}: UTF-16 text (a byte-order mark or a NUL byte beside each "
                          f"letter), expected UTF-8; re-save the file as UTF-8 (e.g. `iconv -f "
                          f"utf-16 -t utf-8`)")
    if b"\x00" in raw or error is None:
        return ValueError(f"{where}: a NUL byte: a binary file, not text; give UTF-8 text files "
                          f"(plain or .gz)")
    found = (f"{where}: not UTF-8: found byte 0x{raw[error.start]:02x} at column {error.start + 1}, "
             f"expected UTF-8 text; re-save the file as UTF-8")
    # Bytes beyond ASCII: most of an East Asian text's, in the pairs of a multi-byte encoding
    # (which then decodes the line); another alphabet's (Cyrillic, Greek) make whole words; a
    # Latin 8-bit encoding's stand alone among ASCII letters ("caf\xe9").
    high = sum(b >= 0x80 for b in raw)
    if high >= 4 and high >= 0.5 * len(raw.replace(b" ", b"").strip()):
        fits = [e for e in MULTI_BYTE if _decodes(raw, e)]
        if fits:
            return ValueError(f"{found} (it decodes as {', '.join(fits)}: an East Asian multi-byte "
                              f"encoding; `uchardet` names which, then `iconv -f <it> -t utf-8`)")
    runs = [len(run) for run in re.findall(rb"[\x80-\xff]+", raw)]
    if high >= 4 and sum(n for n in runs if n >= 2) >= 0.8 * high:
        return ValueError(f"{found} (it looks like an 8-bit encoding of another alphabet: Cyrillic "
                          f"`iconv -f cp1251 -t utf-8` or koi8-r, Greek cp1253; `uchardet` names "
                          f"the encoding)")
    return ValueError(f"{found} (from Latin-1 or Windows-1252: `iconv -f cp1252 -t utf-8`)")


def decode_line(path: str | os.PathLike, number: int, raw: bytes) -> str:
    """Line `number` of `path` as text: UTF-8 without NUL bytes, else not_text's error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_text(path, number, raw, e) from None
    if "\x00" in text:
        raise not_text(path, number, raw)
    return text


def check_start(path: str | os.PathLike, size: int = 1 << 16) -> None:
    """A binary or UTF-16 file stopped before a text-mode reader reads it: its first `size`
    bytes (decompressed, for a .gz) hold a NUL byte or a UTF-16 byte-order mark (not_text
    names the line)."""
    with open_bytes(path) as f:
        head = f.read(size)
    for number, line in enumerate(head.split(b"\n"), 1):
        if b"\x00" in line or number == 1 and line.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise not_text(path, number, line)


# A text corpus may hold a few stray bytes of another encoding (2 lines of 9,548 in one of the
# Gutenberg books beside the repo): up to this share of its lines they become U+FFFD with one
# warning (Google BERT's reader drops them); more, and the file is not UTF-8 text.
STRAY_LINES = 0.01


@contextlib.contextmanager
def gzip_errors(path: str | os.PathLike) -> Iterator[None]:
    """gzip's own errors reading `path` (a .gz name on a plain or cut-short file) as one line
    naming the file and the fix."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # (zlib: a damaged deflate stream)
        raise ValueError(f"{path}: not a readable gzip file ({e}); decompress it or drop the "
                         ".gz suffix if it is plain text") from None


@contextlib.contextmanager
def open_bytes(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """The file's bytes, local or gs://, decompressed when its name ends .gz (gzip's errors
    then as gzip_errors' one line): what every reader of text files reads."""
    with paths.path(path).open("rb") as raw:
        if not str(path).endswith(".gz"):
            yield raw
            return
        with gzip_errors(path), gzip.open(raw) as f:
            yield f


def utf8_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, plain or .gz (local or gs://), as text-mode reading gives
    them: the one reader of text files for vocab, prepare and training. A binary or UTF-16
    file stops at its first line that shows it (not_text); undecodable bytes on at most
    STRAY_LINES of the lines are replaced with one warning naming the first, more stop too."""
    bad: list[tuple[int, bytes, UnicodeDecodeError]] = []
    number = 0
    with open_bytes(path) as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                if b"\x00" in line or number == 1 and line.startswith((b"\xff\xfe", b"\xfe\xff")):
                    raise not_text(path, number, line, e) from None
                bad.append((number, line, e))
                text = line.decode("utf-8", errors="replace")
            if "\x00" in text:
                raise not_text(path, number, line)
            if "\r" in text:  # \r\n and \r end lines, as in text mode
                yield from io.StringIO(text, newline=None)
            else:
                yield text
    if not bad:
        return
    first = not_text(path, *bad[0])
    if len(bad) > STRAY_LINES * number:
        raise ValueError(f"{first} ({len(bad)} of its {number} lines are not UTF-8)")
    log.warning(f"warning: {path}: {len(bad)} of {number} lines hold bytes that are not UTF-8, "
                f"replaced by U+FFFD; the first: {str(first).removeprefix(f'{path}:')}")
