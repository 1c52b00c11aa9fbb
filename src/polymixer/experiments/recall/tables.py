"""The recall family's tables in its guides (docs/recall.md: MQAR recall), generated from the benches' JSON under
docs/bench by ``python -m polymixer.experiments.guides``: each a function of the docs/bench folder returning the
table's Markdown, registered by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence

from ..guides import Row, bench_json, bold, markdown_table, rate_text
from ..registry import Table

__all__ = ["TABLES"]


_RECALL_STATE = [Row("attention, no shift", ("attention",), True),
                 Row("attention with the shift", ("attention-shift",), True),
                 Row("value PoM, 16k state (`vpom-16k`)", ("vpom-16k",), True),
                 Row("hybrid: local attention (window 16) then value PoM, shift in both (`hybrid-LV-shift`)",
                      ("hybrid-LV-shift",)),
                 Row("hybrid, shift in the value PoM only (`hybrid-LV`)", ("hybrid-LV",)),
                 Row("PoM (`pom`)", ("pom",))]


def recall_state(bench: Path) -> str:
    """MQAR accuracy at L 64, K 16 on Zoology's recipe (recall_zoology/recall.json), each mixer at its best rate,
    median and range over 3 seeds, and the same model's forward speed ÷ attention's (its speed part, this CPU)."""
    data = bench_json(bench, "recall_zoology/recall.json")
    rows = {r["variant"]: r for r in data["state"]["rows"] if r.get("best_lr")}
    speed = {r["variant"]: r["vs_attention"] for r in data.get("speed", {}).get("rows", [])}
    out = []
    for row in _RECALL_STATE:
        r = rows[row.keys[0]]
        timed = speed.get(row.keys[0])
        out.append([row.label, f"{r['state_floats']:,}", rate_text(r["lr"]), bold(f"{r['median']:.4f}", row.bold),
                    f"{r['low']:.4f} – {r['high']:.4f}", "not measured" if timed is None else f"{timed:.2f}×"])
    return markdown_table(out, ["mixer", "state floats / layer", "best lr", "accuracy (median, 3 seeds)",
                                "min – max", "speed ÷ attention (CPU)"])


_RECALL_ZOOLOGY = ["attention", "attention-shift", "vpom-1k", "vpom-4k", "vpom-16k", "based-1k", "based-4k",
                   "based-16k", "linear-1k", "linear-4k", "linear-16k", "pom-shift", "pom", "vpom-noshift-1k",
                   "vpom-noshift-4k", "vpom-noshift-16k", "based-noshift-1k", "based-noshift-4k", "based-noshift-16k",
                   "linear-noshift-1k", "linear-noshift-4k", "linear-noshift-16k"]


def recall_zoology(bench: Path) -> str:
    """Each variant's median MQAR accuracy (its best rate in brackets) at L 64 / 128 / 256 on Zoology's recipe."""
    by: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for r in bench_json(bench, "recall_zoology/recall.json")["zoology"]["rows"]:
        if r.get("best_lr"):
            by.setdefault(r["variant"], {})[r["seq_len"]] = r
    out = []
    for variant in _RECALL_ZOOLOGY:
        points = [by[variant][n] for n in sorted(by[variant])]
        states = list(dict.fromkeys(str(r["state_floats"]) for r in points))
        out.append([f"`{variant}`", points[0]["family"], " / ".join(states)]
                   + [f"{r['median']:.4f} ({r['lr']:g})" for r in points])
    return markdown_table(out, ["variant", "mixer", "state floats / layer", "L 64", "L 128", "L 256"])


_RECALL_MIXTURE = ["vpom-1k", "based-1k", "vpom-4k", "based-4k", "vpom-16k", "based-16k"]


def recall_mixture(bench: Path) -> str:
    """Test accuracy of the value PoM and Based trained on Zoology's mixture, at each rate run (seed 0) and each
    point of figure 2; bold: the rate validation picks at that point, where there are several."""
    by: Dict[str, List[Dict[str, Any]]] = {}
    for r in bench_json(bench, "recall_mixture/recall.json")["zoology"]["rows"]:
        by.setdefault(r["variant"], []).append(r)
    out = []
    for variant in _RECALL_MIXTURE:
        runs = by[variant]
        lrs = sorted({r["lr"] for r in runs})
        cells = [f"{runs[0]['family']} ({runs[0]['state_floats']:,})", " / ".join(rate_text(lr) for lr in lrs)]
        for n in (64, 128, 256):
            at = sorted((r for r in runs if r["seq_len"] == n), key=lambda r: r["lr"])
            cells.append(" / ".join(bold(f"{r['median']:.3f}", r["best_lr"] and len(at) > 1) for r in at))
        out.append(cells)
    return markdown_table(out, ["mixer (state floats / layer)", "rate", "L 64, K 16", "L 128, K 32", "L 256, K 64"])


# label and the runs a row shows: (part of recall.json, variant, training steps), each at its best rate
_RECALL_RECIPE = [("attention, no shift", [("state", "attention", 2000)]),
                  ("attention, no shift, 8,000 / 16,000 / 32,000 steps",
                   [("state", "attention", s) for s in (8000, 16000, 32000)]),
                  ("attention with the shift", [("state", "attention-shift", 2000)]),
                  ("value PoM 1k / 4k / 16k", [("state", f"vpom-{k}", 2000) for k in ("1k", "4k", "16k")]),
                  ("Based 1k / 4k / 16k", [("state", f"based-{k}", 2000) for k in ("1k", "4k", "16k")]),
                  ("Based, no shift, 16k", [("state", "based-noshift-16k", 2000)]),
                  ("hybrid-LV / hybrid-LV-shift", [("state", "hybrid-LV", 2000), ("state", "hybrid-LV-shift", 2000)]),
                  ("PoM", [("state", "pom", 2000)]),
                  ("value PoM 16k, L 256, K 64", [("length", "vpom-16k", 2000)])]


def _once(values: Sequence[str]) -> str:
    """Values joined with " / ", or the one value when they are all the same."""
    return values[0] if len(set(values)) == 1 else " / ".join(values)


def recall_recipe(bench: Path) -> str:
    """The summary of ``bench recall`` under its own recipe (recall.json): each variant's median accuracy at its best
    rate, with its state, its rate (and how many were tried, where that is the same for every run of the row) and
    how many seeds the median is over."""
    payload = bench_json(bench, "recall.json")
    best = {(part, r["variant"], r["steps"]): r for part in ("state", "length") for r in payload[part]["rows"]
            if r.get("best_lr")}
    out = []
    for label, keys in _RECALL_RECIPE:
        runs = [best[k] for k in keys]
        tried = {r["rates"] for r in runs}
        rate = _once([rate_text(r["lr"]) for r in runs]) + (f" ({tried.pop()})" if len(tried) == 1 else "")
        out.append([label, _once([f"{r['state_floats']:,}" for r in runs]), rate,
                    " / ".join(f"{r['median']:.4f}" for r in runs), _once([str(r["seeds"]) for r in runs])])
    return markdown_table(out, ["variant", "state floats / layer", "best lr (rates tried)", "accuracy (median)",
                                "seeds"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "recall.state": Table(recall_state, ("recall_zoology/recall.json",)),
    "recall.zoology": Table(recall_zoology, ("recall_zoology/recall.json",)),
    "recall.mixture": Table(recall_mixture, ("recall_mixture/recall.json",)),
    "recall.recipe": Table(recall_recipe, ("recall.json",)),
}
