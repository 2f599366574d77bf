"""fsync for what must survive a crash: a file's bytes, and a folder's entries (a rename, a new file)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path, *, directory: bool = False) -> None:
    """Flush `path` to stable storage: a file's contents, or with directory=True a folder's entries."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fsync_path(path, directory=True)


def fsync_file(path: Path) -> None:
    fsync_path(path)
