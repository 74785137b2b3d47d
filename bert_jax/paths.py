"""Paths: local files and object-store URLs (gs://...) as one kind of path for everything the
code reads or writes (data, tokenizers, checkpoints, outputs), globs over either, and the lock
that keeps two runs out of one workdir.

Local paths behave exactly as Python's own (pathlib.Path, glob.glob); only a URL goes through
etils.epath / fsspec (gcsfs for gs://). Code that needs a real local file (a C++ reader or
writer without object-store support) stages it through `local_copy` / `staged_output`.
Every gs:// path object the code makes (`path`, `workdir_path`, and `glob`, `open`, `local_copy`,
`staged_output`, `copy_file` which use them) first passes one storage policy,
`check_reachable`: GCS accepts a connection within CONNECT_DEADLINE_S, else one line naming
GCS and the network instead of a minute or more of gcsfs retries per request. A store that
answers but keeps failing (503s, 429s, stalls) is retried by one policy, `retry_policy()`, for
every gs:// client (gcsfs here, tensorstore through training/checkpoint.py), and when its
tries are spent the operation fails in one line (StorageFailing) naming the path."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import glob as glob_lib
import io
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO
from urllib.parse import parse_qs, unquote, urlparse

from etils import epath

# The checkout this package runs from (configs/, benchmarks/ and the README sit there).
REPO = Path(__file__).resolve().parents[1]


def shared_data() -> Path:
    """The project's real test data: ../shared/data beside the checkout, or
    $BERT_JAX_SHARED_DATA (configs/multi30k.py and the benchmarks read it)."""
    return Path(os.environ.get("BERT_JAX_SHARED_DATA") or REPO.parent / "shared" / "data")


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")  # a URL's start: "gs://", "s3:/", "GS://"


def check_given(value: str, what: str) -> None:
    """A path the user gave (`what`: its flag, e.g. "--workdir"): a local path or a gs:// URL.
    Empty, another scheme (s3://, http://), or a Cloud Storage URL miswritten (GS://, gs:/x)
    is a ValueError naming it, rather than a folder of that name made here; so is gs:// without
    a bucket."""
    if not value.strip():
        raise ValueError(f"{what} is empty; give a local path or a gs:// URL")
    scheme = _SCHEME.match(value)
    if value.startswith("gs://") and not value[len("gs://"):].split("/")[0]:
        raise ValueError(f"{what}={value}: no bucket; give gs://BUCKET/path")
    if scheme is None or value.startswith("gs://"):
        return
    if scheme.group(1).lower() == "gs":
        fixed = "gs://" + value[len(scheme.group(0)):].lstrip("/")
        raise ValueError(f"{what}={value}: a Cloud Storage URL is written gs://bucket/path (lower "
                         f"case, two slashes): {fixed}")
    raise ValueError(f"{what}={value}: {scheme.group(1)}:// is not a storage bert-jax reads; give "
                     "a local path or a gs:// URL")


def check_output(value: str | os.PathLike, what: str, kind: str) -> None:
    """An output the user gave (`what`: its flag or argument, e.g. "--out"), a `kind` "folder"
    or "file" to be written: a local file where the folder must be (the path itself or a folder
    above it), or a folder where the file must be, is an error naming it, before anything is
    computed. (An object store has no such clash: gs:// passes.)"""
    if is_remote(value):
        return
    given = Path(value)
    if kind == "file" and given.is_dir():
        raise IsADirectoryError(f"{what}={value} is a directory, not a file; choose another {what} "
                                "(a file name)")
    for part in ([given] if kind == "folder" else []) + list(given.absolute().parents):
        if part.is_file():
            where = "is a file, not a folder" if part == given else f"is inside {part}, a file"
            raise NotADirectoryError(f"{what}={value} {where}; choose another {what}")
        if part.exists():
            return


# File kinds known by their name's ending (what bert_jax reads and writes, and common ones
# beside them): an output named so is meant as a file of that kind, never a folder.
FILE_EXTENSIONS = (".npy", ".npz", ".json", ".jsonl", ".txt", ".tsv", ".csv", ".png", ".svg",
                   ".pdf", ".html", ".jpg", ".jpeg", ".gz", ".zip", ".tar", ".safetensors", ".bin",
                   ".pt", ".pkl", ".h5", ".msgpack", ".py", ".model")


def output_kind(value: str | os.PathLike, what: str, command: str, files: Sequence[str] = (),
                other: str = "file") -> str:
    """What `command` writes at the output `value` the user gave (`what`: its flag), by its
    name: "file" for a name ending in one of `files` (its extensions; plot's .PNG is a .png),
    else `other`: "folder" (a name without a file extension), "file" (any name not ending
    like another kind of file, e.g. a translation's .de), or "" (none: only `files`). A name
    ending in another kind of file (FILE_EXTENSIONS, any case) is a ValueError naming what
    the command writes there, before anything is read: `embed --output v.npz` would make a
    folder named v.npz. An existing folder is a folder (a run resumed into it)."""
    name = os.path.basename(str(value).rstrip("/"))
    ext = os.path.splitext(name)[1]
    wanted = [f"a {e} file" for e in files] + (
        ["a folder (a name without a file extension)"] if other == "folder" else [])
    if ext in files:
        return "file"
    if ext.lower() in files:
        if other != "folder":
            return "file"
        raise ValueError(f"{what}={value}: ends like a {ext.lower()} file but not in lowercase, which "
                         f"{command} would write as a folder; give '{ext.lower()}' for one file, or a "
                         "folder name without it")
    if other == "folder" and not is_remote(value) and Path(value).is_dir():
        return "folder"
    if other and ext.lower() not in FILE_EXTENSIONS:
        return other
    shown = f"ends in {ext}" if ext else "has no file extension"
    raise ValueError(f"{what}={value}: {shown}, which is not what {command} writes there; give "
                     f"{' or '.join(wanted)}")


@dataclasses.dataclass(frozen=True)
class PathKind:
    """What a path that exists is, for a message that says it is the wrong kind: `kind` names
    it ("run" for a training workdir or a convert output, "step", "sweep", "sentence-transformers",
    "hf", "beir", "qrels", "tokenizer", "tokenizer-file", "file", "folder"), `said` in words, and
    `instead` the path of the kind it belongs to (a step's run, a qrels file's BEIR folder, a
    tokenizer file's folder), with `detail` (the step, the split, a sweep's first trial)."""

    kind: str
    said: str
    instead: str = ""
    detail: str = ""


_TOKENIZER_FILES = ("vocab.txt", "spm.model", "tokenizer.json", "merges.txt")


def path_kind(value: str | os.PathLike) -> PathKind | None:
    """What the local path `value` is (PathKind), by the files that make each kind: None when
    nothing is there (or for a gs:// path: each look is a request there)."""
    if is_remote(value):
        return None
    p = Path(value)
    if p.is_file():
        if p.parent.name == "qrels" and p.suffix == ".tsv":
            return PathKind("qrels", "a BEIR qrels file", str(p.parent.parent), p.stem)
        if p.name in _TOKENIZER_FILES:
            return PathKind("tokenizer-file", "a tokenizer file", str(p.parent))
        return PathKind("file", "a file")
    if not p.is_dir():
        return None
    if p.parent.name == "checkpoints" and p.name.isdigit():
        return PathKind("step", f"the folder of step {p.name} of a run", str(p.parent.parent), p.name)
    if (p / "checkpoints").is_dir():
        return PathKind("run", "a checkpoint's run folder")
    if (p / "modules.json").is_file() or (p / "config_sentence_transformers.json").is_file():
        return PathKind("sentence-transformers", "a sentence-transformers folder")
    weights = any(p.glob("*.safetensors")) or (p / "pytorch_model.bin").is_file()
    if (p / "config.json").is_file() and weights:
        return PathKind("hf", "a Hugging Face model folder")
    if (p / "qrels").is_dir():
        return PathKind("beir", "a BEIR folder")
    trials = sorted(t.name for t in p.iterdir() if (t / "trial_config.json").is_file())
    if trials:
        return PathKind("sweep", f"a sweep's folder ({len(trials)} trial{'s' * (len(trials) > 1)})",
                        str(p / trials[0]))
    if (p / "metrics.jsonl").is_file():
        return PathKind("run", "a run folder")
    if any((p / name).is_file() for name in _TOKENIZER_FILES):
        return PathKind("tokenizer", "a tokenizer folder")
    return PathKind("folder", "a folder")


# How to get a path of the kind needed from one of another kind (`{p}`: the path given, and
# the PathKind's `{instead}` and `{detail}`).
_FIXES = {
    "step": "give its run folder {instead}{step}",
    "sweep": "give one of its trials' folders, e.g. {instead}",
    "sentence-transformers": "convert it first: bert-jax convert st:{p} <dir>, then give <dir>",
    "hf": "convert it first: bert-jax convert hf:{p} <dir>, then give <dir>",
    "qrels": "give the BEIR folder {instead} with --split {detail}",
    "tokenizer-file": "give its folder {instead}",
}


def wrong_kind(value: str | os.PathLike, what: str, wanted: Sequence[str], give: str, *,
               step_flag: bool = False) -> str | None:
    """The one line for `value` (the user's `what`: a flag or key, or "") when it exists but is not
    of a kind in `wanted` (PathKind.kind names): "<what>=<value> is <its kind>, not <give>;
    <how to get one>"; None when it is of one, or nothing is there (the reader's own message
    says so). `step_flag`: the command takes --step (a step folder: its run with --step N)."""
    found = path_kind(value)
    if found is None or found.kind in wanted:
        return None
    step = f" with --step {found.detail}" if step_flag else " (which reads its latest step)"
    fix = _FIXES.get(found.kind, "").format(p=value, instead=found.instead, detail=found.detail,
                                             step=step)
    named = f"{what}={value}" if what else str(value)
    return f"{named} is {found.said}, not {give}" + (f"; {fix}" if fix else "")


# The kinds of path that are folders (PathKind.kind), for a path where any folder may do.
FOLDER_KINDS = ("folder", "run", "step", "sweep", "sentence-transformers", "hf", "beir", "tokenizer")


def check_new_folder(value: str | os.PathLike, what: str, *, leftovers: Sequence[str] = ()) -> None:
    """An output folder the user gave (`what`: its flag or argument) that a command fills with
    files of its own (a checkpoint, its tokenizer, a Hugging Face folder, shards): missing or
    empty, never a folder holding other files (a vocab, a data set, another model's files)
    that the command's files would replace or sit beside. `leftovers`: names an interrupted
    run of the same command leaves, which it finds and handles itself."""
    folder = path(value)
    if not folder.is_dir():
        return
    held = sorted(p.name for p in folder.iterdir() if p.name not in leftovers)
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise FileExistsError(f"{what}={value}: not empty (holds {shown}); choose a new output "
                              "folder (or empty that one)")


def check_new_file(value: str | os.PathLike, what: str, command: str,
                   beside: Sequence[str | os.PathLike] = (),
                   contents: Mapping[str, bytes] | None = None) -> None:
    """An output file the user gave (`what`: its flag), and the files written `beside` it (a
    figure's data), are new: an existing one (another run's results, a figure of its own) is
    an error naming it, before anything is computed; `command` never overwrites a file. A file
    beside it whose bytes are given in `contents` (by its name as given) may exist holding
    exactly those: the same data, written for the same figure in another format."""
    contents = contents or {}
    for file in [value, *beside]:
        existing = path(file)
        if not existing.exists():
            continue
        if str(file) in contents and existing.is_file() and existing.read_bytes() == contents[str(file)]:
            continue
        named = "" if str(file) == str(value) else f"{file} "
        other = (f" and holds other data than {command} would write there (another run's or "
                 "another step's, or a file of yours)") if str(file) in contents else ""
        raise FileExistsError(f"{what}={value}: {named}already exists{other}; {command} never "
                              f"overwrites a file: choose a new {what} (or remove that one)")


def make_output_folder(value: str | os.PathLike, what: str) -> None:
    """Makes the folder of the output file `value` (`what`: its flag) where it is missing, as
    the commands that write folders make theirs, before anything is computed; one that cannot
    be made is an error naming the flag. (A bucket has no folders: gs:// passes.)"""
    if is_remote(value):
        return
    try:
        Path(value).absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"{what}={value}: cannot create its folder ({e.strerror or e}); choose "
                      f"another {what}") from None


def is_remote(path: str | os.PathLike) -> bool:
    """True for an object-store URL such as gs://bucket/run."""
    return "://" in str(path)


def workdir_path(directory: str | os.PathLike) -> epath.Path:
    """A local folder (made absolute) or an object store URL such as gs://bucket/run, as a path
    (pathlib.Path would turn "gs://b/run" into the local folder "gs:/b/run")."""
    if is_remote(directory):
        check_reachable(directory)
        return epath.Path(directory)
    return epath.Path(Path(directory).absolute())


def path(p: str | os.PathLike) -> Path | epath.Path:
    """`p` as a path object: a local path as pathlib.Path (as given: a relative one stays
    relative, so messages show what the user typed), a URL such as gs://b/x as epath.Path (which
    has the same methods: /, open, read_bytes, read_text, write_*, is_file, is_dir, exists,
    iterdir, mkdir, name, parent). A gs:// one is made only once GCS answers (check_reachable)."""
    if is_remote(p):
        check_reachable(p)
        return epath.Path(p)
    return Path(p)


def listed_as(name: str) -> str:
    """The file a listed input names, for comparing lists: a local one's absolute path (not its
    realpath: two names linked to one blob, a Hugging Face snapshot, are two files the user
    listed), a gs:// one as it is."""
    return name if is_remote(name) else os.path.abspath(name)


def check_listed_once(files: list[str], where: str) -> None:
    """A file named twice in a list of inputs (two globs that match it, `a,./a`) would be read
    twice, its examples counted double: a ValueError naming it, prefixed by `where` (the key
    or flag and its value, "key='...': ")."""
    seen: dict[str, str] = {}
    for name in files:
        key = listed_as(name)
        if key in seen:
            again = f" (again as {name})" if name != seen[key] else ""
            raise ValueError(f"{where}{seen[key]} is named twice{again}: it would be read twice; "
                             f"list each file once")
        seen[key] = name


def glob(pattern: str) -> list[str]:
    """The sorted paths matching `pattern` (*, ?, [...]), local or gs://.

    Local: glob.glob's result unchanged. An object store: the same syntax and meaning as far as
    an object store allows: only objects (never the zero-byte `folder/` markers that the Cloud
    Console's "Create folder" leaves, nor implied folders), `*` not matching a leading dot (as
    glob.glob), `**` one level like `*` (as glob.glob without recursive=True), and a fresh
    listing each time (gcsfs caches listings, which would hide files another host or process
    wrote since)."""
    if not is_remote(pattern):
        return sorted(glob_lib.glob(pattern))
    check_reachable(pattern)
    import fsspec  # gcsfs for gs:// (a dependency of this package)

    protocol = str(pattern).split("://", 1)[0]
    fs, stripped = fsspec.core.url_to_fs(str(pattern))
    stripped = re.sub(r"\*\*+", "*", stripped)
    fs.invalidate_cache()
    found = fs.glob(stripped, detail=True)
    hidden_ok = os.path.basename(stripped).startswith(".")
    return sorted(f"{protocol}://{name}" for name, info in found.items()
                  if info.get("type") == "file" and not name.endswith("/")
                  and (hidden_ok or not os.path.basename(name).startswith(".")))


def open(p: str | os.PathLike, mode: str = "r", *, encoding: str | None = None,
         errors: str | None = None, newline: str | None = None) -> IO:
    """The file `p` opened as Python's open() opens it (the same modes and text options: e.g.
    encoding="utf-8-sig", newline="" for csv), local or gs://. A local path is Python's own
    open(); a URL is read or written through its binary stream (an object written appears
    whole when the file is closed)."""
    if not is_remote(p):
        return builtins.open(p, mode, encoding=encoding, errors=errors, newline=newline)
    if "b" in mode:
        return path(p).open(mode)
    raw = path(p).open(mode.replace("t", "") + "b")
    try:
        return io.TextIOWrapper(raw, encoding=encoding or "utf-8", errors=errors, newline=newline)
    except BaseException:
        raw.close()
        raise


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copies one file between any two places (local or object store)."""
    if not is_remote(src) and not is_remote(dst):
        shutil.copyfile(src, dst)
    else:
        path(dst).write_bytes(path(src).read_bytes())


def read_json(p: str | os.PathLike, what: str, kind: type = dict) -> dict | list:
    """The JSON object (or, with `kind=list`, array) in file `p`; anything else is a ValueError
    naming the file and ending with `what` (what the file should be, or what to do). A leading
    byte order mark (as Windows editors save UTF-8) is dropped."""
    try:
        value = json.loads(path(p).read_text("utf-8-sig"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: missing; {what}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{p}: not valid JSON ({e}); {what}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{p}: found a JSON {type(value).__name__}, expected "
                         f"{'an array' if kind is list else 'an object'}; {what}")
    return value


_REQUIRED = object()
_JSON_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "an object"}


def json_field(obj: dict, key: str, kind: type, file: str | os.PathLike, what: str, *,
               default: object = _REQUIRED, at_least: int | float | None = None) -> object:
    """obj[key] (`default` when absent, if given) of the JSON object read from `file`, checked
    to be of `kind` (bool, int, float: an int too, str, list or dict; a bool is no number, a
    string "false" no bool) and, for numbers, finite and >= `at_least`: anything else is a
    ValueError naming the file, the key, what was found and `what` (what to do). A dotted
    `key` ("sentence.pooling") is a key of nested objects, each named by its whole path
    (a key with a dot in its name cannot be read this way)."""
    names = key.split(".")
    value: object = obj
    for depth, name in enumerate(names, 1):
        last = depth == len(names)
        want, where = kind if last else dict, ".".join(names[:depth])
        if name not in value:
            if default is not _REQUIRED:
                return default
            raise ValueError(f"{file}: no key {where!r} ({_JSON_KINDS[want]}); {what}")
        value = value[name]
        least = at_least if last else None
        ok = isinstance(value, (int, float) if want is float else want) and (
            want is bool or not isinstance(value, bool))
        if ok and want in (int, float):
            ok = math.isfinite(value) and (least is None or value >= least)
        if not ok:
            expected = _JSON_KINDS[want] + ("" if least is None else f" >= {least}")
            raise ValueError(f"{file}: key {where!r} is {json.dumps(value)[:60]}, expected {expected}; "
                             f"{what}")
    return value


@contextlib.contextmanager
def local_copy(src: str | os.PathLike, *, keep=None) -> Iterator[Path]:
    """A local path to read `src` from: `src` itself when local; for a URL, a temporary copy of
    the file or of the folder with everything under it (with `keep`, a predicate on file
    names, only the matching files directly in the folder), deleted on exit. For readers that
    open only local files."""
    if not is_remote(src):
        yield Path(src)
        return
    remote = path(src)
    with tempfile.TemporaryDirectory(prefix="bert_jax_copy_") as tmp:
        local = Path(tmp) / remote.name
        if remote.is_dir():
            import fsspec

            fs, base = fsspec.core.url_to_fs(str(remote))
            fs.invalidate_cache()
            local.mkdir()
            for name, info in sorted(fs.find(base, detail=True).items()):
                rel = name[len(base):].strip("/")
                if (info.get("type") != "file" or name.endswith("/") or not rel
                        or (keep is not None and ("/" in rel or not keep(rel)))):
                    continue  # folder markers; with `keep`, subfolders and other files
                (local / rel).parent.mkdir(parents=True, exist_ok=True)
                copy_file(f"{str(src).split('://', 1)[0]}://{name}", local / rel)
        elif remote.is_file():
            copy_file(remote, local)
        yield local


def user_cache(name: str, environ=os.environ) -> str:
    """This user's cache folder `name` of bert_jax: <$XDG_CACHE_HOME or ~/.cache>/bert_jax/<name>."""
    return os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bert_jax", name)


class CopyFolderUnusable(OSError):
    """A local folder for copies that cannot be made, or whose disk has no room for them."""


def _copied_from(copy: Path) -> Path:
    return copy.with_name(copy.name + ".source")


# Errors of this machine's disk while copies are written (full, over a quota or a file-size
# limit, read-only, not permitted): the copies are given up, not the run (a gs:// error raised
# as an OSError carries no errno).
_LOCAL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def cached_copies(urls: Sequence[str], folder: str | os.PathLike) -> list[Path]:
    """Local copies of the objects `urls` (gs://), kept in `folder` (<folder>/<bucket>/<name>)
    for later commands: each downloaded by gcsfs (every request under the retry policy, its
    deadline included; a few at a time) unless the copy there has the object's size,
    generation and MD5, as recorded beside it (<copy>.source) when it was made. The objects'
    metadata comes from one listing a folder (a few paged requests for thousands of shards),
    not one request a shard. A copy is written into a temporary file and renamed, its record
    after it, so it is whole or absent and never taken for another version. The processes of
    one machine take turns (a lock on `folder`): the first downloads, the others find its
    copies. Each process notes the copies it took (<folder>/.readers/<host>.<pid>) and each
    use touches a copy's record: copies no live process of this machine took are evicted,
    least recently used first, when new ones would make the folder hold more than half the
    room it and its disk's free space make (_make_room). CopyFolderUnusable (nothing left
    half-written, nothing evicted) when `folder` cannot be made or written, its disk fills or
    refuses while copying, or the downloads would take more than half of its disk's free room
    with every evictable copy removed (a run's checkpoints may need the rest)."""
    import fcntl

    planned = _listed(urls, folder)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        lock = os.open(folder, os.O_RDONLY)
    except OSError as e:
        raise CopyFolderUnusable(f"cannot make {folder} ({e.strerror or e})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process of this machine may be copying them
        _note_reader(folder, [copy for _, _, copy, _ in planned])
        fresh = {copy for _, _, copy, source in planned if _copy_fresh(copy, source)}
        _used_now(fresh)
        missing = list({p[2]: p for p in planned if p[2] not in fresh}.values())  # each copy once
        if missing:
            _make_room(folder, sum(int(source["size"]) for *_, source in missing),
                       {copy for _, _, copy, _ in planned}, {copy for _, _, copy, _ in missing})
        _download_all(missing, folder)
    finally:
        os.close(lock)  # (and its lock)
    return [copy for _, _, copy, _ in planned]


def _listed(urls: Sequence[str], folder: str | os.PathLike) -> list[tuple]:
    """(file system, object name, copy's path in `folder`, {size, generation, md5Hash})
    for each gs:// url, the metadata from listings of each folder narrowed to the names'
    prefixes (_listing_prefixes; gcsfs's cached listings bypassed, its requests under the retry
    policy). An object name no copy can have, or no such object, is one line naming the url."""
    import fsspec

    wanted: dict[str, tuple] = {}  # folder -> (its file system, its names wanted)
    named = []
    for url in urls:
        check_reachable(url)
        fs, name = fsspec.core.url_to_fs(str(url))
        if "/" not in name.strip("/"):
            raise ValueError(f"{url}: names a bucket, not an object; give the shard's gs:// path")
        if any(part in ("", ".", "..") for part in name.split("/")):
            raise ValueError(f"{url}: an object name with an empty, '.' or '..' part has no local "
                             "copy; rename the object")
        parent, _, base = name.rpartition("/")
        wanted.setdefault(f"{fs.protocol}|{parent}", (fs, parent, set()))[2].add(base)
        named.append((url, fs, name))
    listed: dict[str, dict] = {}
    for fs, parent, bases in wanted.values():
        for prefix in _listing_prefixes(bases):
            try:
                found = fs.ls(parent, detail=True, refresh=True, prefix=prefix)
            except FileNotFoundError:
                found = []  # (nothing there: each url is named below)
            listed.update((info["name"], info) for info in found if info.get("type") == "file")
    planned = []
    for url, fs, name in named:
        if name not in listed:
            raise FileNotFoundError(f"{url}: no such object; check the path")
        info = listed[name]
        planned.append((fs, name, Path(folder) / name,
                        {key: info.get(key) for key in ("size", "generation", "md5Hash")}))
    return planned


def _listing_prefixes(names: set[str]) -> list[str]:
    """The prefixes whose listings hold `names` (the object names in one folder) and little
    else: the names grouped by their first character, each group's longest common prefix
    (`train-00001`, `train-00002` and `valid-00001`: `train-0000` and `valid-00001`), so that
    names sharing no prefix do not list the whole folder; at most one listing per character."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(name[:1], []).append(name)
    return [os.path.commonprefix(group) for group in groups.values()]


def _download(fs, name: str, copy: Path, source: dict, folder) -> None:
    """gs://`name` into `copy` through a temporary file, its record (`source`) after it; a
    local disk error is CopyFolderUnusable with nothing of this copy left."""
    part = copy.with_name(f".{copy.name}.{socket.gethostname()}.{os.getpid()}.part")
    unrecorded = False  # the copy there, if any, has lost its record: removed if this fails
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        # Parts this machine left: downloads killed before their end (the lock is ours now).
        for stale in copy.parent.glob(f".{copy.name}.{socket.gethostname()}.*.part"):
            stale.unlink(missing_ok=True)
        _copied_from(copy).unlink(missing_ok=True)  # the record goes first, comes back last
        unrecorded = True
        # One request (under the policy): gcsfs's chunked download of a large object would ask
        # for its metadata first, a request a shard that the folder's listing spared.
        fs.get_file(name, str(part), **({"concurrency": 1} if hasattr(fs, "_get_file_concurrent") else {}))
        if part.stat().st_size != int(source["size"]) or not _md5_is(part, source["md5Hash"]):
            raise OSError(f"gs://{name}: the bytes downloaded are not those GCS listed for it "
                          f"({part.stat().st_size} bytes, {source['size']} listed; or another "
                          f"MD5): it was rewritten while it was copied; rerun")
        os.replace(part, copy)
        part.with_suffix(".source").write_text(json.dumps(source))
        os.replace(part.with_suffix(".source"), _copied_from(copy))
        unrecorded = False
    except OSError as e:
        if e.errno not in _LOCAL_DISK_ERRNOS:
            raise
        raise CopyFolderUnusable(f"cannot write copies in {folder} ({e.strerror or e})") from None
    finally:
        part.unlink(missing_ok=True)
        if unrecorded:  # an old copy no record vouches for (never read, never evicted): gone
            with contextlib.suppress(OSError):
                copy.unlink(missing_ok=True)
        part.with_suffix(".source").unlink(missing_ok=True)


def _md5_is(path: Path, md5: str | None) -> bool:
    """Whether the file's MD5 is `md5` (GCS's base64 of the digest); True when GCS gave none
    (a composite object has only a CRC32C)."""
    if not md5:
        return True
    import base64
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return base64.b64encode(digest.digest()).decode("ascii") == md5


def _size(n: int) -> str:
    """A byte count for people: 512 bytes, 3.2 KiB, 1.5 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _copy_fresh(copy: Path, source: dict) -> bool:
    """Whether `copy` is the object `source` describes (its record says so, its size agrees)."""
    try:
        return (json.loads(_copied_from(copy).read_text()) == source
                and copy.stat().st_size == int(source["size"]))
    except (OSError, ValueError):
        return False


# The copies each process took from a folder (<folder>/.readers/<host>.<pid>, a line each,
# relative to the folder): a copy is read after cached_copies returns, by readers that hold no
# lock, so eviction keeps every copy a live process took. Each process keeps its list open
# with a shared flock for as long as it lives (its forked children inherit it; they read the
# copies too): the kernel drops the lock however the process ends (kill -9 too), also for a
# process in another container of this host sharing the folder, so a list of this host whose
# lock can be taken exclusively is a gone process's. Another host's lists are kept (their
# copies too): its locks may not reach this machine. (Bucket names start with a letter or
# digit: no bucket's copies are in there.)
READERS = ".readers"


_LISTS: dict[str, tuple[int, set[str]]] = {}  # this process's list in a folder -> (its fd, names)


def _note_reader(folder, copies: Sequence[Path]) -> None:
    """Adds `copies` to this process's list of copies taken from `folder` (opened and locked
    the first time, again if it was removed). A read-only folder: nothing is evicted from it.
    Any other failure (a full disk) is CopyFolderUnusable: this process does not read copies
    it could not keep from being evicted."""
    import fcntl

    record = Path(folder) / READERS / f"{socket.gethostname()}.{os.getpid()}"
    try:
        fd, noted = _LISTS.get(str(record), (None, set()))
        if fd is None or not _same_file(fd, record):
            if fd is not None:
                os.close(fd)
            record.parent.mkdir(exist_ok=True)
            fd, noted = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), set()
            _LISTS[str(record)] = (fd, noted)
            fcntl.flock(fd, fcntl.LOCK_SH)
        new = sorted({c.relative_to(folder).as_posix() for c in copies} - noted)
        if new:  # (a newline first: a line a failed write cut short is never glued to a name)
            _append(fd, "".join(f"\n{name}" for name in new).encode() + b"\n")
            noted.update(new)
    except OSError as e:
        if e.errno == errno.EROFS:
            return
        raise CopyFolderUnusable(f"cannot note this process's copies in {record} "
                                 f"({e.strerror or e})") from None


def _append(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _used_now(copies) -> None:
    """Marks `copies` used now (their records' mtime: eviction removes the least recently used)."""
    for copy in copies:
        with contextlib.suppress(OSError):  # a read-only folder: nothing is evicted from it
            os.utime(_copied_from(copy))


def _in_use(folder) -> set[str] | None:
    """The copies (relative to `folder`) that live processes took: those of lists whose lock
    is held, and of every list another host wrote (a folder shared between machines may have
    locks that only hold on each machine, as NFS mounted with local locks: a free lock there
    proves nothing); the lists of this host's gone processes are removed. None when a list
    cannot be read (nothing is then known to be free)."""
    used: set[str] = set()
    here = socket.gethostname()
    for record in sorted((Path(folder) / READERS).glob("*")):
        try:
            if record.name.rpartition(".")[0] == here and _lock_free(record):
                with contextlib.suppress(OSError):  # (another user's: kept, and nothing is lost)
                    record.unlink()
                continue
            used.update(filter(None, record.read_text().splitlines()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return None
    return used


def _lock_free(record: Path) -> bool:
    """Whether no process holds a lock on `record` (its process is gone)."""
    import fcntl

    fd = os.open(record, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _kept_copies(folder) -> list[tuple[float, int, Path]]:
    """(last use, size, path) of each copy in `folder` (<bucket>/<name> with its record beside
    it: a file this module did not make is never taken for one); last use: its record's mtime."""
    copies = []
    for root, _, files in os.walk(folder):
        if Path(root) == Path(folder):
            continue  # copies are in bucket folders (the readers' lists are in .readers)
        for name in files:
            copy = Path(root) / name
            if name.startswith(".") or name.endswith(".source"):
                continue  # parts being written, records
            with contextlib.suppress(OSError, ValueError, TypeError):  # no record, or not ours
                record = _copied_from(copy)
                if "generation" in json.loads(record.read_text()):
                    copies.append((record.stat().st_mtime, copy.stat().st_size, copy))
    return copies


def _make_room(folder, need: int, needed: set[Path], replaced: set[Path]) -> None:
    """Room for `need` bytes of new copies in `folder` (replacing the copies `replaced`, if
    there): they may take at most half its disk's free room, counting the room of copies
    evicted first (else CopyFolderUnusable, nothing evicted). The folder's copies may hold at
    most half the room they and the free space make together: past it, copies not in
    `needed` that no live process took are removed, least recently used first (record
    first, so a copy half-removed is no copy)."""
    free = shutil.disk_usage(folder).free
    copies = _kept_copies(folder)
    in_use = _in_use(folder)
    evictable = sorted((c for c in copies if in_use is not None and c[2] not in needed
                        and c[2].relative_to(folder).as_posix() not in in_use), key=lambda c: c[:2])
    spare = sum(size for _, size, _ in evictable)
    if 2 * need > free + spare:  # at most half: checkpoints, logs and caches may share the disk
        also = f" and {_size(spare)} in copies no process uses now" if spare else ""
        raise CopyFolderUnusable(f"{folder} has {_size(free)} free{also}, the copies need "
                                 f"{_size(need)} (and may take at most half of {'both' if spare else 'it'})")
    budget = (free + sum(size for _, size, _ in copies)) / 2
    held = sum(size for _, size, copy in copies if copy not in replaced)
    for _, size, copy in evictable:
        if held + need <= budget:
            break
        try:
            _copied_from(copy).unlink(missing_ok=True)
            copy.unlink(missing_ok=True)
        except OSError:
            continue  # not removable here (another user's): kept, and counted
        held -= size


_DOWNLOADS_AT_ONCE = 4  # a few at once: each shard is one request (_download)


def _download_all(missing: list[tuple], folder) -> None:
    """_download for each of `missing`, a few at a time; the first error (in their order) is
    raised once every download begun has ended (each leaves its copy whole or nothing)."""
    if len(missing) < 2:
        for p in missing:
            _download(*p, folder)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(_DOWNLOADS_AT_ONCE, thread_name_prefix="bert_jax_copy") as pool:
        started = [pool.submit(_download, *p, folder) for p in missing]
        try:
            for future in started:
                future.result()
        except BaseException:
            for future in started:
                future.cancel()  # those not begun; the pool's end waits for the others
            raise


@contextlib.contextmanager
def staged_output(out: str | os.PathLike) -> Iterator[Path]:
    """A local folder to write `out`'s files into: `out` itself when local; for a URL, a
    temporary folder whose files are uploaded to `out` when the block ends without error."""
    if not is_remote(out):
        yield Path(out)
        return
    check_reachable(out)  # before the block's work, not at its upload
    with tempfile.TemporaryDirectory(prefix="bert_jax_out_") as tmp:
        yield Path(tmp)
        for f in sorted(Path(tmp).rglob("*")):
            if f.is_file():
                dst = path(out) / f.relative_to(tmp).as_posix()
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(f.read_bytes())


LOCK_NAME = "run.lock"


class WorkdirBusy(FileExistsError):
    """Another live run holds the workdir's lock."""


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped (its parent was killed too, and a container's
    PID 1 may never reap it) still answers kill(pid, 0): Linux marks it Z in /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _gone(pid) -> bool:
    """Whether process `pid` of this machine is known to be gone (no such process, or a zombie);
    not a pid, or another user's process: False."""
    try:
        pid = int(pid)
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError, OverflowError):
        return False
    return _zombie(pid)


class WorkdirLock:
    """`<workdir>/run.lock` while a training run writes there, so a second run stops at once
    naming the first instead of racing it for checkpoints and metrics. Creating it is also
    the first write: an unwritable or full workdir fails here, in one line. A lock left by a
    run that died (same host, process gone) is taken over."""

    def __init__(self, workdir: str | os.PathLike, enabled: bool = True):
        self.path = workdir_path(workdir) / LOCK_NAME
        self.enabled, self.held = enabled, False
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}

    def __enter__(self) -> WorkdirLock:
        if not self.enabled:  # other processes of a multi-host run: process 0 holds it
            return self
        if self.path.exists():
            holder = self._holder()
            if not self._dead(holder):
                raise WorkdirBusy(
                    f"{self.path.parent} is in use by another run (pid {holder.get('pid')} on "
                    f"{holder.get('host')} since {holder.get('since')}); wait for it or use another "
                    f"--workdir. If that run is gone, delete {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({**self.me, "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        except StorageFailing:
            raise  # its own line says what to do (not permissions and space)
        except OSError as e:
            raise OSError(f"cannot write to the workdir {self.path.parent} ({e.strerror or e}); "
                          f"check its permissions and free space") from None
        self.held = True
        return self

    def _holder(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # unreadable or half-written: its writer died mid-write

    def _dead(self, holder: dict) -> bool:
        """Whether the holder is known to be gone: same host, and its process does not exist."""
        if not holder:
            return True
        if holder.get("host") != self.me["host"]:
            return False
        if holder.get("pid") == self.me["pid"]:
            return True  # this process, e.g. a second run in-process after a crash
        return _gone(holder.get("pid"))

    def __exit__(self, *exc) -> None:
        if self.held and self._holder().get("pid") == self.me["pid"]:
            self.path.unlink(missing_ok=True)
        self.held = False


# Object stores without a network. gcsfs retries each request 6 times over ~30 s (each try may
# wait minutes for a connection where packets are dropped, where a closed port refuses at
# once), logs a traceback per request, and then answers "no such file": a command would blame
# the workdir. One connection, bounded in time, says what is wrong before any of that; the
# libraries' own retries (gcsfs, tensorstore) then serve the transient errors of a reachable
# store (503s, slow answers).
CONNECT_DEADLINE_S = 10.0
_REACHED: set[tuple[str, int]] = set()
_UNREACHED: dict[tuple[str, int], str] = {}  # endpoint -> its message, {path} to fill


def _gcs_endpoint() -> str:
    """The GCS endpoint gcsfs uses: an emulator's ($STORAGE_EMULATOR_HOST), a configured one
    ($FSSPEC_GS_ENDPOINT_URL), or Google's."""
    url = os.environ.get("FSSPEC_GS_ENDPOINT_URL") or os.environ.get("STORAGE_EMULATOR_HOST", "")
    if url in ("", "default"):
        return f"https://storage.{os.environ.get('GOOGLE_CLOUD_UNIVERSE_DOMAIN', 'googleapis.com')}"
    return url if "://" in url else f"http://{url}"


def check_reachable(path: str | os.PathLike, timeout: float = CONNECT_DEADLINE_S) -> None:
    """For a gs:// path: Google Cloud Storage accepts a connection within `timeout` seconds
    (name lookup included), else a ConnectionError in one line naming GCS and the network.
    Other paths: nothing. Checked once per process and endpoint."""
    if not str(path).startswith("gs://"):
        return
    _use_retry_policy()
    import threading

    url = urlparse(_gcs_endpoint())
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    if (host, port) in _REACHED:
        return
    if (host, port) in _UNREACHED:  # said once already (a caller may have caught it): at once
        raise ConnectionError(_UNREACHED[(host, port)].replace("{path}", str(path)))
    failure: list[OSError] = []

    def connect():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as e:
            failure.append(e)

    thread = threading.Thread(target=connect, daemon=True)  # the name lookup has no timeout
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        failure.append(TimeoutError(f"no answer in {timeout:g} s"))
    if failure:
        e = failure[0]
        reason = (f"cannot look up {host}: {e.strerror or e}" if isinstance(e, socket.gaierror)
                  else e.strerror or str(e) or type(e).__name__)
        _UNREACHED[(host, port)] = (f"cannot reach Google Cloud Storage ({host}:{port}) for {{path}}: "
                                    f"{reason}; check this machine's network (and any firewall or "
                                    "proxy), then rerun")
        raise ConnectionError(_UNREACHED[(host, port)].replace("{path}", str(path)))
    _REACHED.add((host, port))


# Object stores that answer but keep failing (503 or 429 for minutes, a request that stalls):
# each library has its own retries (gcsfs: 6 tries over ~35 s, no time limit per try;
# tensorstore, Orbax's array writer: 32 tries over ~15 minutes), so how long a command waits
# depended on which library made the request. One policy for both, declared here.
RETRY_ENV = "BERT_JAX_GCS_RETRY"  # e.g. "tries=10,max_wait_s=32" (docs/training.md)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How every gs:// request is retried: up to `tries` tries, waiting `first_wait_s` before
    the second and twice as long before each next one (at most `max_wait_s`); a try in which
    no byte moves for `stall_s` seconds failed (tensorstore reads it once, at the process's
    first gs:// path). Retried: what GCS documents as transient
    (408, 429, 500-504, timeouts, dropped connections); anything else fails at once."""

    tries: int = 6  # gcsfs's own count
    first_wait_s: float = 1.0
    max_wait_s: float = 16.0
    stall_s: float = 30.0

    def waits(self) -> list[float]:
        """The waits between the tries."""
        return [min(self.first_wait_s * 2 ** i, self.max_wait_s) for i in range(self.tries - 1)]

    @property
    def deadline_s(self) -> float:
        """The longest one operation is retried: every wait, and every try stalled."""
        return sum(self.waits()) + self.tries * self.stall_s


def retry_policy() -> RetryPolicy:
    """The policy: RetryPolicy's defaults, or those of $BERT_JAX_GCS_RETRY ("field=value,...";
    a field unknown or out of range is a ValueError naming it)."""
    given = os.environ.get(RETRY_ENV, "").strip()
    fields = {f.name: f.type for f in dataclasses.fields(RetryPolicy)}
    values: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in given.split(","))):
        key, _, value = item.partition("=")
        key = key.strip()
        try:
            number = (int if fields[key] == "int" else float)(value)
        except (KeyError, ValueError):
            number = None
        if (number is None or not math.isfinite(number)
                or number < (1 if key in ("tries", "stall_s") else 0)):
            raise ValueError(f"${RETRY_ENV}={given}: {item!r} is not one of "
                             f"{', '.join(f'{k}=<number>' for k in fields)} (tries and stall_s "
                             ">= 1, the waits >= 0)")
        values[key] = number
    return RetryPolicy(**values)


def tensorstore_retries(policy: RetryPolicy) -> dict:
    """The policy as tensorstore's `gcs_request_retries` context resource (max_retries counts
    the tries after the first; tensorstore's own waits double from initial_delay too)."""
    return {"max_retries": policy.tries - 1, "initial_delay": f"{policy.first_wait_s}s",
            "max_delay": f"{policy.max_wait_s}s"}


class StorageFailing(ConnectionError):
    """A gs:// operation whose every try failed (the policy spent): one line for the user."""


def storage_failing(operation: str, where: str, tries: int, seconds: float | None,
                    last: str) -> StorageFailing:
    """The one line: what failed, how long it was retried (`seconds`, if known), what to do."""
    spent = f"{tries} {'try' if tries == 1 else 'tries'}" + (
        "" if seconds is None else f" over {seconds:.0f} s")
    return StorageFailing(
        f"Google Cloud Storage kept failing: {operation} {where} failed {spent} (last: {last}); "
        f"check GCS's status (status.cloud.google.com) and the bucket's permissions and quota, "
        f"then rerun (a training run resumes from its last complete checkpoint; ${RETRY_ENV} retries longer)")


def tensorstore_gave_up(error: BaseException, where: str, operation: str) -> StorageFailing | None:
    """tensorstore's "All N retry attempts failed" (its retries spent) as the one line; None for
    any other error."""
    spent = re.search(r"All (\d+) retry attempts failed: ?([^\[\n]*)(?:.*http_response_code='(\d+)')?",
                      str(error))
    if not spent:
        return None
    last = " ".join(filter(None, [spent[3] and f"HTTP {spent[3]}", spent[2].strip()])) or "an error"
    return storage_failing(operation, where, int(spent[1]) + 1, None, last)


_OPERATIONS = {"GET": "reading", "HEAD": "reading", "POST": "writing", "PUT": "writing",
               "PATCH": "updating", "DELETE": "deleting"}


def _described(method: str, url: str, params: dict) -> tuple[str, str]:
    """(the operation, the gs:// path) of a GCS JSON API request, as far as its URL says."""
    parsed = urlparse(url)
    query = {k: v[0] for k, v in parse_qs(parsed.query).items()} | {
        k: str(v) for k, v in params.items()}
    match = re.search(r"/b/([^/]+)(?:/o(?:/([^/?]+))?)?", parsed.path)
    if not match:
        return _OPERATIONS.get(method.upper(), method), url
    bucket, name = unquote(match[1]), unquote(match[2] or "") or query.get("name", "")
    if not name and method.upper() == "GET" and match[0].endswith("/o"):
        return "listing", f"gs://{bucket}/{query.get('prefix', '')}"
    return _OPERATIONS.get(method.upper(), method), f"gs://{bucket}/{name}".rstrip("/")


def _transient(error: BaseException) -> bool:
    """gcsfs's own judgement (408, 429, 5xx, connection and timeout errors), and a stalled try."""
    from gcsfs.retry import is_retriable

    return is_retriable(error) or isinstance(error, TimeoutError)


def _request_described(fs, method, path, *args, **kwargs) -> tuple[str, str]:
    """(the operation, the gs:// path) of gcsfs's _request(method, path, *args, **kwargs)."""
    return _described(method, fs._format_path(path, args), {
        k: v for k, v in kwargs.items() if k in ("name", "prefix") and v is not None})


def _download_described(fs, rpath, *args, **kwargs) -> tuple[str, str]:
    """(the operation, the gs:// path) of gcsfs's _get_file_request(rpath, lpath, ...)."""
    return "reading", "gs://" + fs._strip_protocol(rpath)


def _retrying(request, described=_request_described):
    """One of gcsfs's raw request methods (without its own retries) under the policy; the
    one line names what `described` makes of its arguments."""
    import asyncio

    async def _request(self, *args, **kwargs):
        policy, start = retry_policy(), time.monotonic()
        for attempt in range(policy.tries):
            if attempt:
                await asyncio.sleep(policy.waits()[attempt - 1])
            try:
                return await request(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 (judged by _transient)
                if not _transient(e):
                    raise
                last = e
        operation, where = described(self, *args, **kwargs)
        reason = (str(last).splitlines() or [""])[0].strip() or type(last).__name__
        raise storage_failing(operation, where, policy.tries, time.monotonic() - start,
                              reason[:200]) from None

    return _request


def _without_gcsfs_retries(cls: type, name: str):
    """gcsfs's method `name` without its retry decorator (the `__wrapped__` the decorator
    keeps), for the policy to retry alone. A gcsfs whose method keeps no `__wrapped__`: the
    method itself (the policy still bounds the tries around it; any retries of gcsfs's own
    then run inside each); one without the method: None (not overridden)."""
    method = getattr(cls, name, None)
    if method is None:
        return None
    return getattr(method, "__wrapped__", method)


_POLICY_FS: dict[type, type] = {}


def _use_retry_policy() -> None:
    """gcsfs's file system for gs:// (the one fsspec and etils epath make) replaced, once, by a
    subclass whose requests follow the policy (gcsfs retries each request 6 times by a
    decorator fixed when its class is defined); and a stalled tensorstore request fails after
    stall_s (its curl transport's low-speed limit, read from the environment)."""
    import fsspec

    policy = retry_policy()  # a bad $BERT_JAX_GCS_RETRY: at the first gs:// path, not mid-run
    base = fsspec.get_filesystem_class("gs")
    if base in _POLICY_FS.values():
        return
    from gcsfs.core import GCSFileSystem

    # fs.get: a file's download is one request (gcsfs retries it 6 times more, by its own
    # decorator); a large file's concurrent download is made of _info's and _cat_file's
    # requests, each under the policy already, so it is not retried whole as well.
    overrides = {}
    for name, described in (("_request", _request_described), ("_get_file_request", _download_described),
                            ("_get_file_concurrent", None)):
        method = _without_gcsfs_retries(GCSFileSystem, name)
        if method is not None:
            overrides[name] = method if described is None else _retrying(method, described)
    # gcsfs's requests under the policy, right above GCSFileSystem in the order of classes:
    # a subclass's own versions (ExtendedGcsFileSystem's downloads from zonal buckets) run
    # and hand standard buckets' to these.
    PolicyRequests = type("PolicyRequests", (GCSFileSystem,), overrides)

    class PolicyGCSFileSystem(*((PolicyRequests,) if base is GCSFileSystem else (base, PolicyRequests))):
        def __init__(self, *args, requests_timeout=None, **kwargs):
            import aiohttp

            stall = retry_policy().stall_s
            super().__init__(*args, requests_timeout=requests_timeout or aiohttp.ClientTimeout(
                total=None, sock_connect=stall, sock_read=stall), **kwargs)

    PolicyGCSFileSystem.__name__ = PolicyGCSFileSystem.__qualname__ = f"Policy{base.__name__}"
    _POLICY_FS[base] = PolicyGCSFileSystem
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, PolicyGCSFileSystem, clobber=True)
    stall = str(max(1, round(policy.stall_s)))
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", stall)
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")
