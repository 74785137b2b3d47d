"""JAX's persistent cache of compiled programs for a command (--compilation_cache): where it
lives, so that a restart loads its programs instead of compiling them again, and what happens
when it cannot be used, before the run or while it runs."""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
import warnings

# The cache of local runs: one per user, shared by every run, eval and translation of the
# machine (entries are keyed by the program, the JAX version, devices and flags).
LOCAL_COMPILATION_CACHE_BYTES = 8 * 2**30  # least recently used entries go beyond this
# The probe written before the run: about the size of a small model's larger entries (the
# tests' tiny models on CPU: up to 0.7 MiB compressed), so that a disk or quota too full to
# hold a program is found before the run rather than at the first program.
PROBE_BYTES = 2**20
# A temporary entry file (.entry-*.tmp) older than this was left by a process killed while it
# wrote the entry: swept when a process opens the cache. An entry is written in well under a
# second, so another live process's file in flight is never this old.
STALE_PART_SECONDS = 3600
PART_PREFIX, PART_SUFFIX = ".entry-", ".tmp"  # a temporary entry file's name (not *-cache)


def compilation_cache_dir(setting: str, command: str, workdir: str | None,
                          environ=os.environ) -> str | None:
    """Where JAX keeps compiled programs for `command` (None: nowhere) from --compilation_cache.
    auto: a JAX_COMPILATION_CACHE_DIR the user set; for train and eval with a gs:// workdir,
    <workdir>/compilation_cache (a pod's restart gets fresh VMs: their local disks are gone,
    the bucket is not, and every worker shares it); else <$XDG_CACHE_HOME or
    ~/.cache>/bert_jax/jit (paths.user_cache), shared by the machine's runs (reruns, sweep
    trials, eval and translate of one model), kept out of workdirs so they stay small to copy."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting if "://" in setting else os.path.abspath(os.path.expanduser(setting))
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    if command in ("train", "eval") and workdir and workdir.startswith("gs://"):
        return workdir.rstrip("/") + "/compilation_cache"
    from bert_jax import paths

    return paths.user_cache("jit", environ)


def unusable(path: str) -> str | None:
    """Why the cache folder `path` (local or gs://) cannot be used, or None: its storage
    answers (paths.check_reachable's deadline), the folder can be made, and a probe file of
    PROBE_BYTES in it written and deleted, as JAX will write its entries."""
    from bert_jax import paths

    probe = None
    try:
        folder = paths.path(path)
        folder.mkdir(parents=True, exist_ok=True)
        # hosts sharing a gs:// cache may have equal pids (containers): a name of its own
        probe = folder / f".write-check.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}"
        probe.write_bytes(bytes(PROBE_BYTES))
        probe.unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 (OS errors: no network, permission, a file in the way,
        # a full disk; and gcsfs's own for a bucket that refuses)
        if probe is not None and not paths.is_remote(path):  # a partial file (an object is
            with contextlib.suppress(OSError):  # written whole or not at all)
                probe.unlink(missing_ok=True)
        return getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return None


def setup_compilation_cache(setting: str, command: str, workdir: str | None,
                            required: bool = False) -> None:
    """Points JAX's persistent compilation cache at compilation_cache_dir (before anything
    compiles: JAX opens the cache at its first compile). What the user set through JAX's own
    environment variables (JAX_ENABLE_COMPILATION_CACHE, JAX_COMPILATION_CACHE_DIR,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS...) stands unless --compilation_cache says
    otherwise; programs compiled in under a second (JAX's threshold) are not stored.

    A cache that cannot be used (`unusable`) is refused before the command starts when
    `required` (--compilation_cache_required), else turned off with one warning line saying
    why: JAX would otherwise go on uncached behind a storage library's errors, and retry an
    unreachable gs:// cache at every program."""
    import jax

    path = compilation_cache_dir(setting, command, workdir)
    _watch(None, required)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    users_own = setting == "auto" and (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                                       or not jax.config.jax_enable_compilation_cache)
    if users_own and not jax.config.jax_enable_compilation_cache:
        return  # turned off by the user's own JAX settings
    in_workdir = bool(workdir) and path.startswith(workdir.rstrip("/") + "/")
    if in_workdir:  # the workdir's own storage: without a network, the workdir's one line
        from bert_jax import paths

        paths.check_reachable(workdir)
    if (reason := unusable(path)) is not None:
        said = f"the compilation cache {path} cannot be used ({reason})"
        if required or in_workdir:  # the workdir's own storage: the run could not go on either
            raise OSError(f"{said}; fix it, or choose another with --compilation_cache=<dir> (or "
                          "off)" + ("" if in_workdir else ", or run without it: drop "
                                    "--compilation_cache_required"))
        logging.getLogger(__name__).warning(f"warning: {said}; running without it (every program compiles; "
                    "--compilation_cache_required refuses instead)")
        jax.config.update("jax_enable_compilation_cache", False)
        return
    _watch(path, required)
    if users_own:
        return  # the user's own JAX settings
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    if (setting == "auto" and "://" not in path
            and "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ):
        jax.config.update("jax_compilation_cache_max_size", LOCAL_COMPILATION_CACHE_BYTES)


# A cache that passed the probe can fail later (the disk fills, a bucket's permission or quota
# changes, GCS keeps failing past the retry policy): JAX then warns at each program and goes on,
# paying the storage's retries at every program. The cache in use while a command runs, and
# whether the user required it; None when none is.
_IN_USE: list[tuple[str, bool] | None] = [None]
_TURNING_OFF = threading.Lock()
# jax_raise_persistent_cache_errors as it was before a required cache stopped the command
# (set for JAX to let that error through; put back by the next _watch)
_RAISE_BEFORE: list[bool] = []
_WRITE = "Error writing persistent compilation cache entry for "
_READ = "Error reading persistent compilation cache entry for "


def _watch(path: str | None, required: bool) -> None:
    """From now on a failed write of an entry of the cache `path` (or a failed read, for a
    storage error) stops the cache at once (`_failed`); None: no cache watched. Seen at the
    cache object itself: each cache JAX opens has its get and put wrapped (`_watch_jax_caches`),
    so warnings filtered to "ignore" or a showwarning hook that does not chain change nothing.
    A JAX without that opening point: seen through JAX's warning of the failure instead (a hook
    on warnings.showwarning, put back on top at each call: a test framework restores
    showwarning after each test)."""
    _IN_USE[0] = (path, required) if path else None
    if _RAISE_BEFORE:
        import jax

        jax.config.update("jax_raise_persistent_cache_errors", _RAISE_BEFORE.pop())
    if path is None or _watch_jax_caches() or getattr(warnings.showwarning, "watches_the_cache", False):
        return
    previous = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not _failed_warning(str(message)):
            previous(message, category, filename, lineno, file, line)

    showwarning.watches_the_cache = True
    warnings.showwarning = showwarning


def _watch_jax_caches() -> bool:
    """Wraps the get and put of the cache JAX has open, if any, and of every cache it opens
    from now on (JAX makes each one by its get_file_cache, again after each reset), so that a
    storage error reaches `_failed` before JAX turns it into a warning; False where this JAX
    has no get_file_cache (nothing done)."""
    try:
        from jax._src import compilation_cache as jax_internal
    except ImportError:
        return False
    make = getattr(jax_internal, "get_file_cache", None)
    if make is None:
        return False
    if getattr(jax_internal, "_cache", None) is not None:  # opened before the watch
        _wrap(jax_internal._cache)
    if getattr(make, "watches_the_cache", False):
        return True

    def get_file_cache(path):
        made = make(path)
        if isinstance(made, tuple) and made:  # (the cache, its path)
            _wrap(made[0])
        return made

    get_file_cache.watches_the_cache, get_file_cache.__wrapped__ = True, make
    jax_internal.get_file_cache = get_file_cache
    return True


def _wrap(cache) -> None:
    """The cache object's get and put (a verifying cache: those of the cache it wraps), failing
    on a storage error, handed to `_failed` first; once."""
    cache = getattr(cache, "_base_cache", cache)
    if getattr(cache, "watched_by_bert_jax", False):
        return
    cache.watched_by_bert_jax = True
    get, put = cache.get, _whole_entries_put(cache) or cache.put

    # A lock not had in time (JAX's LRU cache: filelock.Timeout, an OSError too) is other
    # processes using the cache, not its storage failing: JAX warns and compiles, as before.
    def watched_get(key):
        try:
            return get(key)
        except Exception as e:
            if (isinstance(e, TimeoutError)
                    or not any(_storage_error(c.__name__) for c in type(e).__mro__)
                    or not _failed("reading", f"{type(e).__name__}: {e}")):
                raise
            return None  # turned off: a miss, the program compiles

    def watched_put(key, value):
        try:
            return put(key, value)
        except Exception as e:
            if isinstance(e, TimeoutError) or not _failed("writing", f"{type(e).__name__}: {e}"):
                raise
            return None

    cache.get, cache.put = watched_get, watched_put


def _whole_entries_put(cache):
    """For JAX's LRU cache in a local folder: its put, writing each entry to a temporary file of
    the folder moved into place (os.replace), so that no reader (another process sharing the
    folder: JAX reads without a lock when eviction is off) sees a part of an entry, and a write
    that fails or is interrupted leaves no entry. JAX's own writes the entry in place. As
    JAX's: an entry already there is kept; with eviction on, under the folder's lock, the
    least recently used entries evicted first and the entry's access time written (before the
    entry: evicting reads the access time of every entry). A process killed mid-write leaves
    its .entry-*.tmp, which nothing reads and the next process to open the cache removes once
    it is STALE_PART_SECONDS old (sweep_stale_parts). None for any other cache (a gs:// object
    is written whole or not at all)."""
    try:
        from jax._src.lru_cache import LRUCache
    except ImportError:
        return None
    if type(cache) is not LRUCache or "://" in str(cache.path):
        return None
    sweep_stale_parts(str(cache.path))
    jax_put = cache.put

    def put(key: str, value: bytes) -> None:
        if not key or (cache.eviction_enabled and len(value) > cache.max_size):
            return jax_put(key, value)  # JAX's refusal, nothing written
        folder = str(cache.path)
        entry, atime = (os.path.join(folder, f"{key}-{kind}") for kind in ("cache", "atime"))
        if cache.eviction_enabled:
            cache.lock.acquire(timeout=cache.lock_timeout_secs)
        part = None
        try:
            if os.path.exists(entry):
                return None
            cache._evict_if_needed(additional_size=len(value))
            if cache.eviction_enabled:
                with open(atime, "wb") as f:
                    f.write(time.time_ns().to_bytes(8, "little"))
            part = os.path.join(folder, f"{PART_PREFIX}{uuid.uuid4().hex}{PART_SUFFIX}")
            with open(part, "xb") as f:
                f.write(value)
            os.replace(part, entry)
            part = None
        except BaseException:
            for left in ([part] if part else []) + ([atime] if cache.eviction_enabled else []):
                with contextlib.suppress(OSError):
                    os.unlink(left)
            raise
        finally:
            if cache.eviction_enabled:
                cache.lock.release()
        return None

    return put


def sweep_stale_parts(folder: str, now: float | None = None) -> list[str]:
    """Removes the temporary entry files (.entry-*.tmp) of the cache `folder` last modified
    more than STALE_PART_SECONDS before `now` (default: the current time), those of processes
    killed while writing; younger ones may be another process's write in flight and stay.
    Returns the names removed. A file that another process removes first, or that cannot be
    removed, is left to it: sweeping never fails the command."""
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.stat(path).st_mtime > STALE_PART_SECONDS:
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue
    return removed


def _storage_error(name: str) -> bool:
    """Whether the exception class `name` (as JAX's warning names it) is the storage failing (an
    OS error, gcsfs's HTTP error, the retry policy spent), not a damaged entry (a decompression
    or deserialisation error: JAX compiles that program again and the cache stays)."""
    builtin = getattr(builtins, name, None)
    return name in ("StorageFailing", "HttpError") or (
        isinstance(builtin, type) and issubclass(builtin, OSError))


def _failed_warning(message: str) -> bool:
    """`_failed` for JAX's warning `message` if it says the cache in use failed (a read: by a
    storage error); False for any other warning."""
    if not message.startswith((_WRITE, _READ)):
        return False
    error = message.partition("': ")[2]  # "OSError: [Errno 28] No space left on device"
    if message.startswith(_READ) and not _storage_error(error.partition(":")[0]):
        return False
    return _failed("writing" if message.startswith(_WRITE) else "reading", error)


def _failed(operation: str, error: str) -> bool:
    """The cache in use failed `operation` ("writing" or "reading") with `error` ("OSError:
    [Errno 28] No space left on device"): without --compilation_cache_required it is turned off
    for the rest of the command with one line saying so and why (True); with it, an OSError
    ends the command in one line. False when no cache is watched."""
    import jax

    watched = _IN_USE[0]
    if watched is None:
        return False
    with _TURNING_OFF:
        if _IN_USE[0] is None:  # another thread's program turned it off meanwhile
            return True
        _IN_USE[0] = None
        path, required = watched
        said = (f"the compilation cache {path} failed {operation} a compiled program "
                f"({(error.splitlines() or [''])[0][:300]})")
        if required:
            # raised inside JAX's own handling of cache errors: let through, not warned
            _RAISE_BEFORE.append(jax.config.jax_raise_persistent_cache_errors)
            jax.config.update("jax_raise_persistent_cache_errors", True)
            raise OSError(f"{said}; fix it, or choose another with --compilation_cache=<dir> (or off), "
                          "or run without it: drop --compilation_cache_required")
        from jax.experimental.compilation_cache import compilation_cache as jax_cache

        jax.config.update("jax_enable_compilation_cache", False)
        jax_cache.reset_cache()  # JAX decides once whether it uses its cache: decided again
        logging.getLogger(__name__).warning(
            f"warning: {said}; running on without it (every program compiles from now on; "
            "--compilation_cache_required stops the command instead)")
    return True
