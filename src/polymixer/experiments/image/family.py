"""The image family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its commands (train, eval,
bench, sample), its data, what ``bench parity`` compares, its fault-tolerance recipe and its guides' tables."""

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
    """``check-data image``: the folder given; the default (scikit-learn's digits) has no files to check."""
    if not args.data:
        print("image: the default (scikit-learn's digits) is bundled with scikit-learn: nothing to check")
        return None
    return dataset_folder(args, FAMILY), {}


FAMILY = LabFamily(
    family("image"),
    commands={
        ("train", "image"): Command(
            "train a class-conditional diffusion transformer (SiT / SiPoM / DiT / DiPoM)",
            "polymixer.experiments.image.task:train",
            "Train an image generator with flow matching or DDPM (default data: scikit-learn's digits)."),
        ("eval", "image"): Command(
            "conditional accuracy and Fréchet distance of generated images", "polymixer.experiments.image.task:eval",
            "Score generated images with a small classifier trained once on the real data."),
        ("bench", "image"): Command(
            "diffusion transformers: seconds per image vs image side, quality at equal budget",
            "polymixer.experiments.image.bench",
            "Forward time of SiT vs SiPoM across image sizes, and SiT vs SiPoM trained with equal steps."),
        ("sample", ""): Command(
            "sample an image grid from a trained generator", "polymixer.experiments.image.task:sample",
            "Class-conditional samples with classifier-free guidance, written as a PNG grid."),
    },
    loaders="polymixer.experiments.image.data",
    default_data="digits",
    check=_check,
    comparisons=(COMPARISON,),
    tables=TABLES,
    faults=FaultRecipe(("--image-size", "8", "--batch-size", "16", "--eval-samples", "0", "--ema", "0.99")),
)
