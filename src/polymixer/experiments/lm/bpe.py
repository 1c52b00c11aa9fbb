"""Token-level language models: a byte-level BPE vocabulary trained once, offline, on the prose corpus's train
split with the ``tokenizers`` library (the ``lab`` extra), cached like the corpora, and :func:`lab_tokenizer`, which
every ``--tokenizer`` of the lab reads.

``--tokenizer`` takes ``bytes``, ``prose-bpe-<N>`` (a BPE of N entries trained on the prose train split alone —
validation and test articles are never read — e.g. ``prose-bpe-4096``), a ``tokenizers`` JSON file, or a folder with
GPT-2's ``encoder.json`` / ``vocab.bpe``. Byte-level BPE maps every byte to a symbol first, so any text round-trips
and :meth:`BPETokenizer.token_bytes` (the UTF-8 bytes each token stands for) gives bits per byte comparable with a
byte model's.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from ..data import cache
from ...files import write_text_atomic
from ...tokenizer import EOT_TEXT, Tokenizer, bytes_to_unicode, load_tokenizer
from .data import PROSE_PACKAGE, PROSE_SPLIT, document_split, prose_documents, prose_source

__all__ = ["PROSE_BPE", "BPE_SIZES", "BPETokenizer", "train_bpe", "prose_bpe", "prose_bpe_path", "lab_tokenizer",
           "TOKENIZER_CHOICES", "bytes_per_token", "run_tokenizer",
           "tokenizer_known", "tokenizer_argument", "compression_table"]

PROSE_BPE = "prose-bpe-"  # --tokenizer prose-bpe-<N>
BPE_SIZES = (512, 65536)  # the vocabulary sizes prose-bpe-<N> accepts (the 256 bytes, end-of-text and merges)
TOKENIZER_CHOICES = ("'bytes', 'prose-bpe-<N>' (a byte-level BPE of N entries, 512 to 65536, trained on the prose "
                     "train split; e.g. prose-bpe-4096), a tokenizers JSON file, or a folder with GPT-2's "
                     "encoder.json and vocab.bpe")
INSTALL = "pip install 'polymixer[lab]' (or: pip install tokenizers)"


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"BPE tokenizers need the 'tokenizers' package: {INSTALL}") from e
    return tokenizers


class BPETokenizer:
    """A byte-level BPE of the ``tokenizers`` library (its JSON file) as the lab's :class:`Tokenizer`; ``name`` is
    what ``--tokenizer`` was given, recorded in checkpoints so that ``generate`` and ``eval`` find it again."""

    def __init__(self, path: Union[str, Path], name: Optional[str] = None) -> None:
        self.path = Path(path)
        text = self.path.read_bytes()
        self.digest = hashlib.sha256(text).hexdigest()[:16]  # what a checkpoint records of it
        self.tok = _tokenizers().Tokenizer.from_str(text.decode("utf-8"))
        if "ByteLevel" not in json.dumps(json.loads(text).get("pre_tokenizer")):
            raise ValueError(f"{self.path}: not a byte-level BPE (its pre-tokenizer is not ByteLevel), so its tokens' "
                             f"bytes, and bits per byte, are unknown")
        self.tok.encode_special_tokens = True  # end-of-text's text inside a document is text, not the token
        self.name = name or str(self.path)
        eot = self.tok.token_to_id(EOT_TEXT)
        if eot is None:
            raise ValueError(f"{self.path}: the BPE has no {EOT_TEXT!r} token")
        self.eot_id = int(eot)
        self.vocab_size = int(self.tok.get_vocab_size(with_added_tokens=True))
        self._bytes = self._token_bytes()
        self._byte_of = {c: b for b, c in bytes_to_unicode().items()}  # a token's symbols back to its bytes

    def encode(self, text: str) -> List[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """UTF-8 bytes to tokens (bytes that are not UTF-8 become U+FFFD first, as GPT-2's tokenizer does)."""
        return np.asarray(self.encode(data.decode("utf-8", errors="replace")), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens to text; an end-of-text token reads as its text (as the byte tokenizer's does)."""
        back = self._byte_of
        out, parts = bytearray(), []
        for i in map(int, ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary of {self.vocab_size} of {self.name}")
            if i == self.eot_id:
                parts.append(out.decode("utf-8", errors="replace") + EOT_TEXT)
                out = bytearray()
            else:
                out.extend(back[c] for c in self.tok.id_to_token(i))
        return "".join(parts) + out.decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """Number of UTF-8 bytes each token stands for (one symbol per byte; end-of-text 0): for bits per byte."""
        return self._bytes.copy()

    def _token_bytes(self) -> np.ndarray:
        t = np.zeros(self.vocab_size, dtype=np.int64)
        symbols = set(bytes_to_unicode().values())
        for tok, i in self.tok.get_vocab(with_added_tokens=True).items():
            if tok != EOT_TEXT:
                if not all(c in symbols for c in tok):
                    raise ValueError(f"{self.path}: token {tok!r} is not byte-level BPE (its bytes are unknown)")
                t[i] = len(tok)
        return t


def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2's pre-tokenisation, the 256 byte symbols, end-of-text, then merges up to
    ``vocab_size`` entries) trained on ``texts``; a ``tokenizers.Tokenizer``. Deterministic: the same texts give the
    same file. Fewer entries when the texts hold fewer pairs to merge."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT_TEXT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def prose_bpe_path(vocab_size: int, source: Optional[Path] = None,
                   cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """The JSON file of ``prose-bpe-<vocab_size>``: trained on the prose corpus's train articles (never validation
    or test: :func:`document_split` with the corpus's shares) on first use, then cached by the source file's path,
    size and modification time, the package's and ``tokenizers``' versions and the size. ``source``: the articles'
    JSON (default: the installed package's, :func:`prose_source`). Beside it, ``<file>.meta.json`` records the
    train split's bytes and tokens (its compression)."""
    if not BPE_SIZES[0] <= vocab_size <= BPE_SIZES[1]:
        raise ValueError(f"{PROSE_BPE}{vocab_size}: the size must be from {BPE_SIZES[0]} to {BPE_SIZES[1]}")
    src = Path(source) if source is not None else prose_source()
    st = src.stat()
    try:
        version: Optional[str] = importlib.metadata.version(PROSE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    key = json.dumps(["prose-bpe", str(src.resolve()), st.st_size, st.st_mtime_ns, version,
                      _tokenizers().__version__, vocab_size, PROSE_SPLIT])
    root = Path(cache_dir) if cache_dir else cache.cache_dir("tokenizers")
    out = root / f"{PROSE_BPE}{vocab_size}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if not out.is_file():
        train = [text.decode("utf-8") for name, text in prose_documents(src)
                 if document_split(name, *PROSE_SPLIT) == "train"]
        tok = train_bpe(train, vocab_size)
        n_tokens = sum(len(e.ids) for e in tok.encode_batch(train, add_special_tokens=False))
        n_bytes = sum(len(t.encode("utf-8")) for t in train)
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out.with_suffix(".meta.json"), json.dumps(
            {"vocab_size": vocab_size, "documents": len(train), "train_bytes": n_bytes, "train_tokens": n_tokens,
             "bytes_per_token": n_bytes / n_tokens, "key": json.loads(key)}, indent=2))
        write_text_atomic(out, tok.to_str())  # written last: its presence marks a complete cache
    return out


def prose_bpe(vocab_size: int, source: Optional[Path] = None,
              cache_dir: Optional[Union[str, Path]] = None) -> BPETokenizer:
    """``--tokenizer prose-bpe-<vocab_size>`` (:func:`prose_bpe_path`), loaded."""
    return BPETokenizer(prose_bpe_path(vocab_size, source, cache_dir), f"{PROSE_BPE}{vocab_size}")


def tokenizer_known(name: str) -> bool:
    """Whether ``name`` has the form of a ``--tokenizer`` value (checked before anything is trained or read)."""
    m = re.fullmatch(re.escape(PROSE_BPE) + r"(\d+)", name)
    if m:
        return BPE_SIZES[0] <= int(m.group(1)) <= BPE_SIZES[1]
    path = Path(name)
    return name in ("bytes", "byte") or (path.suffix == ".json" and path.is_file()) or path.is_dir()


def tokenizer_argument(text: str) -> str:
    """``--tokenizer``'s type (train lm, bench lm): a value of the form :func:`lab_tokenizer` accepts (loaded when
    the run starts); anything else is a one-line error listing them."""
    if not tokenizer_known(text):
        m = re.fullmatch(re.escape(PROSE_BPE) + r"(\d+)", text)
        why = f"the size must be from {BPE_SIZES[0]} to {BPE_SIZES[1]}" if m else f"use {TOKENIZER_CHOICES}"
        raise argparse.ArgumentTypeError(f"unknown tokenizer {text!r}: {why}")
    return text


def lab_tokenizer(name: Optional[str] = None) -> Tokenizer:
    """What a ``--tokenizer`` value names (:data:`TOKENIZER_CHOICES`); anything else is a one-line error listing
    them."""
    name = name or "bytes"
    m = re.fullmatch(re.escape(PROSE_BPE) + r"(\d+)", name)
    if m:
        return prose_bpe(int(m.group(1)))
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        return BPETokenizer(path)
    if name in ("bytes", "byte") or path.is_dir():
        return load_tokenizer(name)  # (a GPT-2 folder's own errors name its files)
    raise ValueError(f"unknown tokenizer {name!r}: use {TOKENIZER_CHOICES}")


def run_tokenizer(data: Dict[str, Any]) -> Tokenizer:
    """The tokenizer a run's ``data`` record names (``generate``, ``eval lm``, a distillation's teacher), checked
    against the digest of the BPE file it trained with: a BPE trained again elsewhere (another ``tokenizers``
    version) that differs is a one-line error, never text read through other token ids."""
    tok = lab_tokenizer(data.get("tokenizer", "bytes"))
    want, have = data.get("tokenizer_digest"), getattr(tok, "digest", None)
    if want is not None and have != want:
        raise ValueError(f"the run trained with the {tok.name} file of digest {want}, but {getattr(tok, 'path', '')} "
                         f"here has digest {have} (trained again by another tokenizers version?): use that file "
                         f"(--tokenizer FILE.json) or retrain")
    return tok


def bytes_per_token(tokenizer: Tokenizer, texts: Sequence[bytes]) -> float:
    """The compression of ``tokenizer`` on ``texts``: UTF-8 bytes per token."""
    return sum(map(len, texts)) / max(1, sum(len(tokenizer.encode_bytes(t)) for t in texts))


BUDGET_TOKENS = 375 * 32 * 1024  # the byte-level prose runs: 375 steps of 32 windows of 1,024 tokens


def compression_table(sizes: Sequence[int] = (2048, 4096, 8192), batch: int = 16, block: int = 1024) -> str:
    """The guide's table behind the choice of ``prose-bpe-<N>``: for each size, bytes per token on the prose train
    split, its tokens, the passes over it that the byte runs' 12.3M tokens would make, the steps of ``batch`` ×
    ``block`` tokens that three passes take, and the entries seen fewer than 100 times in it (``python -m
    polymixer.experiments.lm.bpe``)."""
    train = [text for name, text in prose_documents(prose_source()) if document_split(name, *PROSE_SPLIT) == "train"]
    lines = [f"| entries | bytes / token | train tokens | passes at 12.3M tokens | steps of {batch} × {block} for 3 "
             f"passes | entries seen < 100 times |", "|---|---|---|---|---|---|"]
    for v in sizes:
        tok = prose_bpe(v)
        ids = np.concatenate([tok.encode_bytes(t) for t in train])
        rare = int((np.bincount(ids, minlength=tok.vocab_size) < 100).sum()) - 1  # (end-of-text is never in a text)
        n_bytes = sum(map(len, train))
        lines.append(f"| {v:,} | {n_bytes / len(ids):.2f} | {len(ids):,} | {BUDGET_TOKENS / len(ids):.1f} | "
                     f"{3 * len(ids) // (batch * block):,} | {rare:,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(compression_table())
