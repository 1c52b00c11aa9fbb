"""Atomic file writes for every file the package writes outside a checkpoint (JSON reports, figures, token caches,
sample grids): the file appears whole or not at all, and processes writing the same file at once — benches sharing a
sweep, two runs tokenising the same corpus on first use — never trip over each other's temporary file. Each writer
gets its own temporary sibling, so the last ``os.replace`` wins and every reader sees one complete version."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

__all__ = ["atomic_path", "write_text_atomic", "umask", "file_mode"]


def umask() -> int:
    """The process's umask (read by setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open``: 0o666 less the umask (``mkstemp`` and safetensors write 0o600)."""
    return 0o666 & ~umask()


@contextlib.contextmanager
def atomic_path(path: Union[str, Path]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``, unique to this writer and with the same suffix (so writers that pick a
    format by extension keep working); move it onto ``path`` when the block ends, delete it if the block raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if tmp.exists():
            os.chmod(tmp, file_mode())  # as any file the user's tools write: the umask decides, not mkstemp's 0o600
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    """``Path(path).write_text(text)``, atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
