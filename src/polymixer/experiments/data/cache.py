"""Where the offline defaults are generated, and how a generated folder appears: all at once or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

__all__ = ["cache_dir", "build_folder", "cached_default", "resolve_folder"]


def cache_dir(*parts: str) -> Path:
    """``$POLYMIXER_CACHE`` (default ``~/.cache/polymixer``) joined with ``parts``. The offline defaults fill about
    1.25 GB there once every family has run (OCR lines ~720 MB in 35,000 files, PASTIS ~420 MB, point-cloud rooms
    ~90 MB); point the variable elsewhere to move them."""
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


def cached_default(family: str, name: str, version: int, build: Callable[..., Any], seed: int = 0,
                   progress: bool = True, **sizes: Any) -> Path:
    """The folder of an offline default, generated on first use and reused: ``cache_dir(family,
    "<name>-v<version>-s<seed>[-<size><value>…]")`` — each combination of ``sizes`` its own folder.
    ``build(root, seed=…, progress=…, **sizes)`` writes it (through :func:`build_folder`, so a crash leaves nothing
    behind); when another process finishes the same folder first, its copy is used."""
    def part(k: str, v: Any) -> str:
        if isinstance(v, dict):
            return "-".join(part(a, b) for a, b in sorted(v.items()))
        return f"{k}{'x'.join(map(str, v)) if isinstance(v, (tuple, list)) else v}"

    tag = "".join(f"-{part(k, v)}" for k, v in sorted(sizes.items()) if v is not None)
    root = cache_dir(family, f"{name}-v{version}-s{seed}{tag}")
    if not root.is_dir():
        try:
            build(root, seed=seed, progress=progress, **sizes)
        except FileExistsError:  # another process finished it first
            pass
    return root


def resolve_folder(data: Optional[Union[str, Path]], defaults: Sequence[str], default: Callable[[str], Path]
                   ) -> Path:
    """The dataset folder a ``--data`` value names: None or one of ``defaults`` → ``default(name)`` (the offline
    default, generated once); anything else must be an existing folder (a FileNotFoundError naming it otherwise,
    the same for every family)."""
    if data is None or str(data) in defaults:
        return default(str(data) if data is not None else defaults[0])
    root = Path(data)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {root} does not exist (or use --data "
                                f"{' / '.join(defaults)} for the offline default)")
    return root
