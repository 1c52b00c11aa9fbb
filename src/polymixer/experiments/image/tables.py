"""The image family's tables in its guides (docs/image.md: the diffusion transformers), generated from the benches' JSON
under docs/bench by ``python -m polymixer.experiments.guides``: each a function of the docs/bench folder returning
the table's Markdown, registered by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List, Sequence

from ..guides import Row, bench_json, bold, joined, markdown_table, rate_text, row_runs, seed_rows
from ..registry import Table
from ..report import format_table

__all__ = ["TABLES"]


def image_throughput(bench: Path) -> str:
    """Seconds per image of SiT and SiPoM by image side (``bench image --parts speed``)."""
    rows = bench_json(bench, "image.json")["speed"]["rows"]
    return format_table(rows, ["side", "tokens", "batch", "model", "s_per_image", "sit_over_sipom"],
                        ["side", "tokens", "batch", "model", "s / image", "SiT ÷ SiPoM"])


def image_recipe(bench: Path) -> str:
    """SiT against SiPoM at the recipe's rate (1e-3), flow and DDPM, 1,200 steps (image.json) and 2,400
    (ddpm2400/image.json)."""
    rows = [r for name in ("image.json", "ddpm2400/image.json") for r in bench_json(bench, name)["quality"]["rows"]
            if r["model"] in ("tiny-sit", "tiny-sipom") and r.get("lr", 1e-3) == 1e-3]
    return markdown_table([[r["model"], r["objective"], r["params"], r["steps"], r["cond_accuracy"],
                            r["classifier_accuracy"], r["fd"], r["fd_real_floor"], r["train_min"]] for r in rows],
                          ["model", "objective", "params", "steps", "cond. accuracy", "classifier acc.",
                           "Fréchet dist.", "real-vs-real", "train min"])


_IMAGE_HELDOUT = [Row("`tiny-sit+attention_shift=2`", ("tiny-sit+attention_shift=2",), True),
                  Row("`tiny-sit`", ("tiny-sit",)),
                  Row("`tiny-sit+position=sincos_rope`", ("tiny-sit+position=sincos_rope",)),
                  Row("`tiny-sit+position=sincos_rope+attention_shift=2`",
                       ("tiny-sit+position=sincos_rope+attention_shift=2",)),
                  Row("`tiny-sipom-value+position=sincos_rope`", ("tiny-sipom-value+position=sincos_rope",), True),
                  Row("`tiny-sipom-value+position=sincos_rope+mixer=gated_value_pom`",
                       ("tiny-sipom-value+position=sincos_rope+mixer=gated_value_pom",)),
                  Row("`tiny-sipom-value`", ("tiny-sipom-value",)),
                  Row("`tiny-sipom-vhybrid+attention_shift=2`", ("tiny-sipom-vhybrid+attention_shift=2",)),
                  Row("`tiny-sipom-vhybrid`", ("tiny-sipom-vhybrid",)),
                  Row("`tiny-sipom`", ("tiny-sipom",))]


def image_heldout(bench: Path) -> str:
    """Validation and reported FD of each model form at its best rate by validation FD (``--heldout 0.15``), seeds
    0 / 1 / 2 (image_heldout/, its image_seed1/ and image_seed2/)."""
    by = seed_rows(bench, ["image_heldout/image.json", "image_heldout/image_seed1/image.json",
                            "image_heldout/image_seed2/image.json"])
    out = []
    for row in _IMAGE_HELDOUT:
        runs = row_runs(by, row)
        median = f"{statistics.median(r['fd'] for r in runs):.1f}" if len(runs) == 3 else ""
        out.append([row.label, f"{rate_text(runs[0]['lr'])} ({runs[0]['rates']})", joined([r["fd_val"] for r in runs],
                    1, 1), joined([r["fd"] for r in runs], 1, 1), bold(median, row.bold)])
    return markdown_table(out, ["model form", "best rate (rates tried)", "validation FD, seeds 0 / 1 / 2",
                                "reported FD, seeds 0 / 1 / 2", "median"])


# label, model form, the SiT form its median is divided by (the same positions)
_IMAGE_EVERY_DIGIT = [("SiT (`tiny-sit`)", "tiny-sit", ""),
                      ("SiT, `position=sincos_rope`", "tiny-sit+position=sincos_rope", ""),
                      ("value PoM (`tiny-sipom-value`)", "tiny-sipom-value", "tiny-sit"),
                      ("value PoM, `position=sincos_rope`", "tiny-sipom-value+position=sincos_rope",
                       "tiny-sit+position=sincos_rope"),
                      ("SiPoM (`tiny-sipom`)", "tiny-sipom", "tiny-sit")]


def _rates_tried(lrs: Sequence[float]) -> str:
    """The rates of a sweep (a grid of ×2 steps): its ends and how many, or the one rate."""
    lrs = sorted(lrs)
    return rate_text(lrs[0]) if len(lrs) == 1 else f"{rate_text(lrs[0])} … {rate_text(lrs[-1])} ({len(lrs)})"


def image_every_digit(bench: Path) -> str:
    """FD of each model form trained on every digit (flow; no held-out split, so the best rate is the one with the
    lowest reported FD): every rate of seed 0 (image.json), the best rate's seeds 0 / 1 / 2 (image_seed1/,
    image_seed2/), their median, and that median against SiT's with the same positions."""
    sweep: Dict[str, List[Dict[str, Any]]] = {}
    for r in bench_json(bench, "image.json")["quality"]["rows"]:
        if r["objective"] == "flow":
            sweep.setdefault(r["model"], []).append(r)
    seeds = {m: [next(r for r in runs if r["best_lr"])] for m, runs in sweep.items()}
    for name in ("image_seed1/image.json", "image_seed2/image.json"):
        for r in bench_json(bench, name)["quality"]["rows"]:
            if r["best_lr"] and r["objective"] == "flow":
                seeds[r["model"]].append(r)
    medians = {m: statistics.median(r["fd"] for r in runs) for m, runs in seeds.items() if len(runs) >= 3}
    out = []
    for label, model, reference in _IMAGE_EVERY_DIGIT:
        runs = sorted(sweep[model], key=lambda r: r["lr"])
        by_rate = " / ".join(bold(f"{r['fd']:.1f}", r["best_lr"] and len(runs) > 1) for r in runs)
        median = medians.get(model)
        ratio = f"{median / medians[reference]:.2f}×" if median and reference in medians else ""
        out.append([label, _rates_tried([r["lr"] for r in runs]), by_rate, joined([r["fd"] for r in seeds[model]],
                    1, 1), f"{median:.1f}" if median else "", ratio or ("—" if median else "")])
    return markdown_table(out, ["model form", "rates tried (×2 steps)", "FD by rate, seed 0",
                                "at its best rate, seeds 0 / 1 / 2", "median", "÷ SiT (same positions)"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "image.throughput": Table(image_throughput, ("image.json",)),
    "image.recipe": Table(image_recipe, ("image.json", "ddpm2400/image.json")),
    "image.heldout": Table(image_heldout, ("image_heldout/image.json", "image_heldout/image_seed1/image.json",
                                           "image_heldout/image_seed2/image.json")),
    "image.every_digit": Table(image_every_digit, ("image.json", "image_seed1/image.json", "image_seed2/image.json")),
}
