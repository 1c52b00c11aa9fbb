"""The recall family's comparison with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`)."""

from __future__ import annotations

from dataclasses import replace

from ..bench.common import ACCURACY_CEILING
from ..bench.comparison import Comparison

__all__ = ["RECALL", "RECALL_ZOOLOGY"]

RECALL = Comparison(
    "recall (MQAR, L 64, K 16)", "recall", "accuracy %", "median", True, "points", "attention", "pom",
    "vpom-16k", hybrids=("hybrid-LV",), where={"seq_len": 64, "pairs": 16, "steps": 2000}, key="variant",
    scale=100, part="state", guide="docs/recall.md", options=("-shift",), shift_options=("-shift",),
    select="val_accuracy", ceiling=ACCURACY_CEILING, seed_folders=False,
    command="polymixer bench recall --parts state --variants {spec} --sweep {spec} --out docs/bench",
)
# the same probe under Zoology's recipe (mixer-only blocks, batch 128, rates 0.3× to 10×: bench recall --zoology),
# in which attention learns MQAR at the equal budget
RECALL_ZOOLOGY = replace(
    RECALL, name="recall, Zoology's recipe (L 64, K 16)", bench="recall_zoology",
    # its speeds: bench recall --zoology --parts speed, in the same file
    file="recall_zoology/recall.json", speed_file="recall_zoology/recall.json",
    command="polymixer bench recall --zoology --parts state --variants {spec} --sweep {spec} "
            "--out docs/bench/recall_zoology", per_state="zoology",
)
