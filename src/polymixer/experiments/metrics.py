"""Metrics shared by the model families.

Text recognition: character and word error rates as every HTR paper reports them — the total edit distance over a
set divided by the total length of the references (not a mean of per-line rates), with words cut HTR-VT's way
(punctuation split off as words of its own). Edit distances come from rapidfuzz (C++, any hashable sequence).

Segmentation (pixels of satellite images, points of point clouds): a confusion matrix accumulated over a whole set,
with an ignored ("void") label, and the scores read from it — overall accuracy, per-class IoU, mIoU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["edit_distance", "wer_words", "ErrorRates", "error_rates", "ConfusionMatrix"]

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


class ConfusionMatrix:
    """Counts of (true class, predicted class) over every labelled element of a set — pixels or points.

    ``matrix[t, p]`` counts elements of true class t predicted as p. Elements whose label is ``ignore_index`` (the
    void label) are not counted at all, whatever their prediction. Scores come from the totals, never as means of
    per-image scores:

    * overall accuracy = trace / total;
    * IoU of class c = TP / (TP + FP + FN); NaN for a class absent from both the truth and the predictions;
    * mIoU = the mean IoU over the classes that are present in the truth or the predictions — an absent class has no
      IoU to average and is excluded (a class present in the truth but never predicted counts with IoU 0, and so
      does a class predicted but absent from the truth).

    ``update`` takes integer tensors or arrays of any (equal) shape; tensors are counted with ``torch.bincount`` on
    their own device.
    """

    def __init__(self, num_classes: int, ignore_index: Optional[int] = None,
                 class_names: Optional[Sequence[str]] = None) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        if ignore_index is not None and 0 <= ignore_index < num_classes:
            raise ValueError(f"ignore_index {ignore_index} is one of the {num_classes} classes; the void label must "
                             f"lie outside 0 … {num_classes - 1}")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for {num_classes} classes")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.class_names = None if class_names is None else list(class_names)
        self.matrix = np.zeros((num_classes, num_classes), dtype=np.int64)

    def update(self, prediction: Any, target: Any) -> None:
        """Add a batch: ``prediction`` and ``target`` are integer class ids of the same shape."""
        import torch

        pred = torch.as_tensor(prediction)
        true = torch.as_tensor(target)
        if pred.shape != true.shape:
            raise ValueError(f"prediction shape {tuple(pred.shape)} differs from target shape {tuple(true.shape)}")
        if pred.is_floating_point() or true.is_floating_point():
            raise TypeError("predictions and targets must be integer class ids (take the argmax of the logits first)")
        pred, true = pred.reshape(-1).long(), true.reshape(-1).long().to(pred.device)
        if self.ignore_index is not None:
            keep = true != self.ignore_index
            pred, true = pred[keep], true[keep]
        if true.numel() == 0:
            return
        k = self.num_classes
        for name, ids in (("target", true), ("prediction", pred)):
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= k:
                void = f" or the void label {self.ignore_index}" if name == "target" and self.ignore_index is not None \
                    else ""
                raise ValueError(f"{name} holds class {lo if lo < 0 else hi}, outside 0 … {k - 1}{void}")
        counts = torch.bincount(true * k + pred, minlength=k * k)
        self.matrix += counts.reshape(k, k).cpu().numpy()

    def merge(self, other: "ConfusionMatrix") -> "ConfusionMatrix":
        """Add another matrix of the same classes (e.g. from another process or another split)."""
        if other.num_classes != self.num_classes or other.ignore_index != self.ignore_index:
            raise ValueError("confusion matrices of different classes or void labels cannot be merged")
        self.matrix += other.matrix
        return self

    @property
    def total(self) -> int:
        return int(self.matrix.sum())

    @property
    def overall_accuracy(self) -> float:
        """Correct / counted elements (NaN when nothing was counted)."""
        return float(np.trace(self.matrix) / self.total) if self.total else float("nan")

    @property
    def iou(self) -> np.ndarray:
        """(num_classes,) IoU per class; NaN for a class absent from both the truth and the predictions."""
        tp = np.diag(self.matrix).astype(np.float64)
        union = self.matrix.sum(0) + self.matrix.sum(1) - tp
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(union > 0, tp / np.maximum(union, 1), np.nan)

    @property
    def miou(self) -> float:
        """Mean IoU over the classes present in the truth or the predictions (absent classes are excluded)."""
        iou = self.iou
        present = ~np.isnan(iou)
        return float(iou[present].mean()) if present.any() else float("nan")

    @property
    def recall(self) -> np.ndarray:
        """(num_classes,) per-class accuracy TP / (TP + FN); NaN for a class absent from the truth."""
        support = self.matrix.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(support > 0, np.diag(self.matrix) / np.maximum(support, 1), np.nan)

    def as_dict(self) -> Dict[str, Any]:
        """Scores as plain numbers (JSON-ready): oa, miou, per-class IoU / recall / support, and the matrix."""
        names = self.class_names or [str(c) for c in range(self.num_classes)]
        clean = lambda v: None if np.isnan(v) else float(v)  # noqa: E731
        return {"oa": self.overall_accuracy, "miou": self.miou, "counted": self.total,
                "classes_present": int((~np.isnan(self.iou)).sum()),
                "per_class": [{"class": c, "name": names[c], "iou": clean(self.iou[c]), "recall": clean(self.recall[c]),
                               "support": int(self.matrix[c].sum()), "predicted": int(self.matrix[:, c].sum())}
                              for c in range(self.num_classes)],
                "matrix": self.matrix.tolist()}
