"""Read Hugging Face checkpoint weights into numpy, without torch and without running pickle code."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import safetensors.numpy

__all__ = ["load_hf_weights", "resolve_model_dir"]

log = logging.getLogger(__name__)

# Looked up in this order: safetensors is safe and fast; .bin is the fallback for old repos.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

_TORCH_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}

_SAFETENSORS_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The folder holding a model's files: `path` itself, or for a Hugging Face cache entry
    (`models--org--name`, with snapshots/ and refs/) the snapshot that refs/main names (or its
    only snapshot). A snapshot's files are symlinks into blobs/, read through as usual."""
    path = Path(path)
    snapshots = path / "snapshots"
    if not snapshots.is_dir():
        return path
    ref = path / "refs" / "main"
    if ref.is_file():
        snapshot = snapshots / ref.read_text().strip()
        if not snapshot.is_dir():
            raise FileNotFoundError(f"{ref} names snapshot {snapshot.name}, which is not in "
                                    f"{snapshots}; download the model again")
    else:
        found = sorted(p for p in snapshots.iterdir() if p.is_dir())
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise FileNotFoundError(f"{path}: no refs/main and {len(found)} snapshots ({names}); "
                                    f"pass one folder, e.g. {snapshots}/<hash>")
        snapshot = found[0]
    log.info(f"{path}: Hugging Face cache entry, reading snapshot {snapshot.name}")
    return snapshot


def load_hf_weights(model_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Return {name: array} for the weights in a Hugging Face model directory, names unchanged."""
    model_dir = Path(model_dir)
    for name in WEIGHT_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        if name.endswith(".index.json"):
            return _load_sharded(path, _load_safetensors if "safetensors" in name else _load_torch_zip)
        return _load_safetensors(path) if name.endswith(".safetensors") else _load_torch_zip(path)
    raise FileNotFoundError(f"No weights in {model_dir}: looked for {', '.join(WEIGHT_FILES)}")


def check_download(path: Path) -> None:
    """A weights file of a Hugging Face cache snapshot links to blobs/<the SHA-256 of its bytes>
    (large files are stored in Git LFS, named by their hash): bytes that differ from that
    name (damaged on disk, or written over) are a ValueError naming the file, before any is
    read; other files have no recorded hash and pass."""
    blob = path.resolve()
    if not path.is_symlink() or blob.parent.name != "blobs" or not re.fullmatch(r"[0-9a-f]{64}",
                                                                                 blob.name):
        return
    digest = hashlib.sha256()
    with open(blob, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != blob.name:
        raise ValueError(f"{path}: its bytes differ from the SHA-256 its download recorded (the "
                         f"blob's name, {blob}): the file is damaged; download the model again "
                         "(huggingface-cli download <model> --force-download)")


def _load_sharded(index_path: Path, load_one) -> dict[str, np.ndarray]:
    """Load every shard listed in an HF *.index.json weight_map and check all names arrived."""
    try:
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("weight_map is not {tensor name: shard file}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index_path}: not a valid sharded-checkpoint index ({e})") from e
    out: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        path = index_path.parent / shard
        # A shard is a file beside the index: a path elsewhere is not one (nor read).
        if Path(shard).name != shard or not path.is_file():
            raise FileNotFoundError(f"{index_path}: lists shard {shard!r}, which is not a file in "
                                    f"{index_path.parent}; download the model's files again")
        out.update(load_one(path))
    missing = sorted(set(weight_map) - set(out))
    if missing:
        raise ValueError(f"{index_path}: tensors listed in weight_map but absent from shards: {missing[:5]}")
    return out


# Bytes per element of every dtype the safetensors format defines.
_SAFETENSORS_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_safetensors(path: Path) -> tuple[dict[str, Any], int]:
    """(header, where its data starts) of safetensors file `path`, checked before any tensor is
    read: the header's length against the file's, its JSON, and each tensor's dtype and shape
    against its byte range, the ranges tiling the data exactly (none outside it, overlapping or
    leaving bytes to no tensor). Anything else is a ValueError naming the file and the fault."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: not a valid safetensors file: {what}; the file is damaged or "
                          "not a safetensors file: download the model's files again")

    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length it starts with")
        (n,) = struct.unpack("<Q", prefix)
        if not 2 <= n <= size - 8:
            raise bad(f"its header length says {n} bytes but {size - 8} follow it")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"its {n}-byte header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an object")
    data, spans = size - 8 - n, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(info, dict) and {"dtype", "shape", "data_offsets"} <= set(info)):
            raise bad(f"tensor {name!r} has no dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _SAFETENSORS_SIZES:
            raise bad(f"tensor {name!r} has dtype {dtype!r}, which safetensors does not define")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r} has shape {shape!r}, not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise bad(f"tensor {name!r} has data_offsets {offsets!r}, not [start, end]")
        start, end = offsets
        if end > data:
            raise bad(f"tensor {name!r} ends at byte {end} of the data, which has {data} bytes "
                      "(the file is cut short)")
        need = int(np.prod(shape, dtype=np.int64)) * _SAFETENSORS_SIZES[dtype]
        if end - start != need:
            raise bad(f"tensor {name!r} is {dtype} {shape} ({need} bytes) but its byte range "
                      f"[{start}, {end}) holds {end - start}")
        spans.append((start, end, name))
    at, last = 0, None
    for start, end, name in sorted(spans):
        if start < at:
            raise bad(f"tensors {last!r} and {name!r} overlap (bytes {start} to {at} of the data)")
        if start > at:
            raise bad(f"bytes {at} to {start} of the data belong to no tensor")
        at, last = end, name
    if at != data:
        raise bad(f"bytes {at} to {data} of the data belong to no tensor")
    return header, 8 + n


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Load a .safetensors file (its header checked first); our own parser where this
    safetensors release lacks bf16."""
    check_download(path)
    check_safetensors(path)
    try:
        return safetensors.numpy.load_file(path)
    except (TypeError, ValueError, KeyError, safetensors.SafetensorError):
        # Old safetensors releases map dtypes via np.dtype("bfloat16"), which numpy rejects.
        return _read_safetensors_raw(path)


def _read_safetensors_raw(path: Path) -> dict[str, np.ndarray]:
    """Parse safetensors by hand (header checked: check_safetensors), then raw little-endian bytes."""
    header, begin = check_safetensors(path)
    body = memoryview(Path(path).read_bytes())[begin:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which this "
                             f"converter does not read ({', '.join(_SAFETENSORS_DTYPES)})")
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<")
        start, end = info["data_offsets"]
        arr = np.frombuffer(body[start:end], dtype=dtype).reshape(info["shape"])
        out[name] = arr.astype(dtype.newbyteorder("="), copy=True)
    return out


class _StorageType:
    """Stand-in for a torch.*Storage class: only the element dtype matters to us."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None) -> np.ndarray:
    """Numpy version of torch._utils._rebuild_tensor_v2: strided view of storage, then a copy."""
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(size) != len(stride) or any(s < 0 for s in size + stride) or storage_offset < 0:
        raise pickle.UnpicklingError(f"bad tensor geometry size={size} stride={stride}")
    # as_strided does no bounds checking, so a hostile pickle could otherwise read stray memory.
    if all(size):
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.size:
            raise pickle.UnpicklingError(f"tensor view exceeds its storage ({last} >= {storage.size})")
    base = storage[storage_offset:] if storage_offset < storage.size else storage[:0]
    view = np.lib.stride_tricks.as_strided(
        base, shape=size, strides=tuple(s * storage.itemsize for s in stride), writeable=False)
    # Copy so views of a shared storage do not alias each other or the zip buffer.
    return np.array(view, copy=True, order="C")


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None) -> np.ndarray:
    """nn.Parameter wrapper carries nothing we need beyond the tensor itself."""
    return data


# The only globals a plain state dict pickle references, mapped to numpy stand-ins.
_ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "UntypedStorage"): _StorageType(np.uint8),
    ("torch.storage", "UntypedStorage"): _StorageType(np.uint8),
    **{("torch", k): _StorageType(v) for k, v in _TORCH_STORAGE_DTYPES.items()},
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for torch zip checkpoints that only resolves state-dict globals, to numpy stand-ins."""

    def __init__(self, file, zf: zipfile.ZipFile, prefix: str, path: Path, big_endian: bool):
        super().__init__(file)
        self._zf, self._prefix, self._path, self._big = zf, prefix, path, big_endian
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only allow-listed globals; anything else could execute code."""
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"{self._path}: refusing forbidden global '{module}.{name}' in pickle; "
                "only plain tensor state dicts can be loaded") from None

    def persistent_load(self, pid: Any) -> np.ndarray:
        """Turn ('storage', type, key, location, numel) into a flat numpy array from data/<key>."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"{self._path}: unsupported persistent id {pid!r}")
        _, stype, key, _location, numel = pid
        key = str(key)
        if key not in self._storages:
            try:
                buf = self._zf.read(f"{self._prefix}/data/{key}")
            except KeyError:
                raise pickle.UnpicklingError(f"{self._path}: storage data/{key} missing") from None
            dtype = stype.dtype
            if len(buf) < numel * dtype.itemsize:
                raise pickle.UnpicklingError(f"{self._path}: storage data/{key} is truncated")
            arr = np.frombuffer(buf, dtype=dtype, count=int(numel))
            if self._big and dtype.itemsize > 1:
                # Swap via a same-width uint view: works for ml_dtypes.bfloat16 too.
                uint = np.dtype(f"u{dtype.itemsize}")
                arr = arr.view(uint).byteswap().view(dtype)
            self._storages[key] = arr
        return self._storages[key]


def _load_torch_zip(path: Path) -> dict[str, np.ndarray]:
    """Load a torch.save zip archive (torch>=1.6) as numpy, refusing any non-state-dict pickle."""
    check_download(path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            legacy = f.read(1) == b"\x80"  # a bare pickle stream: the pre-1.6 torch.save format
        kind = "the legacy (pre-1.6) torch.save format" if legacy else "not a torch zip archive"
        raise ValueError(
            f"{path}: {kind}; re-save it with torch>=1.6 (torch.save) or convert it to "
            "safetensors (safetensors.torch.save_file) and load that instead")
    with zipfile.ZipFile(path) as zf:
        pkls = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise ValueError(f"{path}: expected one <prefix>/data.pkl in the archive, found {pkls}")
        prefix = pkls[0].split("/")[0]
        try:
            big = zf.read(f"{prefix}/byteorder").strip() == b"big"
        except KeyError:
            big = False  # archives from before the byteorder record were always little-endian
        with zf.open(pkls[0]) as f:
            try:
                obj = _RestrictedUnpickler(f, zf, prefix, path, big).load()
            except Exception as e:  # noqa: BLE001 (a hostile or damaged pickle can raise anything)
                message = str(e) if str(e).startswith(str(path)) else f"{path}: {type(e).__name__}: {e}"
                raise ValueError(f"{message}; convert the weights to model.safetensors "
                                 "(safetensors.torch.save_file), which holds no code") from None
    if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()):
        raise ValueError(f"{path}: expected a flat {{name: tensor}} state dict")
    return dict(obj)
