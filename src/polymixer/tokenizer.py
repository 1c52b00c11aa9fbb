"""Tokenizers of the language models: bytes (256 symbols, no files) and GPT-2's byte-level BPE read from its
``encoder.json`` / ``vocab.bpe``. Part of the library: generation and the transformers integration need them."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Protocol, Union

import numpy as np

EOT_TEXT = "<|endoftext|>"

__all__ = ["EOT_TEXT", "Tokenizer", "ByteTokenizer", "GPT2BPE", "bytes_to_unicode", "load_tokenizer"]


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> List[int]: ...

    def encode_bytes(self, data: bytes) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_bytes(self) -> np.ndarray: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0–255, end-of-text as 256."""

    name = "bytes"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Iterable[int]) -> str:
        out = bytearray()
        parts = []
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                parts.append(out.decode("utf-8", errors="replace") + EOT_TEXT)
                out = bytearray()
            elif 0 <= i < 256:
                out.append(i)
            else:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocabulary of {self.vocab_size}")
        return "".join(parts) + out.decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """Number of UTF-8 bytes each token stands for (for bits per byte): 1, and 0 for end-of-text."""
        t = np.ones(self.vocab_size, dtype=np.int64)
        t[self.eot_id] = 0
        return t


@lru_cache()
def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class GPT2BPE:
    """GPT-2's byte-level BPE from its two local files (nothing is downloaded)."""

    name = "gpt2"
    _PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, encoder: Dict[str, int], merges: List[tuple]) -> None:
        try:
            import regex
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("the GPT-2 tokenizer needs the 'regex' package: pip install 'polymixer[bpe]'") from e
        self.encoder = encoder
        self.decoder = {v: k for k, v in encoder.items()}
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.pat = regex.compile(self._PATTERN)
        if EOT_TEXT not in encoder:
            raise ValueError(f"encoder.json has no {EOT_TEXT!r} token")
        self.eot_id = encoder[EOT_TEXT]
        self.vocab_size = max(encoder.values()) + 1
        self._cache: Dict[str, List[str]] = {}

    @classmethod
    def from_dir(cls, path: Union[str, Path]) -> "GPT2BPE":
        """Load ``encoder.json`` and ``vocab.bpe`` from a folder (GPT-2's original file names)."""
        path = Path(path)
        enc, bpe = path / "encoder.json", path / "vocab.bpe"
        for f in (enc, bpe):
            if not f.is_file():
                raise FileNotFoundError(f"GPT-2 tokenizer file {f} not found (need encoder.json and vocab.bpe)")
        encoder = json.loads(enc.read_text(encoding="utf-8"))
        lines = bpe.read_text(encoding="utf-8").split("\n")
        merges = [tuple(line.split()) for line in lines[1:] if line.strip() and not line.startswith("#version")]
        return cls(encoder, merges)

    def _bpe(self, token: str) -> List[str]:
        if token in self._cache:
            return self._cache[token]
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        if len(self._cache) < 100_000:
            self._cache[token] = word
        return word

    def encode(self, text: str) -> List[int]:
        ids: List[int] = []
        for piece in self.pat.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(mapped))
        return ids

    def encode_bytes(self, data: bytes) -> np.ndarray:
        return np.asarray(self.encode(data.decode("utf-8", errors="replace")), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        text = "".join(self.decoder[int(i)] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        t = np.zeros(self.vocab_size, dtype=np.int64)
        for tok, i in self.encoder.items():
            t[i] = 0 if tok == EOT_TEXT else len(tok)  # one unicode stand-in character per byte
        return t


def load_tokenizer(name_or_dir: Optional[str] = None) -> Tokenizer:
    """"bytes" (default) or a folder holding GPT-2's encoder.json / vocab.bpe."""
    if name_or_dir in (None, "", "bytes", "byte"):
        return ByteTokenizer()
    path = Path(name_or_dir)
    if path.is_dir():
        return GPT2BPE.from_dir(path)
    raise ValueError(f"unknown tokenizer {name_or_dir!r}: use 'bytes' or a folder with GPT-2's encoder.json and "
                     f"vocab.bpe")
