"""The ocr family's tables in its guides (docs/ocr.md: handwriting recognition), generated from the benches' JSON under
docs/bench by ``python -m polymixer.experiments.guides``: each a function of the docs/bench folder returning the
table's Markdown, registered by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..guides import Row, bench_json, bold, joined, keyed, markdown_table, rate_text, row_runs, seed_rows
from ..registry import Table

__all__ = ["TABLES"]


def ocr_throughput(bench: Path) -> str:
    """Lines per second of HTR-VT, HTR-VPoM and the hybrid by lines per image, fp32 and bf16."""
    rows = bench_json(bench, "ocr.json")["speed"]["rows"]
    by = keyed(rows, "dtype", "lines", "model")
    sizes = list(dict.fromkeys((r["lines"], r["tokens"]) for r in rows))
    out = []
    for k, (lines, tokens) in enumerate(sizes):
        vt32, pom32 = by[("fp32", lines, "HTR-VT")], by[("fp32", lines, "HTR-VPoM")]
        vt16, pom16 = by[("bf16", lines, "HTR-VT")], by[("bf16", lines, "HTR-VPoM")]
        ratio16 = f"{pom16['speedup']:.2f}×"
        out.append([f"{lines} ({tokens:,})", f"{vt32['lines_per_s']:#.3g}", f"{pom32['lines_per_s']:#.3g}",
                    f"{pom32['speedup']:.2f}×", f"{vt16['lines_per_s']:#.3g}", f"{pom16['lines_per_s']:#.3g}",
                    f"**{ratio16}**" if k == len(sizes) - 1 else ratio16,
                    f"{by[('bf16', lines, 'HTR-VPoM Hybrid')]['speedup']:.2f}×"])
    return markdown_table(out, ["lines per image (tokens)", "HTR-VT fp32 lines/s", "HTR-VPoM", "ratio",
                                "HTR-VT bf16 lines/s", "HTR-VPoM", "ratio", "hybrid bf16 ratio"])


_OCR_QUALITY = [Row("HTR-VT (`tiny-htr-vt`)", ("tiny HTR-VT",), True),
                Row("HTR-VPoM (`tiny-htr-vpom`)", ("tiny HTR-VPoM",), True),
                Row("value PoM (`tiny-htr-vpom-value`)", ("tiny HTR-VPoM value",)),
                Row("hybrid (`tiny-htr-vpom-hybrid`)", ("tiny hybrid",)),
                Row("hybrid with the token shift", ("tiny hybrid (attention_shift=2)",), gap=False),
                Row("HTR-VT with the token shift", ("tiny HTR-VT (attention_shift=2)",), gap=False)]


def ocr_quality(bench: Path) -> str:
    """Validation and test CER % on the synthetic lines, each model at its best rate by validation CER, seeds
    0 / 1 / 2 (ocr.json, ocr_seed1/, ocr_seed2/), and the test CER's gap to HTR-VT's median."""
    by = {k: [r for r in v if r["task"] == "synthetic"] for k, v in seed_rows(
        bench, ["ocr.json", "ocr_seed1/ocr.json", "ocr_seed2/ocr.json"]).items()}
    figure = {row.keys[0]: statistics.median(r["cer"] for r in row_runs(by, row)) for row in _OCR_QUALITY}
    reference = figure[_OCR_QUALITY[0].keys[0]]
    out = []
    for k, row in enumerate(_OCR_QUALITY):
        runs = row_runs(by, row)
        median = f"{100 * figure[row.keys[0]]:.2f}" if len(runs) == 3 else ""
        gap = "—" if k == 0 else f"{figure[row.keys[0]] / reference - 1:+.1%}".replace("-", "−") if row.gap else ""
        out.append([row.label, f"{rate_text(runs[0]['lr'])} ({runs[0]['rates']})", joined([r["val_cer"] for r in runs],
                    100, 2), joined([r["cer"] for r in runs], 100, 2), bold(median, row.bold),
                    bold(gap, row.bold and k > 0)])
    return markdown_table(out, ["model", "best rate (rates tried)", "validation CER, seeds 0 / 1 / 2",
                                "test CER, seeds 0 / 1 / 2", "median", "÷ HTR-VT"])


# task: its label and what one training step holds (pages start from the single-line weights)
_OCR_TASKS = {"synthetic": ("synthetic lines", "{:,} × {} lines"),
              "synthetic-multiline": ("synthetic pages of 4–16 lines", "+ {:,} × {} pages"),
              "digits": ("handwritten digit lines", "{:,} × {} lines")}


_OCR_RECIPE_MODELS = ["tiny HTR-VT", "tiny hybrid", "tiny HTR-VPoM"]


def ocr_recipe(bench: Path) -> str:
    """CER and WER of HTR-VT, the hybrid and HTR-VPoM on the three tasks at the recipe's rate (1e-3, seed 0), the CER
    relative to HTR-VT's in brackets."""
    rows = [r for r in bench_json(bench, "ocr.json")["quality"]["rows"] if r["lr"] == 1e-3]
    out = []
    for task, (label, steps) in _OCR_TASKS.items():
        runs = [next(r for r in rows if r["task"] == task and r["model"] == m) for m in _OCR_RECIPE_MODELS]
        vt = runs[0]["cer"]
        cells = [f"**{vt:.2%}** / {runs[0]['wer']:.1%}"]
        cells += [f"{r['cer']:.2%} ({r['cer'] / vt - 1:+.1%}) / {r['wer']:.1%}".replace("(-", "(−") for r in runs[1:]]
        out.append([f"{label} ({runs[0]['test_lines']:,} test lines)", steps.format(runs[0]["steps"],
                    runs[0]["batch"])] + cells)
    return markdown_table(out, ["task", "steps × batch", "tiny HTR-VT CER / WER", "tiny hybrid", "tiny HTR-VPoM"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "ocr.throughput": Table(ocr_throughput, ("ocr.json",)),
    "ocr.quality": Table(ocr_quality, ("ocr.json", "ocr_seed1/ocr.json", "ocr_seed2/ocr.json")),
    "ocr.recipe": Table(ocr_recipe, ("ocr.json",)),
}
