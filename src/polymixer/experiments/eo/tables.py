"""The eo family's tables in its guides (docs/eo.md: satellite time series), generated from the benches' JSON under
docs/bench by ``python -m polymixer.experiments.guides``: each a function of the docs/bench folder returning the
table's Markdown, registered by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..guides import Row, bench_json, bold, joined, keyed, markdown_table, rate_text, row_runs, seed_rows
from ..registry import Table

__all__ = ["TABLES"]


def eo_throughput(bench: Path) -> str:
    """km² per second of TSViT and TSViPoM by window side, fp32 and bf16 (the largest side is a whole patch)."""
    rows = bench_json(bench, "eo.json")["speed"]["rows"]
    by = keyed(rows, "dtype", "side", "model")
    sides = list(dict.fromkeys((r["side"], r["spatial_tokens"]) for r in rows))
    out = []
    for k, (side, tokens) in enumerate(sides):
        last = k == len(sides) - 1
        cells = [f"{side} × {side} ({tokens:,}{', a whole patch' if last else ''})"]
        for dtype in ("fp32", "bf16"):
            vit, pom = by[(dtype, side, "TSViT")], by[(dtype, side, "TSViPoM")]
            ratio = f"{pom['speedup']:.2f}×"
            cells += [f"{vit['km2_per_s']:.3f}", f"{pom['km2_per_s']:.3f}", f"**{ratio}**" if last else ratio]
        out.append(cells)
    return markdown_table(out, ["window (patch tokens per class)", "TSViT fp32 km²/s", "TSViPoM fp32", "ratio",
                                "TSViT bf16", "TSViPoM bf16", "ratio"])


_EO_CURVES = [("TSViT", "tiny-tsvit"), ("value PoM preset", "tiny-tsvipom-value"),
              ("hybrid, PoM + full temporal attention", "tiny-tsvipom-hybrid"), ("TSViPoM", "tiny-tsvipom")]


def eo_curves(bench: Path) -> str:
    """Test mIoU % of each model at each tenth of a 4,000-step run (``bench eo --parts curves``), the last bold."""
    rows = {r["spec"]: r for r in bench_json(bench, "eo.json")["curves"]["rows"]}
    steps = [p["step"] for p in rows[_EO_CURVES[0][1]]["points"]]
    out = []
    for label, spec in _EO_CURVES:
        values = [f"{100 * p['miou']:.1f}" for p in rows[spec]["points"]]
        out.append([f"{label} ({rate_text(rows[spec]['lr'])})"] + values[:-1] + [bold(values[-1], True)])
    return markdown_table(out, ["model (rate)"] + [str(s) for s in steps])


_SLOW_DATES = "+date_rope=true+date_rope_speed=0.3+date_rope_base=30"


_EO_QUALITY = [Row("TSViT, rotary dates", ("tiny-tsvit+date_rope=true",), True),
               Row("local attention in time + value PoM, slower rotary dates", ("tiny-tsvipom-local" + _SLOW_DATES,),
                    True),
               Row("local attention in time + value PoM, rotary dates", ("tiny-tsvipom-local+date_rope=true",)),
               Row("hybrid (attention in time, PoM in space), rotary dates", ("tiny-tsvipom-hybrid+date_rope=true",)),
               Row("gated value PoM, rotary dates", ("tiny-tsvipom-value+date_rope=true+mixer=gated_value_pom",),
                    True),
               Row("value PoM, slower rotary dates", ("tiny-tsvipom-value" + _SLOW_DATES,)),
               Row("value PoM, rotary dates", ("tiny-tsvipom-value+date_rope=true",)),
               Row("TSViPoM, slower rotary dates", ("tiny-tsvipom" + _SLOW_DATES,)),
               Row("TSViT (published date encoding)", ("tiny-tsvit",)),
               Row("value PoM preset", ("tiny-tsvipom-value",)),
               Row("value PoM with 1 value head and a 2-frame shift",
                    ("tiny-tsvipom-value+value_heads=1+shift_width=2",)),
               Row("hybrid (attention in time, PoM in space)", ("tiny-tsvipom-hybrid",)),
               Row("TSViPoM", ("tiny-tsvipom",))]


def _blocks(pattern: str) -> str:
    """A pattern of mixer letters as the guides write it, temporal blocks first: ``AAPP`` is ``AA · PP``."""
    half = len(pattern) // 2
    return f"{pattern[:half]} · {pattern[half:]}"


def eo_quality(bench: Path) -> str:
    """Test mIoU % on 24 × 24 windows of each model at its best rate by validation mIoU, every seed the JSON holds
    (eo.json, eo_seed1/, eo_seed2/, eo_seed3/), the median of those run on three seeds or more, and seed 0 on whole
    128 × 128 patches."""
    by = seed_rows(bench, ["eo.json", "eo_seed1/eo.json", "eo_seed2/eo.json", "eo_seed3/eo.json"])
    out = []
    for row in _EO_QUALITY:
        runs = row_runs(by, row)
        median = f"{100 * statistics.median(r['miou_24'] for r in runs):.1f}" if len(runs) >= 3 else ""
        out.append([row.label, _blocks(runs[0]["pattern"]), rate_text(runs[0]["lr"]),
                    joined([r["miou_24"] for r in runs], 100, 1), bold(median, row.bold),
                    f"{100 * runs[0]['miou_whole']:.1f}"])
    return markdown_table(out, ["model (form)", "blocks", "rate", "test mIoU, seeds 0 / 1 / 2 / 3", "median",
                                "whole patch (seed 0)"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "eo.curves": Table(eo_curves, ("eo.json",)),
    "eo.throughput": Table(eo_throughput, ("eo.json",)),
    "eo.quality": Table(eo_quality, ("eo.json", "eo_seed1/eo.json", "eo_seed2/eo.json", "eo_seed3/eo.json")),
}
