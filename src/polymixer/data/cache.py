"""Where the offline defaults are generated, and how a generated folder appears: all at once or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Union

__all__ = ["cache_dir", "build_folder"]


def cache_dir(*parts: str) -> Path:
    """``$POLYMIXER_CACHE`` (default ``~/.cache/polymixer``) joined with ``parts``."""
    return Path(os.environ.get("POLYMIXER_CACHE", Path.home() / ".cache" / "polymixer")).joinpath(*parts)


@contextlib.contextmanager
def build_folder(root: Union[str, Path]) -> Iterator[Path]:
    """Yield a temporary sibling of ``root`` to write a dataset into; rename it to ``root`` when the block ends, or
    delete it if the block raises — a crash never leaves half a dataset at ``root``. ``FileExistsError`` if ``root``
    exists before or appears meanwhile (another process finished first)."""
    root = Path(root)
    if root.exists():
        raise FileExistsError(f"{root} already exists; remove it to regenerate the dataset")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        if root.exists():
            raise FileExistsError(f"{root} appeared while the dataset was being written")
        try:
            os.replace(tmp, root)
        except OSError as e:  # another process renamed its copy first (non-empty target directory)
            if root.exists():
                raise FileExistsError(f"{root} appeared while the dataset was being written") from e
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
