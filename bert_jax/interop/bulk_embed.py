"""Bulk embedding of a corpus into shards of vectors with their ids (`bert-jax embed --output
<folder>`): resumable after a kill, split over every host of a multi-host run, each batch
spread over the host's devices.

The corpus is a text file (one text per line; its id is its line number, blank lines have
none) or JSON lines as a BEIR corpus.jsonl holds them ("_id", "text", optional "title": the
text embedded is the title and the text joined by a space, as retrieval.read_beir builds it);
plain or .gz, local or gs://. Its rows are cut into shards of `shard_size` consecutive rows,
and each shard is written as one file, `part-<k>-of-<n>.npz` (arrays `ids`, strings, and
`vectors`, float32 [rows, dim], finite), only when it is whole: a local file under a temporary
name renamed into place, an object written in one piece; then `part-<k>-of-<n>.npz.crc32`, its
size and CRC32 (one file per shard: hosts write disjoint files). `embed.json` beside them says what the
folder holds (the checkpoint, the input and a fingerprint of its ids and texts, the pooling,
the shard size), so a second run into the folder embeds only the shards missing, and a run that
would mix another corpus, checkpoint or pooling into it is refused before any work; a shard
kept by a resume is checked against its CRC32 (a shard without one, as older versions wrote
them, has its vectors read and checked finite). Host p of
P embeds shards p, p + P, p + 2P, ...: the hosts write disjoint files and need no collective.
Within a shard the texts are sorted by length and batched as Encoder.encode batches them.
`load(folder)` reads the shards back as (ids, vectors) in the corpus's order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import zipfile
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from bert_jax import paths, trees
from bert_jax.data import text
from bert_jax.interop import sentence_models
from bert_jax.tasks import retrieval

log = logging.getLogger(__name__)

MANIFEST = "embed.json"
FORMAT = 1


def read_corpus(path: str) -> tuple[list[str], list[str]]:
    """(ids, texts) of a corpus file: JSON lines (a name ending .jsonl or .jsonl.gz) as a BEIR
    corpus, else text lines (ids: line numbers, blank lines skipped). A record without a string
    "_id" or "text", an id twice or an empty text is a ValueError naming the file, line and
    field."""
    ids: list[str] = []
    texts: list[str] = []
    jsonl = path.removesuffix(".gz").endswith(".jsonl")
    seen: dict[str, int] = {}
    for number, line in enumerate(text.utf8_lines(path), 1):
        if not line.strip():
            continue
        if not jsonl:
            ids.append(str(number))
            texts.append(line.rstrip("\n"))
            continue
        record = retrieval.beir_record(path, number, line, ["text"], ["title"])
        doc = retrieval.document_text(record)  # (an empty one refused there, as every reader does)
        if record["_id"] in seen:
            raise ValueError(f"{path}:{number}: field '_id': {record['_id']!r} twice (first on "
                             f"line {seen[record['_id']]}); ids name one document each")
        seen[record["_id"]] = number
        ids.append(record["_id"])
        texts.append(doc)
    if not ids:
        raise ValueError(f"{path}: no text to embed (the file is empty or blank)")
    return ids, texts


def fingerprint(ids: Sequence[str], texts: Sequence[str]) -> str:
    """SHA-256 of the ids and texts, in order: the corpus a folder's shards were made from."""
    h = hashlib.sha256()
    for i, t in zip(ids, texts):
        h.update(json.dumps([i, t], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def shard_name(k: int, n: int) -> str:
    return f"part-{k:05d}-of-{n:05d}.npz"


def _write(folder, name: str, data: bytes) -> None:
    """The file whole or not at all: a local file renamed into place, an object in one write."""
    if paths.is_remote(folder):
        (paths.path(folder) / name).write_bytes(data)
        return
    partial = os.path.join(folder, f".{name}.partial")
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, os.path.join(folder, name))


SUM = ".crc32"  # beside each shard: {"size", "crc32"} of its bytes as written (integrity.crc32)


def _write_shard(folder, name: str, ids: Sequence[str], vectors: np.ndarray) -> None:
    """The shard, then the record of its bytes (a kill between the two leaves a shard without
    one: a resume then reads its vectors)."""
    from bert_jax.training import integrity

    buf = io.BytesIO()
    np.savez(buf, ids=np.array(ids, dtype=str), vectors=vectors.astype(np.float32))
    record = paths.path(folder) / (name + SUM)
    if record.exists():  # a record left from a shard removed to be embedded again: not this one's
        record.unlink()
    _write(folder, name, buf.getvalue())
    size, crc = integrity.crc32(buf.getvalue())
    _write(folder, name + SUM, (json.dumps({"size": size, "crc32": crc}) + "\n").encode())


def _shard_bytes(file) -> tuple[bytes, bool]:
    """(the shard file's bytes, whether they are those embed recorded beside it when it wrote
    them; False: no record, a shard of an older version or a kill before its record). Bytes
    that differ from the record (edited, replaced, damaged since) are a ValueError naming the
    file and what to do."""
    from bert_jax.training import integrity

    data = paths.path(file).read_bytes()
    record_file = paths.path(file).parent / (paths.path(file).name + SUM)
    if not record_file.exists():
        return data, False
    what = (f"embed wrote it with {paths.path(file).name}: remove both files and run the same "
            "`bert-jax embed` again to embed that shard again")
    record = paths.read_json(record_file, what)
    want = (paths.json_field(record, "size", int, record_file, what, at_least=0),
            paths.json_field(record, "crc32", str, record_file, what))
    got = integrity.crc32(data)
    if got != want:
        raise _not_whole(file, f"changed since embed wrote it: {got[0]:,} bytes of CRC32 {got[1]}, "
                               f"written as {want[0]:,} bytes of CRC32 {want[1]}")
    return data, True


def _not_whole(file, why: str) -> ValueError:
    return ValueError(f"{file}: not a whole shard ({why}); remove that file and run the same "
                      "`bert-jax embed` again to embed it again")


def _read_shard(file, dim: int | None, *, vectors: bool = True) -> tuple[np.ndarray, Any]:
    """(ids, vectors) of a shard file (its bytes checked by _shard_bytes), checked to be a shard
    of `dim`-wide vectors (None: any width): ids a list of strings, vectors float32 [len(ids),
    dim], finite. With vectors=False, for a shard whose bytes are those recorded when it was
    written (finite then), only the ids are decoded, and the vectors' shape and type from their
    header (a resume's check); otherwise the vectors are read and checked finite. A damaged or
    foreign file is a ValueError naming it."""
    data, recorded = _shard_bytes(file)
    vectors = vectors or not recorded
    try:
        with io.BytesIO(data) as f, np.load(f, allow_pickle=False) as z:
            ids = z["ids"]
            if vectors:
                got = z["vectors"]
                shape, dtype = got.shape, got.dtype
            else:
                got = None
                with zipfile.ZipFile(f) as archive, archive.open("vectors.npy") as v:
                    version = np.lib.format.read_magic(v)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(v)
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise _not_whole(file, f"{type(e).__name__}: {e}") from None
    if ids.ndim != 1 or ids.dtype.kind != "U":
        raise _not_whole(file, f"ids of type {ids.dtype} and shape {ids.shape}, expected strings")
    dim = dim if dim is not None else shape[-1] if len(shape) == 2 else -1
    if dtype != np.float32 or tuple(shape) != (len(ids), dim):
        raise _not_whole(file, f"vectors {dtype} {tuple(shape)}, expected float32 {(len(ids), dim)}: "
                         f"a vector of {dim} for each of its {len(ids)} ids")
    if got is not None and not np.isfinite(got).all():
        raise _not_whole(file, f"{int((~np.isfinite(got)).any(1).sum())} vectors not finite")
    return ids, got


def read_manifest(folder, what: str) -> dict:
    """The folder's embed.json, each key of the type embed writes (the shard count the rows'),
    else a ValueError naming the file and key, ending with `what`."""
    where = paths.path(folder) / MANIFEST
    manifest = paths.read_json(where, what)
    for key, kind in _MANIFEST_KEYS.items():
        paths.json_field(manifest, key, kind, where, what,
                         at_least=1 if key in ("rows", "shard_size", "shards") else None)
    for key, (kind, least) in sentence_models.SPEC_KINDS.items():  # named by their dotted path
        paths.json_field(manifest, f"sentence.{key}", kind, where, what, at_least=least)
    if manifest["shards"] != -(-manifest["rows"] // manifest["shard_size"]):
        raise ValueError(f"{where}: shards={manifest['shards']} is not the {manifest['rows']} rows "
                         f"in shards of {manifest['shard_size']}; {what}")
    return manifest


_MANIFEST_KEYS = {"format": int, "checkpoint": str, "step": int, "input": str, "fingerprint": str,
                  "rows": int, "shard_size": int, "shards": int, "sentence": dict}


def _check_manifest(folder, manifest: dict) -> bool:
    """True if `folder` already holds shards of this same embedding (a resume); False for a new
    folder. A folder of another embedding, or one with files but no manifest, is refused."""
    root = paths.path(folder)
    where = root / MANIFEST
    if not where.exists():
        if root.exists() and any(f.name != MANIFEST and not f.name.endswith(".partial")
                                 and not f.name.startswith("part-") for f in root.iterdir()):
            raise FileExistsError(f"--output={folder}: a folder with files but no {MANIFEST}; embed "
                                  "writes only into a new folder or one it wrote: choose a new --output")
        return False
    old = read_manifest(folder, "embed wrote it and reads it to resume: restore it, or choose a "
                              "new --output (the shards there are kept)")
    was, now = trees.dotted(old), trees.dotted(manifest)
    differ = [k for k in {**now, **was} if k.split(".")[0] in manifest
              and k.split(".")[0] not in _NOT_COMPARED and was.get(k) != now.get(k)]
    if differ:
        # Another corpus: said as such (its fingerprint, row and shard counts follow from it).
        changed = (f"from another input: {was.get('input')!r} then, {now.get('input')!r} now, whose "
                   "ids or texts differ" if "fingerprint" in differ else "")
        differ = [k for k in differ if not changed or k not in _OF_THE_INPUT]
        said = "; ".join(filter(None, [changed, differ and (
            "with " + ", ".join(f"{k}={was.get(k)!r}" for k in differ) + "; this run has "
            + ", ".join(f"{k}={now.get(k)!r}" for k in differ))]))
        raise ValueError(f"{where}: the shards there were made {said}: one folder holds one "
                         "embedding; choose a new --output (the shards there are kept)")
    return True


_OF_THE_INPUT = ("fingerprint", "rows", "shards")  # follow from the corpus


_NOT_COMPARED = ("input",)  # the corpus is its fingerprint: a moved or renamed file resumes


def _model_dim(checkpoint_dir: str, step: int) -> int:
    """The width of the checkpoint's sentence vectors (its encoder's hidden size)."""
    from bert_jax import models
    from bert_jax.training import checkpoint

    model_cfg = checkpoint.read_config(checkpoint_dir, step)["model"]
    return models.split_model_config(model_cfg)[1].emb_dim


def hosts() -> tuple[int, int]:
    """(this process's index, the number of processes): JAX's, once the command started them."""
    return jax.process_index(), jax.process_count()


def embed_to_shards(checkpoint_dir: str, input_path: str, folder: str, *, shard_size: int = 10_000,
                    batch_size: int = 32, spec: sentence_models.SentenceSpec | None = None,
                    process_index: int | None = None, process_count: int | None = None) -> dict:
    """Embeds the corpus `input_path` into `folder` (the module docstring), this host's shards
    only (`process_index` of `process_count`, by default JAX's), skipping those already there.
    Returns a summary: rows, shards, written, kept (shards found whole)."""
    from bert_jax.training import checkpoint

    if shard_size < 1:
        raise ValueError(f"--shard_size={shard_size}: at least one row per shard")
    p, count = hosts() if process_index is None else (process_index, process_count)
    ids, texts = read_corpus(input_path)
    spec = spec or sentence_models.read_spec(checkpoint_dir)
    step = checkpoint.resolve_step(checkpoint_dir)  # the latest now: a resume uses the same
    n = -(-len(ids) // shard_size)
    where = str(checkpoint_dir) if paths.is_remote(checkpoint_dir) else os.path.abspath(checkpoint_dir)
    manifest = {"format": FORMAT, "checkpoint": where, "step": step, "input": str(input_path),
                "fingerprint": fingerprint(ids, texts), "rows": len(ids), "shard_size": shard_size,
                "shards": n, "sentence": dataclasses.asdict(spec)}
    resuming = _check_manifest(folder, manifest)  # before the weights are loaded
    root = paths.path(folder)
    if not resuming:  # every host, before its first shard: the same content from each
        root.mkdir(parents=True, exist_ok=True)
        _write(folder, MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    mine = range(p, n, count)
    pending = [k for k in mine if not (root / shard_name(k, n)).exists()]
    dim = _model_dim(checkpoint_dir, step)
    # Written by an earlier run: its bytes as its CRC32 says (or, a shard without one, its
    # vectors finite), its ids this corpus's.
    for k in sorted(set(mine) - set(pending)):
        name = shard_name(k, n)
        got, _ = _read_shard(root / name, dim, vectors=False)
        if list(got) != ids[k * shard_size:(k + 1) * shard_size]:
            raise ValueError(f"{root / name}: holds other ids than rows {k * shard_size}-"
                             f"{min(len(ids), (k + 1) * shard_size) - 1} of {input_path}; remove "
                             "that file to embed it again")
    # With several hosts each loads the weights (a restore may wait for every host), even
    # one whose shards are all there.
    encoder = sentence_models.Encoder(checkpoint_dir, spec, step=step) if pending or count > 1 else None
    for k in pending:
        rows = slice(k * shard_size, (k + 1) * shard_size)
        name = shard_name(k, n)
        vectors = encoder.encode(texts[rows], batch_size)
        if not np.isfinite(vectors).all():  # a broken checkpoint: nothing written, nothing kept
            bad = [i for i, ok in zip(ids[rows], np.isfinite(vectors).all(1)) if not ok]
            raise ValueError(f"{checkpoint_dir}: gives vectors that are not finite (NaN or infinity) "
                             f"for {len(bad)} of the texts of shard {k} (ids {', '.join(bad[:3])}"
                             f"{', ...' if len(bad) > 3 else ''}); {root / name} not written (the "
                             "shards before it are kept): check that checkpoint (`bert-jax eval`)")
        _write_shard(folder, name, ids[rows], vectors)
        log.info(f"embed: wrote {root / name} ({len(ids[rows])} rows)")
    return {"rows": len(ids), "shards": n, "written": len(pending), "kept": len(mine) - len(pending),
            "output": str(folder)}


def load(folder: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """(ids, vectors [rows, dim]) of a folder embed_to_shards wrote, in the corpus's order; a
    missing shard (hosts still at work, or a killed run not yet resumed) is an error naming it."""
    root = paths.path(folder)
    manifest = read_manifest(folder, f"{folder} is not a folder `bert-jax embed` wrote as it is")
    ids: list[str] = []
    parts = []
    for k in range(manifest["shards"]):
        file = root / shard_name(k, manifest["shards"])
        if not file.exists():
            raise FileNotFoundError(f"{file}: missing; run the same `bert-jax embed` again to "
                                    "embed the shards not yet written")
        got, vectors = _read_shard(file, parts[0].shape[1] if parts else None)
        ids += [str(i) for i in got]
        parts.append(vectors)
    if len(ids) != manifest["rows"]:
        raise ValueError(f"{root / MANIFEST}: rows={manifest['rows']}, but its shards hold "
                         f"{len(ids)}; remove the folder and embed again")
    return ids, np.concatenate(parts)
