"""Checksums of a checkpoint's files. Orbax checks none of the bytes it restores (a flipped byte in
an array file restores silently, as a wrong number), so `<step>/checksums.json` lists every file
of the step with its size and CRC32, written once the step's files are complete; a restore
compares them first and names the first files that differ. A step saved before checksums were
written has no list: it restores unverified, as it always did."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence

from etils import epath

MANIFEST = "checksums.json"
# Orbax's own record of a step (ocp _STEP_METADATA_FILENAME): made when the save starts, given
# the commit time when it is committed.
ORBAX_METADATA = "_CHECKPOINT_METADATA"
# Not covered: the list itself, and what Orbax writes after it when it commits the step (its
# timestamp in the step's metadata; the commit marker on object stores, without which Orbax
# skips the step).
_NOT_COVERED = {MANIFEST, ORBAX_METADATA, "commit_success.txt"}
_CHUNK = 16 << 20  # zlib.crc32 runs at ~3 GB/s: reading, not hashing, is the cost


class DamagedCheckpoint(ValueError):
    """A checkpoint file whose bytes differ from those written at save: `details` says which."""

    def __init__(self, step_dir, details: str):
        super().__init__(f"checkpoint {step_dir} is damaged: {details}")
        self.details = details


def crc32(source: epath.Path | bytes) -> tuple[int, str]:
    """(size, CRC32 as 8 hex digits) of a file, read in 16 MiB chunks, or of bytes in memory
    (a file about to be written: embed's shards)."""
    if isinstance(source, bytes):
        return len(source), f"{zlib.crc32(source):08x}"
    crc = size = 0
    with source.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return size, f"{crc:08x}"


def _files(step_dir: epath.Path) -> list[str]:
    """The step's files, as paths relative to it ('params/d/1a2b...'), the list left out."""
    def bare(path) -> str:  # walk gives gs:// folders without their scheme
        return str(path).split("://", 1)[-1].rstrip("/")

    found, top = [], bare(step_dir)
    for folder, _, names in step_dir.walk():
        rel = bare(folder)[len(top):].strip("/")
        found += [f"{rel}/{n}" if rel else n for n in names]
    return sorted(f for f in found if f not in _NOT_COVERED)


def write(step_dir: epath.Path) -> None:
    """Writes `<step_dir>/checksums.json` for the files now in the step (one process does)."""
    files = {}
    for rel in _files(step_dir):
        size, crc = crc32(step_dir / rel)
        files[rel] = {"size": size, "crc32": crc}
    (step_dir / MANIFEST).write_text(json.dumps({"algorithm": "crc32", "files": files}, indent=1) + "\n")


def unfinished(step_dir: epath.Path) -> str | None:
    """What says that the step was not written by a finished Orbax save ('has no
    _CHECKPOINT_METADATA', ...), None when its metadata holds a commit time. Orbax itself
    restores such a step (an older Orbax, or another tool, wrote no metadata), logging
    only that the file is missing."""
    try:
        metadata = json.loads((step_dir / ORBAX_METADATA).read_text())
    except FileNotFoundError:
        return f"has no {ORBAX_METADATA} (every Orbax save writes one)"
    except (OSError, ValueError) as e:
        return f"has an unreadable {ORBAX_METADATA} ({type(e).__name__})"
    if not isinstance(metadata, dict) or not metadata.get("commit_timestamp_nsecs"):
        return f"was never committed (its {ORBAX_METADATA} has no commit time)"
    return None


def verify(step_dir: epath.Path, items: Sequence[str] | None = None) -> bool:
    """Compares the files of `items` (the checkpoint's folders: params, opt_state...; all files
    when None) with `checksums.json`: True when they match, False when the step has no list
    (saved before checksums were written). A file that differs or is missing is a
    DamagedCheckpoint naming the step and the first such files."""
    try:
        listed = json.loads((step_dir / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return False
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpoint(step_dir, f"its {MANIFEST} cannot be read ({type(e).__name__}: "
                                          f"{e})") from None
    wanted = sorted(rel for rel in listed
                    if items is None or rel.split("/", 1)[0] in items)
    bad = []
    for rel in wanted:
        try:
            size, crc = crc32(step_dir / rel)
        except FileNotFoundError:
            bad.append(f"{rel} is missing")
            continue
        want = listed[rel]
        if size != want["size"]:
            bad.append(f"{rel} has {size:,} bytes, {want['size']:,} when saved")
        elif crc != want["crc32"]:
            bad.append(f"{rel} differs from when it was saved (CRC32 {crc}, was {want['crc32']})")
    if bad:
        more = f" (and {len(bad) - 3} more files)" if len(bad) > 3 else ""
        raise DamagedCheckpoint(step_dir, f"{'; '.join(bad[:3])}{more}")
    return True
