"""The points family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its commands (train, eval,
bench, segment3d), its data and offline default, what ``bench parity`` compares, its fault-tolerance recipe and its
guides' tables."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...families import family
from ..registry import Command, FaultRecipe, LabFamily
from .tables import TABLES
from .targets import COMPARISON
from ..tasks.check import dataset_folder

__all__ = ["FAMILY"]


def _check(args: argparse.Namespace) -> Optional[Tuple[Any, Dict[str, Any]]]:
    """``check-data points``: the folder (or the offline default) in the format ``--format`` names (or detected)."""
    return dataset_folder(args, FAMILY), {"format": args.format}


def _small_rooms(folder: Path) -> List[str]:
    """``bench faults``' data: the default rooms hold 40,000 points each (minutes per run on a CPU); the bench
    trains on 6 rooms of 4,000 points, generated once under ``folder``."""
    from .synth import write_synthetic_rooms

    root = folder / "rooms-4k"
    if not (root / "meta.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        write_synthetic_rooms(root, train=4, val=1, test=1, points=4000, seed=0, progress=False)
    return ["--data", str(root)]


FAMILY = LabFamily(
    family("points"),
    commands={
        ("train", "points"): Command(
            "train a point-cloud segmenter (PTv3 / PPoMv3 / hybrid)", "polymixer.experiments.points.task:train",
            "Train a 3-D semantic segmenter on ScanNet-layout scenes, SemanticKITTI or .ply files (default: "
            "synthetic indoor rooms generated offline in ScanNet's layout)."),
        ("eval", "points"): Command(
            "mIoU, per-class IoU, overall accuracy and 10⁶ points/s of a point-cloud segmenter",
            "polymixer.experiments.points.task:eval",
            "Evaluate a 3-D segmenter on a split as PTv3 does (intersection and union over every original point, "
            "predictions mapped back through the voxels), throughput, and top-view PNGs of scenes."),
        ("bench", "points"): Command(
            "point clouds: 10⁶ points/s vs scene size and patch size, sparse conv, quality at equal budget",
            "polymixer.experiments.points.bench",
            "Throughput of PTv3 / PPoMv3 / hybrid at paper size on scenes of 10k to 160k voxels with patches of "
            "1,024 to the whole scene, the sparse convolution's backward, and mIoU of the tiny presets trained with "
            "equal steps."),
        ("segment3d", ""): Command(
            "segment point clouds with a trained 3-D segmenter", "polymixer.experiments.points.task:segment3d",
            "Write each scene's per-point labels as <name>_labels.npy, a .ply coloured by class and a top-view PNG; "
            "the whole scene in one forward call."),
    },
    loaders="polymixer.experiments.points.data",
    offline_default="polymixer.experiments.points.synth",
    default_data="rooms",
    check=_check,
    comparisons=(COMPARISON,),
    tables=TABLES,
    faults=FaultRecipe(("--batch-size", "2", "--eval-limit", "1"), data=_small_rooms),
)
