"""Inter-process locks of the lab: a bench JSON that processes sharing a sweep update (one writer at a time) and a
run folder that one process trains at a time. OS file locks, so each ends with the process that holds it, however
that process ends. filelock (the [lab] extra) is imported where used, so the command line starts without it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Union

__all__ = ["locked", "claimed", "CLAIM"]


@contextlib.contextmanager
def locked(path: Union[str, Path]) -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (a ``.<name>.lock`` sibling) for the block: a read-merge-write
    of a file other processes also update (a bench JSON whose parts two processes measure) must not interleave, or
    the later writer puts back the earlier state it read and the other's update is lost."""
    from filelock import FileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.parent / f".{path.name}.lock")):
        yield


CLAIM = ".claim.lock"


@contextlib.contextmanager
def claimed(folder: Union[str, Path], wait: bool = False) -> Iterator[bool]:
    """Claim a run folder for the block: yield True when this process holds the claim, False at once when another
    process holds it (``wait``: block until it ends, then hold it) — two processes sharing a sweep never train the
    same run into one folder. The claim is an OS file lock (``<folder>/.claim.lock``), so it ends with its process
    however that process ends: a run whose trainer was killed is free to be resumed at once, with no stale claim to
    clear."""
    from filelock import FileLock, Timeout

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / CLAIM))
    try:
        lock.acquire(timeout=-1 if wait else 0)
        held = True
    except Timeout:
        held = False
    try:
        yield held
    finally:
        if held:
            lock.release()
