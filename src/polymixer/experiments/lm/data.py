"""Text for language models: a corpus tokenised once into memory-mapped token files, and random windows (the
tokenizers are the library's: :mod:`polymixer.tokenizer`).

* :func:`prepare_corpus` — any text files or folders (default: the Python standard library's own sources, a real
  corpus on every machine), split into train / val *by file*, tokenised once with documents separated by end-of-text
  and cached as ``train.bin`` / ``val.bin`` (numpy uint8 or uint16) next to a ``meta.json``.
* :class:`TokenWindows` — random windows for training (a pure function of seed, step and share: exact resume, and
  data-parallel runs see the same global batch as one process) and fixed windows for evaluation. Windows that cross
  a document boundary are packed by the model (``sep_token``) so that no document attends into another.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..data import cache
from ...files import atomic_path, write_text_atomic
from ..data.faults import SampleError, SampleFaults, check_files
from ...tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "text_problem",
    "read_text_file",
    "default_corpus_files",
    "list_text_files",
    "check_data",
    "prepare_corpus",
    "Corpus",
    "TokenWindows",
]


# ----------------------------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------------------------


def default_corpus_files() -> List[Path]:
    """The Python standard library's own ``.py`` sources on this machine (tests and site-packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "__pycache__", "idle_test"}
    files = sorted(f for f in root.rglob("*.py") if not (skip & set(f.relative_to(root).parts)))
    if not files:
        raise FileNotFoundError(f"no Python sources found under {root}; give text files or folders explicitly")
    return files


def _is_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return True  # kept, so that reading it fails with its name (or is skipped) like any bad document
    return b"\x00" not in head


def _text_files_in(p: Path) -> List[Path]:
    """``p`` itself when it is a file, else the text files found in it (recursively, sorted; hidden and binary files
    skipped)."""
    if not p.exists():
        raise FileNotFoundError(f"corpus path {p} does not exist")
    if p.is_file():
        return [p]
    return [f for f in sorted(p.rglob("*"))
            if f.is_file() and not any(s.startswith(".") for s in f.relative_to(p).parts) and _is_text(f)]


def list_text_files(paths: Sequence[Union[str, Path]]) -> List[Path]:
    """Every text file named, or found (recursively, sorted) in a folder named; binary files are skipped."""
    out: List[Path] = []
    for p in map(Path, paths):
        out.extend(_text_files_in(p))
    if not out:
        raise ValueError(f"no text files found in {', '.join(map(str, paths))}")
    return out


TEXT_SLICE = 1 << 22  # bytes decoded at a time when a corpus file is checked for UTF-8


def text_problem(data: bytes) -> Optional[str]:
    """Why ``data`` is not UTF-8 text — the byte offset of its first NUL byte (binary, or UTF-16 / UTF-32 text) or of
    its first byte that is not UTF-8 (Latin-1, say) — or None. Decoded in slices (no copy of a large file as text)."""
    nul = data.find(b"\x00")
    decoder = codecs.getincrementaldecoder("utf-8")()
    step = TEXT_SLICE
    for i in range(0, max(len(data), 1), step):
        pending = len(decoder.getstate()[0])  # bytes of a character begun in the previous slice
        try:
            decoder.decode(data[i:i + step], final=i + step >= len(data))
        except UnicodeDecodeError as e:
            at = i - pending + e.start
            if 0 <= nul < at:
                break
            return (f"not UTF-8 text: byte {at} ({e.reason}) — convert it to UTF-8 (iconv -f <its encoding> -t "
                    f"utf-8) or leave it out")
    if nul >= 0:
        return f"a NUL byte at byte {nul}: binary, or UTF-16 / UTF-32 text — convert it to UTF-8 or leave it out"
    return None


def read_text_file(path: Path) -> bytes:
    """A corpus file's bytes, once they are known to be UTF-8 text (a :class:`SampleError` naming the file and the
    byte where it is not)."""
    data = path.read_bytes()
    problem = text_problem(data)
    if problem is not None:
        raise SampleError(path, problem)
    return data


def _check_text_file(path: Path) -> Optional[str]:
    """Why a corpus file cannot be trained on (it does not read, or is not UTF-8 text), or None."""
    return text_problem(path.read_bytes())


def check_data(data: Optional[Sequence[Union[str, Path]]], progress: bool = True) -> List[Tuple[str, str]]:
    """Every bad path of a corpus with its reason, in one pass (``polymixer check-data lm`` and the scan before
    ``train``): a path that does not exist, a file that cannot be opened and read, and no text file at all (reported
    for each path given). ``data`` None → :func:`default_corpus_files`. The files are listed as
    :func:`prepare_corpus` lists them; as it reads bytes, which the tokenisers take whatever they are (GPT-2's
    decodes invalid UTF-8 to U+FFFD), no file is bad for its encoding."""
    if isinstance(data, (str, Path)):
        data = [data]
    bad: List[Tuple[str, str]] = []
    files: List[Path] = []
    if not data:
        try:
            files = default_corpus_files()
        except FileNotFoundError as e:
            return [(sysconfig.get_paths()["stdlib"], str(e))]
    else:
        for p in map(Path, data):
            try:
                files.extend(_text_files_in(p))
            except OSError as e:
                bad.append((str(p), str(e)))
        if not files and not bad:
            bad = [(str(p), "no text files here (binary and hidden files are skipped): give --data text files, or "
                            "folders that hold some") for p in map(Path, data)]
    return bad + check_files(files, _check_text_file, str, progress, desc="check corpus")


@dataclass
class Corpus:
    """Tokenised train / val splits (memory-mapped) and what produced them."""

    train: np.ndarray
    val: np.ndarray
    meta: dict
    path: Path

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eot_id(self) -> int:
        return int(self.meta["eot_id"])


def _cache_root() -> Path:
    return cache.cache_dir()


def prepare_corpus(paths: Optional[Sequence[Union[str, Path]]] = None, tokenizer: Optional[Tokenizer] = None,
                   cache_dir: Optional[Union[str, Path]] = None, val_fraction: float = 0.1,
                   progress: bool = True, faults: Optional[SampleFaults] = None) -> Corpus:
    """Tokenise a corpus once (cached by file list, sizes, modification times and tokenizer) and memory-map it.

    Files go to val when a hash of their path falls below ``val_fraction`` (deterministic on every machine); a
    single file is split by position instead. Documents (files) are separated by end-of-text. A file that cannot be
    read stops with its name, or with ``faults`` skipping is left out (such a corpus is tokenised again next time,
    in case the file was repaired).
    """
    from tqdm.auto import tqdm

    tokenizer = tokenizer or ByteTokenizer()
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    files = default_corpus_files() if not paths else list_text_files(paths)
    name = "python-stdlib" if not paths else ",".join(str(p) for p in paths)
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = hashlib.sha256(json.dumps([tokenizer.name, tokenizer.vocab_size, val_fraction, stats]).encode()).hexdigest()
    root = Path(cache_dir) if cache_dir else _cache_root() / "corpora"
    out = root / key[:16]
    meta_path = out / "meta.json"
    faults = faults if faults is not None else SampleFaults()
    if not meta_path.exists() or json.loads(meta_path.read_text()).get("skipped"):
        out.mkdir(parents=True, exist_ok=True)
        common = os.path.commonpath([str(f.resolve()) for f in files]) if len(files) > 1 else str(files[0].parent)
        is_val = [zlib.crc32(os.path.relpath(str(f.resolve()), common).encode()) % 10_000 < val_fraction * 10_000
                  for f in files]
        if len(files) > 1:
            if all(is_val):
                is_val[0] = False
            if not any(is_val):
                is_val[-1] = True
        dtype = np.uint8 if tokenizer.vocab_size <= 256 else np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
        parts: Dict[str, List[np.ndarray]] = {"train": [], "val": []}
        counts = {"train": 0, "val": 0}
        eot = np.array([tokenizer.eot_id], dtype=dtype)
        skipped: Dict[str, str] = {}
        for f, v in tqdm(list(zip(files, is_val)), desc="tokenising", disable=not progress, unit="file"):
            data = faults.call(f, read_text_file, f)
            if data is None:
                skipped[str(f)] = faults.bad[str(f)]
                continue
            toks = np.concatenate([tokenizer.encode_bytes(data).astype(dtype), eot])
            split = "val" if v else "train"
            parts[split].append(toks)
            counts[split] += 1
        if len(skipped) == len(files):
            raise ValueError(f"no readable file in the corpus ({len(files)} skipped)")
        if len(files) == 1:
            toks = parts["train"][0]
            cut = int(len(toks) * (1 - val_fraction))
            parts = {"train": [toks[:cut]], "val": [toks[cut:]]}
        sizes = {}
        for split, arrs in parts.items():
            data = np.concatenate(arrs) if arrs else np.zeros(0, dtype=dtype)
            with atomic_path(out / f"{split}.bin") as tmp:
                data.tofile(tmp)
            sizes[split] = int(data.size)
        tb = tokenizer.token_bytes()
        meta = {
            "name": name, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
            "eot_id": tokenizer.eot_id, "dtype": np.dtype(dtype).name, "files": len(files) - len(skipped),
            "files_per_split": counts, "tokens": sizes,
            "val_bytes": int(tb[np.fromfile(out / "val.bin", dtype=dtype)].sum()),
            "val_fraction": val_fraction, "skipped": skipped,
        }
        write_text_atomic(meta_path, json.dumps(meta, indent=2))  # written last: its presence marks a complete cache
    meta = json.loads(meta_path.read_text())
    dtype = np.dtype(meta["dtype"])
    mm = {s: (np.memmap(out / f"{s}.bin", dtype=dtype, mode="r") if meta["tokens"][s] else np.zeros(0, dtype=dtype))
          for s in ("train", "val")}
    return Corpus(mm["train"], mm["val"], meta, out)


# ----------------------------------------------------------------------------------------------------------------
# Windows
# ----------------------------------------------------------------------------------------------------------------


class TokenWindows:
    """Windows of ``block_size + 1`` tokens from a token array (inputs and next-token targets)."""

    def __init__(self, data: np.ndarray, block_size: int) -> None:
        if len(data) < block_size + 2:
            raise ValueError(f"a split of {len(data)} tokens is too small for windows of {block_size} tokens; "
                             f"use a bigger corpus or a smaller block_size")
        self.data = data
        self.block_size = block_size

    def _gather(self, offsets: torch.Tensor) -> tuple:
        T = self.block_size
        idx = offsets.numpy()[:, None] + np.arange(T + 1)[None, :]
        w = torch.from_numpy(np.asarray(self.data[idx], dtype=np.int64))
        return w[:, :-1], w[:, 1:]

    def random(self, step: int, batch_size: int, seed: int, share: int = 0, shares: int = 1) -> tuple:
        """Share ``share`` of ``shares`` equal parts of the global batch of step ``step``: a pure function of
        (seed, step), so training resumes exactly and a data-parallel run sees the same global batch as one process."""
        if batch_size % shares:
            raise ValueError(f"global batch {batch_size} is not divisible into {shares} equal shares")
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))
        offsets = torch.randint(0, len(self.data) - self.block_size - 1, (batch_size,), generator=g)
        n = batch_size // shares
        return self._gather(offsets[share * n:(share + 1) * n])

    def fixed(self, count: int, batch_size: int) -> Iterable[tuple]:
        """``count`` evenly spaced windows over the whole split, in batches (evaluation)."""
        last = len(self.data) - self.block_size - 1
        offsets = torch.linspace(0, last, steps=count).round().long().unique()
        for i in range(0, len(offsets), batch_size):
            yield self._gather(offsets[i:i + batch_size])
