"""The one logger of the package: `log = logging.getLogger(__name__)` in every module.

Messages of the `bert_jax` logger go to the console as plain lines: INFO (progress,
what a run did) to stdout, WARNING and above to stderr, looked up when written so a
redirected sys.stdout/sys.stderr applies. In a multi-process run only process 0 prints
INFO lines; every process prints warnings. The CLI and the tools attach it (`install`) and
set the level (`configure`); importing the package attaches nothing.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import tempfile
import threading
import traceback
import warnings

ROOT = "bert_jax"


class _ConsoleHandler(logging.Handler):
    """INFO to the current sys.stdout, WARNING+ to the current sys.stderr, message only."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING and _process_index() != 0:
            return
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 (logging must never raise into the caller)
            self.handleError(record)


def _process_index() -> int:
    jax = sys.modules.get("jax")  # only if already imported: logging never imports jax
    return jax.process_index() if jax is not None else 0


def configure(level: int = logging.INFO) -> None:
    """Sets the package logger's level (INFO: progress lines; WARNING: warnings only)."""
    logging.getLogger(ROOT).setLevel(level)


def _from_storage_library(record: logging.LogRecord) -> bool:
    """Orbax, asyncio, or gcsfs (gs:// files: a traceback per failed request)."""
    return (record.name in ("asyncio", "gcsfs") or record.name.startswith("gcsfs.")
            or f"{os.sep}orbax{os.sep}" in record.pathname)


def _abandoned_io(obj, error) -> bool:
    """What a read or write that a failed Orbax save or restore abandoned reports when it is
    collected (at any later time, at exit at the latest): its coroutine (or the task holding
    it) is Orbax's, or the error is Orbax's event loop, closed meanwhile."""
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    coro = obj.get_coro() if hasattr(obj, "get_coro") else obj
    code = getattr(coro, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


class _StorageNoise(logging.Filter):
    """Keeps what Orbax's background threads and asyncio report about a failed save or
    restore off the console (a failed save reports each array it could not write, with a
    traceback: hundreds of lines): it goes to a details file. The failure itself reaches the
    user as our one-line error when the save or restore is waited on; a first error record
    also prints one warning line naming the file, the aftermath of abandoned reads and writes
    does not."""

    def __init__(self):
        super().__init__()
        self.path = os.path.join(tempfile.gettempdir(), f"bert_jax-{os.getpid()}-details.log")
        self._file = None
        self._announced = False
        self._lock = threading.Lock()  # Orbax's threads report at once

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        aftermath = record.name == "asyncio" and (
            _abandoned_io(None, error) or f"{os.sep}orbax{os.sep}" in record.getMessage())
        if not aftermath and (record.levelno < logging.ERROR or not _from_storage_library(record)):
            return True
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.write(f"{record.levelname} {record.pathname}:{record.lineno}\n{text}", announce=not aftermath)
        return False

    def unraisable(self, unraisable) -> bool:
        """Writes an abandoned read's or write's report to the file; False for anything else."""
        if not _abandoned_io(unraisable.object, unraisable.exc_value):
            return False
        self.write("".join(traceback.format_exception(
            unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)), announce=False)
        return True

    def write(self, text: str, announce: bool = True) -> None:
        """Appends to the details file; the first write that `announce`s says where it is."""
        with self._lock:
            if self._file is None:
                try:
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (till exit)
                except OSError:
                    return
            if announce and not self._announced:
                self._announced = True
                logging.getLogger(ROOT).warning(f"warning: a storage library reported errors; "
                                                f"their details are in {self.path}")
            try:
                self._file.write(text.rstrip("\n") + "\n")
                self._file.flush()
            except (OSError, ValueError):  # that disk may be full too: the details are lost, not
                pass  # the run's one-line error


_NOISE: _StorageNoise | None = None


def divert_library_errors() -> None:
    """Orbax's noise, handled here and only here, installed once per process (the CLI installs
    it at start; a failed restore installs it in any program, since the reads it abandoned
    report later): Orbax's and asyncio's error records, the unraisable reports of abandoned
    reads and writes (into Orbax's closed event loop) and the warnings about their coroutines
    left unawaited go to a details file instead of the console."""
    global _NOISE
    if _NOISE is not None:  # once per process (the CLI may run several times in one, as in tests)
        return
    noise = _NOISE = _StorageNoise()
    # The records' own loggers (asyncio; absl, which Orbax logs through; gcsfs) for a program without
    # handlers of its own, and the root handlers for Orbax modules with a logger of their own.
    for logger in (logging.getLogger("asyncio"), logging.getLogger("absl"), logging.getLogger("gcsfs")):
        logger.addFilter(noise)
    for handler in logging.getLogger().handlers:
        handler.addFilter(noise)
    previous = sys.unraisablehook

    def hook(unraisable):
        if not noise.unraisable(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        # A write or read a failed save/restore abandoned is collected unawaited, at exit at
        # the latest ("sys:1: RuntimeWarning: coroutine '...write_fragment' was never awaited"):
        # not news to the user, who has the one-line error. Kept in the details file.
        if issubclass(category, RuntimeWarning) and "was never awaited" in str(message):
            noise.write(warnings.formatwarning(message, category, filename, lineno, line),
                        announce=False)
        elif "persistent compilation cache entry" in str(message):
            # JAX could not read or write a cached program (a full disk, a file size limit,
            # a bucket without write access): it compiles instead, so the run goes on. One
            # line names the details file. (A cache the command set up is watched at the
            # cache itself: compilation_cache turns it off, or stops, at its first failed
            # write, before JAX would warn.)
            noise.write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    # Collect such leftovers before the interpreter tears the warnings module down (after
    # that, Python prints them straight to stderr as "sys:1: RuntimeWarning: ...").
    atexit.register(gc.collect)


def install() -> None:
    """Attaches the console handler (once) and sets INFO: called by the CLI and the tools'
    entry points, never by `import` (a program that imports the library keeps its own
    logging setup)."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # absl's root handler would print every line a second time
