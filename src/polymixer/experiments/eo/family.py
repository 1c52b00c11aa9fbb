"""The eo family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its commands (train, eval,
bench, segment), its data and offline default, what ``bench parity`` compares, its fault-tolerance recipe and its
guides' tables."""

from __future__ import annotations

from ...families import family
from ..registry import Command, FaultRecipe, LabFamily
from .tables import TABLES
from .targets import COMPARISON

__all__ = ["FAMILY"]

FAMILY = LabFamily(
    family("eo"),
    commands={
        ("train", "eo"): Command(
            "train a crop-type segmenter of satellite time series (TSViT / TSViPoM / hybrid)",
            "polymixer.experiments.eo.task:train",
            "Train a Sentinel-2 time-series segmenter on PASTIS-layout data (default: a synthetic PASTIS written "
            "offline; --data DIR for PASTIS itself), on 24×24 windows or whole patches."),
        ("eval", "eo"): Command(
            "overall accuracy, per-class IoU, mIoU and km²/s of a crop-type segmenter",
            "polymixer.experiments.eo.task:eval",
            "Evaluate a segmenter on a PASTIS fold's split over every non-void pixel: OA, per-class IoU, mIoU, "
            "throughput in km²/s, a confusion-matrix PNG and a PNG of tiles (RGB, truth, prediction)."),
        ("bench", "eo"): Command(
            "satellite time series: km²/s vs window side, quality at equal budget, whole patches",
            "polymixer.experiments.eo.bench",
            "Throughput of TSViT / TSViPoM / hybrid at paper size on windows of 24 to 128 pixels, and OA / mIoU of "
            "the tiny presets trained with equal steps, evaluated on windows and whole patches."),
        ("segment", ""): Command(
            "segment whole patches of a PASTIS-layout folder with a trained segmenter",
            "polymixer.experiments.eo.task:segment",
            "Write the class map of each patch as <ID>_classes.npy (uint8) and a PNG in the PASTIS colour map; the "
            "whole patch in one forward call by default."),
    },
    loaders="polymixer.experiments.eo.data",
    offline_default="polymixer.experiments.eo.synth",
    default_data="synthetic",
    comparisons=(COMPARISON,),
    tables=TABLES,
    faults=FaultRecipe(("--batch-size", "4", "--eval-limit", "1")),
)
