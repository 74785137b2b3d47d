"""Local folders and object-store URLs (gs://...) as one kind of path."""

from __future__ import annotations

import os
from pathlib import Path

from etils import epath


def is_remote(path: str | os.PathLike) -> bool:
    """True for an object-store URL such as gs://bucket/run."""
    return "://" in str(path)


def workdir_path(directory: str | os.PathLike) -> epath.Path:
    """A local folder (made absolute) or an object store URL such as gs://bucket/run, as a path
    (pathlib.Path would turn "gs://b/run" into the local folder "gs:/b/run")."""
    return epath.Path(directory if is_remote(directory) else Path(directory).absolute())
