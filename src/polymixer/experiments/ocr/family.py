"""The ocr family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its commands (train, eval,
bench, read), its data and offline default, what ``bench parity`` compares, its fault-tolerance recipe and its
guides' tables."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional, Tuple

from ...families import family
from ..registry import Command, FaultRecipe, LabFamily
from .tables import TABLES
from .targets import COMPARISON
from ..tasks.check import dataset_folder

__all__ = ["FAMILY"]


def _check(args: argparse.Namespace) -> Optional[Tuple[Any, Dict[str, Any]]]:
    """``check-data ocr``: the folder (or the offline default), with the checks train makes with its model: the
    line height and width cap of ``--preset`` (default: the tiny preset)."""
    from ...models import model_config

    cfg = model_config(args.preset or FAMILY.family.tiny)
    return dataset_folder(args, FAMILY), {"height": cfg.height, "max_width": cfg.max_width}


FAMILY = LabFamily(
    family("ocr"),
    commands={
        ("train", "ocr"): Command(
            "train a handwriting recogniser (HTR-VT / HTR-VPoM / hybrid)", "polymixer.experiments.ocr.task:train",
            "Train a CTC text-line recogniser on lines or multi-line pages (default data: synthetic lines rendered "
            "offline; --data DIR for IAM / READ2016 / LAM in HTR-VT's layout or IAM's own)."),
        ("eval", "ocr"): Command(
            "character and word error rates, lines/s, sample lines", "polymixer.experiments.ocr.task:eval",
            "Evaluate a recogniser on a split: CER and WER over the set, throughput, and a PNG of sample lines with "
            "reference and prediction."),
        ("bench", "ocr"): Command(
            "handwriting recognition: lines/s vs page length, quality at equal budget",
            "polymixer.experiments.ocr.bench",
            "Throughput of HTR-VT / HTR-VPoM / hybrid at paper size on lines and pages of 2 to 16 lines, and CER / "
            "WER of the tiny presets trained with equal steps."),
        ("read", ""): Command(
            "transcribe line images with a trained recogniser", "polymixer.experiments.ocr.task:read",
            "Print the greedy CTC transcription of each image (resized like the training lines)."),
    },
    loaders="polymixer.experiments.ocr.data",
    offline_default="polymixer.experiments.ocr.synth",
    default_data="synthetic",
    check=_check,
    comparisons=(COMPARISON,),
    tables=TABLES,
    faults=FaultRecipe(("--batch-size", "4", "--eval-limit", "4")),
)
