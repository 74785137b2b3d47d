"""Read TensorFlow checkpoints (the V2 tensor-bundle format of tf.train.Saver and
tf.train.Checkpoint) into numpy without TensorFlow.

A checkpoint `<prefix>` is `<prefix>.index` and `<prefix>.data-<shard>-of-<num_shards>`. The
index is a LevelDB-format table (SSTable) mapping each tensor name to a BundleEntryProto
(dtype, shape, shard, offset, size, masked CRC32C of the bytes); the entry under the empty key
is the BundleHeaderProto (number of shards, byte order). The protobufs are decoded by hand:
they are three small messages, not worth a protobuf dependency.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import ml_dtypes
import numpy as np

__all__ = ["TFCheckpointError", "list_tf_checkpoint", "read_tf_checkpoint"]

_TABLE_MAGIC = 0xDB4775248B80FB57  # LevelDB's kTableMagicNumber, as TensorFlow's table uses it
_FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic
_BLOCK_TRAILER = 5  # after each block: compression type (1 byte) + masked crc32c (4 bytes)
_CRC_MASK_DELTA = 0xA282EAD8

# tensorflow/core/framework/types.proto DataType -> numpy (numeric types only).
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
           9: np.int64, 10: np.bool_, 14: ml_dtypes.bfloat16, 17: np.uint16, 19: np.float16,
           22: np.uint32, 23: np.uint64}
_DT_STRING = 7


class TFCheckpointError(ValueError):
    """A file that is not a readable TensorFlow checkpoint (names the file and the problem)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: a BundleEntryProto."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the base-128 varint at buf[pos]."""
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise IndexError("truncated or overlong varint")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _proto_fields(buf: bytes) -> dict[int, list]:
    """{field number: [values]} of a protobuf message: ints for varint/fixed fields, bytes
    for length-delimited ones (sub-messages are decoded by the caller that knows them)."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = bytes(buf[pos:pos + n]), pos + n
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise IndexError("truncated protobuf field")
        fields.setdefault(number, []).append(value)
    return fields


def _signed(v: int) -> int:
    """An int64 field's varint as a signed value (negative numbers take ten bytes)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _entry(value: bytes) -> TensorEntry:
    """Decodes a BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5,
    crc32c=6 (fixed32), slices=7; TensorShapeProto: dim=2 (Dim: size=1), unknown_rank=3."""
    f = _proto_fields(value)
    shape_fields = _proto_fields(f[2][-1]) if 2 in f else {}
    if shape_fields.get(3, [0])[-1]:
        raise ValueError("tensor of unknown rank")
    dims = tuple(_signed(_proto_fields(d).get(1, [0])[-1]) for d in shape_fields.get(2, []))
    if any(d < 0 for d in dims):
        raise ValueError(f"tensor of unknown shape {dims}")
    last = lambda k: f.get(k, [0])[-1]
    return TensorEntry(dtype=last(1), shape=dims, shard_id=last(3), offset=_signed(last(4)),
                       size=_signed(last(5)), crc32c=f[6][-1] if 6 in f else None,
                       sliced=7 in f)


def _unmask(masked: int) -> int:
    """LevelDB/TensorFlow store CRCs masked (rotated and offset) so CRCs of CRCs stay useful."""
    rot = (masked - _CRC_MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _block(data: bytes, handle: bytes, path: Path) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of the table block at `handle` (offset, size varints)."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    if offset + size + _BLOCK_TRAILER > len(data):
        raise IndexError(f"block at {offset} (+{size}) runs past the end of the file")
    block = data[offset:offset + size]
    kind, crc = data[offset + size], struct.unpack_from("<I", data, offset + size + 1)[0]
    if google_crc32c.value(data[offset:offset + size + 1]) != _unmask(crc):
        raise ValueError(f"checksum mismatch in the table block at byte {offset}")
    if kind != 0:
        raise ValueError(f"compressed table block (type {kind}); only uncompressed tables, "
                         "as TensorFlow writes them, are supported")
    (num_restarts,) = struct.unpack_from("<I", block, size - 4)
    end = size - 4 - 4 * num_restarts
    entries, key, pos = [], b"", 0
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        n_value, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + n_value]))
        pos += n_value
    if pos != end:
        raise ValueError(f"malformed table block at byte {offset}")
    return entries


def _index_path(prefix: str | os.PathLike) -> Path:
    path = Path(f"{prefix}.index")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; expected a TensorFlow checkpoint "
                                "<prefix>.index with its <prefix>.data-*-of-* files")
    return path


def list_tf_checkpoint(prefix: str | os.PathLike) -> tuple[dict[str, TensorEntry], int, bool]:
    """({name: entry}, number of data shards, big-endian?) from `<prefix>.index`."""
    path = _index_path(prefix)
    data = path.read_bytes()
    try:
        if len(data) < _FOOTER_SIZE or struct.unpack_from("<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
            raise ValueError("no table footer (wrong magic number)")
        footer = data[-_FOOTER_SIZE:]
        _, pos = _varint(footer, _varint(footer, 0)[1])  # skip the metaindex handle
        index_handle = footer[pos:]
        entries = {}
        for _, handle in _block(data, index_handle, path):
            for key, value in _block(data, handle, path):
                entries[key.decode("utf-8")] = value
        if "" not in entries:
            raise ValueError("no bundle header")
        header = _proto_fields(entries.pop(""))  # num_shards=1, endianness=2 (1: big)
        num_shards, big = header.get(1, [1])[-1], header.get(2, [0])[-1] == 1
        tensors = {name: _entry(value) for name, value in entries.items()}
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        raise TFCheckpointError(f"{path}: not a readable TensorFlow checkpoint index ({e})") from e
    return tensors, num_shards, big


def read_tf_checkpoint(prefix: str | os.PathLike, keep=lambda name: True) -> dict[str, np.ndarray]:
    """{name: array} of the numeric tensors whose name `keep` accepts (strings, such as TF2's
    object graph, are skipped); each tensor's bytes are checked against its CRC32C."""
    tensors, num_shards, big = list_tf_checkpoint(prefix)
    out, files = {}, {}
    with contextlib.ExitStack() as stack:
        for name, e in sorted(tensors.items(), key=lambda kv: (kv[1].shard_id, kv[1].offset)):
            if e.dtype == _DT_STRING or not keep(name):
                continue
            where = f"{prefix}.data-{e.shard_id:05d}-of-{num_shards:05d}"
            if e.sliced:
                raise TFCheckpointError(f"{where}: {name} is a partitioned variable (saved in "
                                        "slices), which is not supported")
            if e.dtype not in _DTYPES:
                raise TFCheckpointError(f"{where}: {name} has unsupported TensorFlow dtype {e.dtype}")
            if where not in files:
                if not Path(where).is_file():
                    raise FileNotFoundError(f"{where}: not found; the checkpoint index "
                                            f"{prefix}.index lists tensors in it")
                files[where] = stack.enter_context(open(where, "rb"))
            f = files[where]
            f.seek(e.offset)
            raw = f.read(e.size)
            dtype = np.dtype(_DTYPES[e.dtype])
            if len(raw) != e.size or e.size != dtype.itemsize * int(np.prod(e.shape)):
                raise TFCheckpointError(f"{where}: {name} is truncated or has the wrong size "
                                        f"({len(raw)} bytes read, shape {e.shape} of {dtype})")
            if e.crc32c is not None and google_crc32c.value(raw) != _unmask(e.crc32c):
                raise TFCheckpointError(f"{where}: checksum mismatch for {name}; the file is "
                                        "corrupt or incomplete (download it again)")
            arr = np.frombuffer(raw, dtype)
            if big and dtype.itemsize > 1:  # swapped via a same-width uint view (bfloat16 too)
                arr = arr.view(f"u{dtype.itemsize}").byteswap().view(dtype)
            out[name] = arr.reshape(e.shape).copy()
    return out
