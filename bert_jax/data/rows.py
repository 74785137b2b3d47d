"""Malformed rows in task files: stop naming the file and line, or (data.skip_bad_rows) skip and warn once."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from bert_jax.data import text

log = logging.getLogger(__name__)

SKIP_HINT = ". Fix the file or set data.skip_bad_rows=True to skip such rows"
FIX_HINT = ". Fix that row of the file"  # read outside a run's config: no key skips rows


class BadRows:
    """One reader's bad rows: the first raises `error`, or when skipping they are counted for
    `warn`. `skip` None: the file is read outside a run's config (`mine`, `eval-embeddings`),
    where no data.skip_bad_rows exists to set, so the error's hint is to fix the file."""

    def __init__(self, path: str | os.PathLike, skip: bool | None, error: type[ValueError],
                 hint: str = SKIP_HINT) -> None:
        self.path, self.skip, self.error = path, bool(skip), error
        self.hint = FIX_HINT if skip is None else hint
        self.count, self.first = 0, ""

    def __call__(self, message: str) -> None:
        """Raises error(message + hint), or counts the row (and keeps the first message) when skipping."""
        if not self.skip:
            raise self.error(f"{message}{self.hint}")
        self.count += 1
        self.first = self.first or message

    def found(self, line: int, what: str, found: Any, expected: str) -> None:
        """A bad field: `<path>:<line>: <what>: found <found>, expected <expected>`."""
        self(f"{self.path}:{line}: {what}: found {found!r}, expected {expected}")

    def warn(self, reader: str, skipped: str) -> None:
        """One warning for the whole file, `<reader>: skipped <skipped>; first: ...`, if a row was skipped."""
        if self.count:  # one line, not one per row: a noisy file would bury everything else
            log.warning(f"{reader}: skipped {skipped}; first: {self.first}")


def not_utf8(path: str | os.PathLike, error: UnicodeDecodeError | None = None) -> ValueError:
    """text.not_text's error for a file whose bytes do not decode, naming the first bad line."""
    with text.open_bytes(path) as f:
        for line, raw in enumerate(f, 1):
            try:
                text.decode_line(path, line, raw)
            except ValueError as e:
                return e
    return ValueError(f"{path}: not UTF-8 ({error}); re-save the file as UTF-8")


@contextlib.contextmanager
def utf8_errors(path: str | os.PathLike) -> Iterator[None]:
    """Turns a UnicodeDecodeError while reading `path` into not_utf8's one-line error, and
    stops a binary or UTF-16 file before it is read (text.check_start)."""
    text.check_start(path)
    try:
        yield
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None


@contextlib.contextmanager
def open_text(path: str | os.PathLike, encoding: str = "utf-8", newline: str | None = None
              ) -> Iterator[io.TextIOWrapper]:
    """The file as text (Python's open() with `encoding` and `newline`), plain or .gz, local
    or gs://, under utf8_errors: the one way every task-file reader (pairs, STS and GLUE, BEIR,
    SQuAD, SWAG, NER) opens its file, so each reads a gzipped file as its plain text."""
    with utf8_errors(path), text.open_bytes(path) as raw:
        yield io.TextIOWrapper(raw, encoding=encoding, newline=newline)


def jsonl_rows(f: Any, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSON-lines file; a line that is not a
    JSON object is a bad row."""
    for line, raw in enumerate(f, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.rstrip("\r\n"))  # (its newline: no control character in it)
        except json.JSONDecodeError as e:  # the decoder's reason whole, with its column
            at = e.msg if e.msg.endswith(" at") else f"{e.msg} at"  # ("...starting at": json's own)
            bad.found(line, "line", raw.strip()[:60], f"a JSON object ({at} column {e.colno})")
            continue
        if not isinstance(row, dict):
            bad.found(line, "line", type(row).__name__, "a JSON object")
            continue
        yield line, row

