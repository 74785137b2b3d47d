"""The one logger of the package: `log = logging.getLogger(__name__)` in every module.

Messages of the `bert_jax` logger go to the console as plain lines: INFO (progress,
what a run did) to stdout, WARNING and above to stderr, looked up when written so a
redirected sys.stdout/sys.stderr applies. In a multi-process run only process 0 prints
INFO lines; every process prints warnings. The CLI sets the level (`configure`); a
program that imports the library may attach its own handlers instead.
"""

from __future__ import annotations

import logging
import sys

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


def _install() -> None:
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # absl's root handler would print every line a second time


_install()
