"""Lines of plain text for learning a vocabulary: UTF-8 files (plain or .gz, local or gs://)
or the text fields of a TFDS dataset."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator

from bert_jax import paths


def text_lines(spec: str) -> Iterator[str]:
    """Lines of comma-separated file globs (plain or .gz), or of a TFDS dataset's fields
    (tfds:name[:split[:field,field]], default field `text`; e.g. ...:train:en,de)."""
    from bert_jax.data.documents import expand, tfds_source

    if spec.startswith("tfds:"):
        name, _, rest = spec[5:].partition(":")
        split, _, fields = rest.partition(":")
        source = tfds_source(name, split or "train", what=f"--input={spec}",
                             data_dir_flag="$TFDS_DATA_DIR")
        for i in range(len(source)):
            for field in (fields or "text").split(","):
                text = source[i][field]
                yield from (text.decode() if isinstance(text, bytes) else text).splitlines()
        return
    for path in expand(spec, "--input"):
        yield from utf8_lines(path)


def utf8_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, plain or .gz (local or gs://), as text-mode reading gives
    them; a byte that is not UTF-8 is an error naming the line, as the other readers' are (a
    vocab learned from replacement characters would be silently wrong)."""
    offset = 0
    with paths.path(path).open("rb") as raw, (gzip.open(raw) if path.endswith(".gz") else raw) as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {number} (byte {offset + e.start}) is not UTF-8 "
                                 f"({e.reason}); re-encode the file as UTF-8") from None
            offset += len(line)
            if "\r" in text:  # \r\n and \r end lines, as in text mode
                yield from io.StringIO(text, newline=None)
            else:
                yield text
