"""Metrics shared by the model families.

Text recognition: character and word error rates as every HTR paper reports them — the total edit distance over a
set divided by the total length of the references (not a mean of per-line rates), with words cut HTR-VT's way
(punctuation split off as words of its own). Edit distances come from rapidfuzz (C++, any hashable sequence).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence

__all__ = ["edit_distance", "wer_words", "ErrorRates", "error_rates"]

# HTR-VT's format_string_for_wer: spaces around these characters, whitespace collapsed
_PUNCT = re.compile(r"([\[\]{}/\\()\"'&+*=<>?.;:,!\-—_€#%°])")
_SPACES = re.compile(r"\s+")


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance between two strings, or two sequences of words."""
    from rapidfuzz.distance import Levenshtein

    return int(Levenshtein.distance(a, b))


def wer_words(text: str) -> List[str]:
    """The words WER counts: punctuation marks become words of their own ("end." → "end", "."), whitespace is
    collapsed (HTR-VT's tokenisation)."""
    return _SPACES.sub(" ", _PUNCT.sub(r" \1 ", text)).split()


@dataclass
class ErrorRates:
    """Totals over a set of lines: CER = char_errors / chars, WER = word_errors / words."""

    char_errors: int = 0
    chars: int = 0
    word_errors: int = 0
    words: int = 0
    lines: int = 0

    def add(self, prediction: str, reference: str) -> None:
        self.char_errors += edit_distance(prediction, reference)
        self.chars += len(reference)
        ref_words = wer_words(reference)
        self.word_errors += edit_distance(wer_words(prediction), ref_words)
        self.words += len(ref_words)
        self.lines += 1

    @property
    def cer(self) -> float:
        return self.char_errors / max(self.chars, 1)

    @property
    def wer(self) -> float:
        return self.word_errors / max(self.words, 1)

    def as_dict(self) -> Dict[str, float]:
        return {"cer": self.cer, "wer": self.wer, "char_errors": self.char_errors, "chars": self.chars,
                "word_errors": self.word_errors, "words": self.words, "lines": self.lines}


def error_rates(predictions: Sequence[str], references: Sequence[str]) -> ErrorRates:
    """CER and WER of ``predictions`` against ``references`` (same length), totalled over the set."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    rates = ErrorRates()
    for p, r in zip(predictions, references):
        rates.add(p, r)
    return rates
