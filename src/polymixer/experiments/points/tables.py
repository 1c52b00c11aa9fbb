"""The points family's tables in its guides (docs/points.md: point clouds), generated from the benches' JSON under
docs/bench by ``python -m polymixer.experiments.guides``: each a function of the docs/bench folder returning the
table's Markdown, registered by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..guides import Row, bench_json, bold, joined, markdown_table, rate_text, row_runs, seed_rows
from ..registry import Table

__all__ = ["TABLES"]


def points_throughput(bench: Path) -> str:
    """Seconds per call and 10⁶ points per second of PTv3, PPoMv3 and the hybrid, by room size and context."""
    rows = bench_json(bench, "points.json")["speed"]["rows"]
    return markdown_table([[r["voxels"], r["model"], r["attn_patch"], r["pom_patch"], r["s_per_call"],
                            r["mpts_per_s"], r["speedup"]] for r in rows],
                          ["voxels", "model", "attention patch", "PoM context", "s / call", "10⁶ pts/s", "speedup"])


_POINTS_QUALITY = [Row("PTv3 with the token shift (`+attention_shift=2`)", ("tiny-ptv3+attention_shift=2",), True),
                   Row("PTv3", ("tiny-ptv3",)),
                   Row("value PoM (`tiny-ppomv3-value`)", ("tiny-ppomv3-value",), True),
                   Row("PPoMv3, PoM patches of 1,024", ("tiny-ppomv3+pom_patch_size=1024",)),
                   Row("PPoMv3, patches of 4,096 / the whole scene", ("tiny-ppomv3+pom_patch_size=4096",
                                                                     "tiny-ppomv3+pom_patch_size=scene")),
                   Row("PPoMv3 (preset: patches of 256)", ("tiny-ppomv3",)),
                   Row("hybrid with the token shift", ("tiny-ppomv3-hybrid+attention_shift=2",)),
                   Row("hybrid (preset)", ("tiny-ppomv3-hybrid",))]


def points_quality(bench: Path) -> str:
    """Test mIoU % of each model at its best rate by validation mIoU, seeds 0 / 1 / 2 (points.json, points_seed1/,
    points_seed2/), with the median of those run on three seeds."""
    by = seed_rows(bench, ["points.json", "points_seed1/points.json", "points_seed2/points.json"])
    out = []
    for row in _POINTS_QUALITY:
        runs = row_runs(by, row)
        median = f"{100 * statistics.median(r['miou'] for r in runs):.1f}" if len(runs) == 3 else ""
        out.append([row.label, f"{runs[0]['params']:,}", f"{rate_text(runs[0]['lr'])} ({runs[0]['rates']})",
                    joined([r["miou"] for r in runs], 100, 1), bold(median, row.bold),
                    joined([r.get("val_miou") for r in runs], 100, 1)])
    return markdown_table(out, ["model", "params", "best rate (rates tried)", "test mIoU, seeds 0 / 1 / 2", "median",
                                "validation, seeds 0 / 1 / 2"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "points.quality": Table(points_quality, ("points.json", "points_seed1/points.json", "points_seed2/points.json")),
    "points.throughput": Table(points_throughput, ("points.json",)),
}
