"""The points family's comparison with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`)."""

from __future__ import annotations

from ..bench.comparison import Comparison

__all__ = ["COMPARISON"]

COMPARISON = Comparison(
    "point clouds", "points", "test mIoU %", "miou", True, "points", "tiny-ptv3", "tiny-ppomv3",
    "tiny-ppomv3-value", hybrids=("tiny-ppomv3-hybrid",), scale=100, best_target=-1.0, guide="docs/points.md",
    options=("+attention_shift=2",), shift_options=("+attention_shift=2",), select="val_miou",
    tuned=("pom_patch_size",),
    # the paper's own models at the paper's tolerance: does its claim reproduce here
    paper_targets=(("tiny-ppomv3", -2.0), ("tiny-ppomv3-hybrid", -2.0)),
    # the compared forms timed as themselves at PTv3's size on scenes of 160,000 voxels, beside the presets
    speed_file="points_forms/points.json",
    command="polymixer bench points --parts quality --quality-models {spec} --sweep {spec} "
            "--lr-factors 0.25 0.5 1 2 --out docs/bench",
    paper=(("PTv3 on ScanNet, mIoU %",), {"tiny-ptv3": (76.7,), "tiny-ppomv3": (75.9,), "tiny-ppomv3-hybrid": (76.8,)}),
    trained_on="synthetic ScanNet-like rooms",
)
