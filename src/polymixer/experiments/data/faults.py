"""Unreadable or malformed training samples: stop with the file's name (the default), or skip them and count.

A loader reads one sample through :meth:`SampleFaults.call` (eager loaders: images, text files, OCR lines) or
draws one through :meth:`SampleFaults.pick` (lazy loaders, at batch time: EO patches, point clouds). A failure
becomes a :class:`SampleError` naming the file. Under the default policy it propagates, so the run stops with that
message. With ``skip=True`` it is recorded once per file, and the loader leaves the sample out (eager) or draws the
next good sample in order (lazy). Both are deterministic, so a resumed run draws the same batches. The shared
training loop reports the skipped files: progress bar, history, ``<out>/bad_samples.json``, and the checkpoint.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

__all__ = ["SampleError", "SampleFaults", "DataCheckError", "merge_bad", "READ_ERRORS", "SKIP_HINT", "reading",
           "check_files", "read_array_shape"]

T = TypeVar("T")

# what reading a bad file raises: I/O errors (incl. Pillow's UnidentifiedImageError), format and content checks
# (every loader of this package turns a parser's own exception into a ValueError naming the file), truncation
READ_ERRORS = (OSError, ValueError, EOFError)

SKIP_HINT = "--skip-bad-samples skips such samples and counts them"


class SampleError(ValueError):
    """A sample that cannot be read or is malformed: ``path`` names its file, ``reason`` says what is wrong."""

    def __init__(self, path: Union[str, Path], reason: str, hint: str = "") -> None:
        self.path, self.reason = str(path), reason
        text = reason if self.path in reason else f"{self.path}: {reason}"
        super().__init__(text + (f" ({hint})" if hint else ""))


def merge_bad(bad: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """One entry per bad file, in the order met, its reasons joined with "; " (each once), each reason without the
    file's own name (the line shows it first): what ``check-data`` prints as ``path: reason``, and what it counts."""
    merged: Dict[str, List[str]] = {}
    for path, reason in bad:
        path = str(path)
        # the file's name as a word of its own (not inside a longer path: "expected <root>/lines/" stays whole)
        text = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?![\w/.-])(: )?", " ", str(reason))
        text = " ".join(text.split()) or "bad"
        reasons = merged.setdefault(path, [])
        if text not in reasons:
            reasons.append(text)
    return [(p, "; ".join(r)) for p, r in merged.items()]


class DataCheckError(ValueError):
    """The upfront check of a dataset found bad files: ``bad`` lists (file, reason) for every one of them."""

    SHOWN = 20

    def __init__(self, where: str, bad: List[Tuple[str, str]]) -> None:
        self.where, self.bad = where, merge_bad(bad)
        if len(self.bad) == 1:  # one line: the file and what is wrong with it
            p, r = self.bad[0]
            if p == str(where):  # the dataset itself (no files, not a dataset): nothing to skip
                super().__init__(f"{p}: {r}")
            else:
                super().__init__(f"{p}: {r} — fix or remove it, or train with --skip-bad-samples")
            return
        lines = [f"{len(self.bad)} bad file{'s' if len(self.bad) != 1 else ''} in {where} — fix or remove "
                 f"{'them' if len(self.bad) != 1 else 'it'}, or train with --skip-bad-samples:"]
        lines += [f"  {p}: {r}" for p, r in self.bad[:self.SHOWN]]
        if len(self.bad) > self.SHOWN:
            lines.append(f"  … and {len(self.bad) - self.SHOWN} more (polymixer check-data lists them all)")
        super().__init__("\n".join(lines))


def check_files(items: Sequence[T], check: Callable[[T], Optional[str]], name: Callable[[T], str],
                progress: bool = True, desc: str = "check data") -> List[Tuple[str, str]]:
    """Run ``check(item)`` on every item (a reason string when the item is bad, None when it is good; a read error
    it raises counts as bad too) and return (name, reason) of every bad one — with a progress bar on large sets."""
    from tqdm.auto import tqdm

    bad: List[Tuple[str, str]] = []
    for item in tqdm(items, desc=desc, disable=not progress or len(items) < 200, dynamic_ncols=True, leave=False):
        try:
            reason = check(item)
        except SampleError as e:
            bad.append((e.path, e.reason))
            continue
        except READ_ERRORS as e:
            reason = str(e) or type(e).__name__
        if reason:
            bad.append((name(item), reason))
    return bad


def as_sample_error(path: Union[str, Path], error: BaseException) -> SampleError:
    if isinstance(error, SampleError):
        return error
    return SampleError(path, str(error) or type(error).__name__)


@contextlib.contextmanager
def reading(path: Union[str, Path]) -> Iterator[None]:
    """Inside: a read error (:data:`READ_ERRORS`) is a :class:`SampleError` naming ``path``."""
    try:
        yield
    except SampleError:
        raise
    except READ_ERRORS as e:
        raise as_sample_error(path, e) from e


class SampleFaults:
    """The policy for bad samples and the record of those skipped (file → reason, in the order met)."""

    def __init__(self, skip: bool = False, hint: str = "") -> None:
        self.skip, self.hint = skip, hint
        self.bad: Dict[str, str] = {}
        self._unreported: List[str] = []

    @classmethod
    def training(cls, skip: bool) -> "SampleFaults":
        """The policy of a train command: its stop message says how to skip instead."""
        return cls(skip, SKIP_HINT)

    def __len__(self) -> int:
        return len(self.bad)

    def record(self, error: SampleError) -> None:
        """Stop (raise ``error``, with the hint) unless skipping; then remember the file once."""
        if not self.skip:
            if not self.hint:
                raise error
            raise SampleError(error.path, error.reason, self.hint) from error
        if error.path not in self.bad:
            self.bad[error.path] = error.reason
            self._unreported.append(error.path)

    def restore(self, bad: Dict[str, str]) -> None:
        """Files skipped before a resume (from the checkpoint): counted, not reported again."""
        for path, reason in bad.items():
            self.bad.setdefault(path, reason)

    def unreported(self) -> List[Tuple[str, str]]:
        """(file, reason) of the files skipped since the last call."""
        out = [(p, self.bad[p]) for p in self._unreported]
        self._unreported = []
        return out

    def call(self, path: Union[str, Path], fn: Callable[..., T], *args: object) -> Optional[T]:
        """``fn(*args)``, the reading of the sample in file ``path``; None when it fails and bad samples are
        skipped."""
        try:
            with reading(path):
                return fn(*args)
        except SampleError as e:
            self.record(e)
            return None

    def pick(self, index: int, count: int, load: Callable[[int], T]) -> T:
        """Sample ``index`` of ``count`` from ``load`` (which raises :class:`SampleError` for a bad one); when
        skipping, the next good sample in cyclic order takes the place of a bad one."""
        for k in range(count):
            try:
                return load((index + k) % count)
            except SampleError as e:
                self.record(e)
        raise ValueError(f"all {count} training samples are unreadable; skipped: "
                         + "; ".join(f"{p}: {r}" for p, r in list(self.bad.items())[:3]))


def read_array_shape(path: Path) -> Tuple[Tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file from its header alone (nothing is loaded); a file shorter than its header
    says (truncated) is a ValueError."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            offset = f.tell()
    except ValueError as e:
        raise ValueError(f"{path} is not a .npy array: {e}") from e
    dtype = np.dtype(dtype)
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise ValueError(f"{path} is truncated: {size:,} bytes, its header promises {need:,}")
    return tuple(shape), dtype
