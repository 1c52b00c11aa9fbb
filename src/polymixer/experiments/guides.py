"""The guides' result tables (docs/*.md), generated from the benches' JSON under docs/bench.

Each table a guide shows from a bench's results sits between two markers::

    <!-- table:lm.throughput (generated from docs/bench/lm.json: python -m polymixer.experiments.guides) -->
    | N | B | model | … |
    <!-- /table -->

``python -m polymixer.experiments.guides`` rewrites every marked table from :data:`TABLES`, the registry of named
generators (each reads the JSON under a docs/bench folder and returns the table's text); ``--check`` rewrites
nothing and exits 1 naming each stale table, so a figure typed by hand, or a bench rerun without regenerating, fails
``tests/test_guides.py``. Tables that are not results (options, presets, formats, commands) stay hand-written.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .bench import faults as faults_bench
from .bench import parallel as parallel_bench
from .bench import parity as parity_bench
from .bench import roofline as roofline_bench
from .bench import traffic as traffic_bench
from .bench.common import same_rate
from .report import format_cell, format_table

__all__ = ["Table", "TABLES", "SOURCES", "Marked", "markdown_table", "marker", "find_markers", "update_guide",
           "guides_in", "update_guides", "main"]

COMMAND = "python -m polymixer.experiments.guides"
BEGIN = re.compile(r"^<!-- table:(?P<name>\S+) \(generated from (?P<source>[^:]*): [^)]*\) -->$")
END = "<!-- /table -->"


def _read(bench: Path, name: str) -> Dict[str, Any]:
    return json.loads((bench / name).read_text())


def markdown_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain (unaligned) Markdown table, cells written as :func:`format_table` writes them (an empty string
    stays an empty cell, ``None`` is a dash)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    cells = [[format_cell(c) for c in row] for row in rows]
    lines += ["|" + "|".join(f" {c} " if c else " " for c in row) + "|" for row in cells]
    return "\n".join(lines)


# --- language model (docs/lm.md, docs/hf.md) -------------------------------------------------------------------

def lm_throughput(bench: Path) -> str:
    """Forward throughput of every timed model (``bench lm --parts throughput``; a kind with options is that form)
    at each length for a fixed token budget: thousand tokens/s and, in brackets, ÷ attention's; one row a model."""
    part = _read(bench, "lm.json")["throughput"]
    rows, params = part["rows"], part.get("params", {})
    lengths = sorted({r["N"] for r in rows})
    batch = {r["N"]: r["batch"] for r in rows}
    at = {(r["model"], r["N"]): r for r in rows}
    out = [[f"`{m}`", f"{params[m]:,}" if m in params else ""]
           + [f"{at[m, n]['ktok_s']:.3g} ({at[m, n]['vs_attention']:.2f}×)" if (m, n) in at else "" for n in lengths]
           for m in dict.fromkeys(r["model"] for r in rows)]
    return markdown_table(out, ["model (`--kinds`)", "params", *(f"N {n:,} (batch {batch[n]})" for n in lengths)])


def lm_decode(bench: Path) -> str:
    """Per-token decoding time and state size after a prefilled context."""
    rows = _read(bench, "lm.json")["decode"]["rows"]
    return format_table(rows, ["context", "model", "ms_per_token", "vs_first_context", "state_mb", "prefill_s"],
                        ["context", "model", "ms / token", "÷ first context", "state MB", "prefill s"])


def hf_decode(bench: Path) -> str:
    """The same decoding through transformers' ``generate()`` loop and the ``PolymixerCache``."""
    rows = _read(bench, "lm.json")["hf_decode"]["rows"]
    return format_table(rows, ["context", "model", "ms_per_token", "vs_first_context", "state_mb"],
                        ["context", "model", "ms / token", "÷ first context", "state MB"])


def hf_distill(bench: Path) -> str:
    """The teacher and every student of ``bench distill`` (distilled, fine-tuned only, from scratch)."""
    rows = _read(bench, "distill.json")["quality"]["rows"]
    precise = {"after_stage1": 4, "val_loss": 4, "val_bpb": 4, "vs_teacher": 4, "train_min": 1}
    shown = [{k: f"{v:.{precise[k]}f}" if k in precise and isinstance(v, float) else v for k, v in r.items()}
             for r in rows]
    return format_table(shown, ["model", "method", "params", "steps", "tokens", "after_stage1", "val_loss",
                                "val_bpb", "vs_teacher", "train_min"],
                        ["student", "method", "params", "steps", "tokens", "loss after stage 1", "val loss",
                         "val bpb", "÷ teacher", "train min"])



def _rate(lr: float) -> str:
    """A learning rate as the guides write it: 4e-3, 1.6e-2."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _bold(text: str, bold: bool) -> str:
    return f"**{text}**" if bold and text else text


def _seed_rows(bench: Path, files: Sequence[str], part: str = "quality") -> Dict[str, List[Dict[str, Any]]]:
    """Each spec's run at its chosen rate in each seed's JSON, by spec: seed 0's best-rate row (the rate its sweep
    chose on validation; seed 0's file first), then each other seed's row of that spec (and task / objective) at that
    same rate — the other seeds run at the chosen rate only, as ``bench parity`` reads them; a row of a seed folder
    at another rate (left from an earlier choice) is not the model's figure."""
    by: Dict[str, List[Dict[str, Any]]] = {}
    chosen: Dict[Tuple[Any, ...], Any] = {}
    for k, name in enumerate(files):
        for r in _read(bench, name)[part]["rows"]:
            key = (r.get("spec") or r["model"], r.get("task"), r.get("objective"))
            if k == 0 and r.get("best_lr"):
                chosen[key] = r.get("lr")
            elif k == 0 or key not in chosen or not _at_rate(r.get("lr"), chosen[key]):
                continue
            by.setdefault(key[0], []).append(r)
    return by


def _at_rate(lr: Optional[float], chosen: Optional[float]) -> bool:
    """``same_rate``, where a row from before sweeps has no rate (None) on either side."""
    return lr == chosen or (lr is not None and chosen is not None and same_rate(lr, chosen))


# the language-model rows the guide compares: label, spec, whether its median and gap are bold (the parity picks)
_LM_QUALITY = [("attention + shift", "tiny-attention+attention_shift=4", True),
               ("PoM + local attention, + shift", "tiny-hybrid+attention_shift=4", True),
               ("value PoM + local attention, + shift", "tiny-vhybrid+attention_shift=4", False),
               ("gated value PoM", "tiny-vpom+mixer=gated_value_pom", True),
               ("attention", "tiny-attention", False),
               ("value PoM + local attention", "tiny-vhybrid", False),
               ("value PoM", "tiny-vpom", False),
               ("PoM + local attention", "tiny-hybrid", False),
               ("PoM", "tiny-pom", False)]


def lm_quality(bench: Path) -> str:
    """Validation loss of each model at its best rate, seeds 0 / 1 / 2 (lm.json, lm_seed1/, lm_seed2/), the median
    of those run on three seeds against attention with the token shift."""
    by = _seed_rows(bench, ["lm.json", "lm_seed1/lm.json", "lm_seed2/lm.json"])
    reference = statistics.median(r["val_loss"] for r in by[_LM_QUALITY[0][1]])
    rows = []
    for label, spec, bold in _LM_QUALITY:
        runs = by[spec]
        losses = [r["val_loss"] for r in runs]
        median = statistics.median(losses) if len(runs) > 1 else None
        gap = ("—" if spec == _LM_QUALITY[0][1] else f"{median / reference - 1:+.1%}") if median else ""
        rows.append([f"{label} (`{spec}`)", f"{runs[0]['params']:,}", f"{_rate(runs[0]['lr'])} ({runs[0]['rates']})",
                     " / ".join(f"{v:.4f}" for v in losses), _bold(f"{median:.4f}" if median else "", bold),
                     _bold(gap, bold and gap != "—")])
    return markdown_table(rows, ["model", "params", "rate (rates tried)", "seeds 0 / 1 / 2", "median",
                                 "vs attention + shift"])


def lm_prose(bench: Path) -> str:
    """The LM at the paper's proportions (lm_prose/lm.json: context 1,024 on English prose): each model's validation
    loss at every rate it ran on seed 0 (its best bold) and its best against the best of attention's forms (with or
    without the shift) at the same size — smaller models first, attention's forms first within a size."""
    rows = _read(bench, "lm_prose/lm.json")["quality"]["rows"]
    made_larger = {r["spec"] for r in rows if "smaller" in r}  # the bench names a larger model's smaller one

    def larger(spec: str) -> bool:
        return spec in made_larger

    def attention(spec: str) -> bool:
        return spec.startswith("tiny-attention")

    specs = sorted(dict.fromkeys(r["spec"] for r in rows), key=lambda s: (larger(s), not attention(s), s))
    rates = sorted({r["lr"] for r in rows})
    best = {s: min((r for r in rows if r["spec"] == s), key=lambda r: r["val_loss"]) for s in specs}
    out = []
    for spec in specs:
        bases = [b for b in specs if attention(b) and larger(b) == larger(spec)]
        base = min(bases, key=lambda b: best[b]["val_loss"]) if bases else None
        gap = best[spec]["val_loss"] / best[base]["val_loss"] - 1 if base and base != spec else None
        at = {r["lr"]: r["val_loss"] for r in rows if r["spec"] == spec}
        along = _gaps_along(best[spec], best[base]) if gap is not None else ""
        out.append([f"`{spec}`", f"{best[spec]['params']:,}"]
                   + [_bold(f"{at[lr]:.4f}", lr == best[spec]["lr"]) if lr in at else "" for lr in rates]
                   + ["— (the reference)" if base == spec else "" if gap is None else f"{gap:+.1%}", along])
    return markdown_table(out, ["model", "params", *(f"{_rate(lr)}" for lr in rates),
                                "best vs attention's best form", "training loss vs it at ¼ · ½ · ¾ · end"])


def _gaps_along(row: Dict[str, Any], base: Dict[str, Any]) -> str:
    """A run's training loss against the reference run's at the logged steps nearest a quarter, half, three
    quarters and the end of training (both rows' ``train_curve``): whether a gap closes or opens as they train;
    "—" where either row predates the curve."""
    mine, ref = dict(map(tuple, row.get("train_curve", []))), dict(map(tuple, base.get("train_curve", [])))
    steps = sorted(set(mine) & set(ref))
    if not steps:
        return "—"
    picks = [min(steps, key=lambda s: abs(s - f * steps[-1])) for f in (0.25, 0.5, 0.75, 1.0)]
    return " · ".join(f"{mine[s] / ref[s] - 1:+.1%}" for s in picks)


_LM_LAYOUT = [("1 head, 2-token shift", "tiny-vpom+value_heads=1+shift_width=2"),
              ("8 heads, 2-token shift", "tiny-vpom+value_heads=8+shift_width=2"),
              ("4 heads, 2-token shift", "tiny-vpom+value_heads=4+shift_width=2"),
              ("4 heads, 4-token shift (the preset)", "tiny-vpom")]


def lm_layout(bench: Path) -> str:
    """The value-PoM preset's layout: variants of ``tiny-vpom`` at 4e-3, seed 0, against attention at its best."""
    rows = _read(bench, "lm.json")["quality"]["rows"]
    attention = next(r["val_loss"] for r in rows if r["spec"] == "tiny-attention" and r.get("best_lr"))
    at = {r["spec"]: r["val_loss"] for r in rows if r["lr"] == 4e-3}
    out = []
    for label, spec in _LM_LAYOUT:
        preset = spec == "tiny-vpom"
        out.append([_bold(label, preset), _bold(f"{at[spec]:.4f}", preset),
                    _bold(f"{at[spec] / attention - 1:+.1%}", preset)])
    return markdown_table(out, ["value PoM in every layer", "val loss at 4e-3", f"÷ attention ({attention:.4f})"])



@dataclass(frozen=True)
class _Row:
    """One row of a seeds table: its label, the runs it shows (one key: every seed of it; several: seed 0 of each),
    whether its median is bold (the parity picks) and whether it shows a gap to the reference."""

    label: str
    keys: Tuple[str, ...]
    bold: bool = False
    gap: bool = True


def _joined(values: Sequence[Optional[float]], scale: float, digits: int) -> str:
    return " / ".join("—" if v is None else f"{scale * v:.{digits}f}" for v in values)


def _runs(by: Dict[str, List[Dict[str, Any]]], row: _Row) -> List[Dict[str, Any]]:
    """The runs a row shows: every seed of its one key, or seed 0 of each of its keys."""
    return by[row.keys[0]] if len(row.keys) == 1 else [by[k][0] for k in row.keys]


_POINTS_QUALITY = [_Row("PTv3 with the token shift (`+attention_shift=2`)", ("tiny-ptv3+attention_shift=2",), True),
                   _Row("PTv3", ("tiny-ptv3",)),
                   _Row("value PoM (`tiny-ppomv3-value`)", ("tiny-ppomv3-value",), True),
                   _Row("PPoMv3, PoM patches of 1,024", ("tiny-ppomv3+pom_patch_size=1024",)),
                   _Row("PPoMv3, patches of 4,096 / the whole scene", ("tiny-ppomv3+pom_patch_size=4096",
                                                                     "tiny-ppomv3+pom_patch_size=scene")),
                   _Row("PPoMv3 (preset: patches of 256)", ("tiny-ppomv3",)),
                   _Row("hybrid with the token shift", ("tiny-ppomv3-hybrid+attention_shift=2",)),
                   _Row("hybrid (preset)", ("tiny-ppomv3-hybrid",))]


def points_quality(bench: Path) -> str:
    """Test mIoU % of each model at its best rate by validation mIoU, seeds 0 / 1 / 2 (points.json, points_seed1/,
    points_seed2/), with the median of those run on three seeds."""
    by = _seed_rows(bench, ["points.json", "points_seed1/points.json", "points_seed2/points.json"])
    out = []
    for row in _POINTS_QUALITY:
        runs = _runs(by, row)
        median = f"{100 * statistics.median(r['miou'] for r in runs):.1f}" if len(runs) == 3 else ""
        out.append([row.label, f"{runs[0]['params']:,}", f"{_rate(runs[0]['lr'])} ({runs[0]['rates']})",
                    _joined([r["miou"] for r in runs], 100, 1), _bold(median, row.bold),
                    _joined([r.get("val_miou") for r in runs], 100, 1)])
    return markdown_table(out, ["model", "params", "best rate (rates tried)", "test mIoU, seeds 0 / 1 / 2", "median",
                                "validation, seeds 0 / 1 / 2"])


_OCR_QUALITY = [_Row("HTR-VT (`tiny-htr-vt`)", ("tiny HTR-VT",), True),
                _Row("HTR-VPoM (`tiny-htr-vpom`)", ("tiny HTR-VPoM",), True),
                _Row("value PoM (`tiny-htr-vpom-value`)", ("tiny HTR-VPoM value",)),
                _Row("hybrid (`tiny-htr-vpom-hybrid`)", ("tiny hybrid",)),
                _Row("hybrid with the token shift", ("tiny hybrid (attention_shift=2)",), gap=False),
                _Row("HTR-VT with the token shift", ("tiny HTR-VT (attention_shift=2)",), gap=False)]


def ocr_quality(bench: Path) -> str:
    """Validation and test CER % on the synthetic lines, each model at its best rate by validation CER, seeds
    0 / 1 / 2 (ocr.json, ocr_seed1/, ocr_seed2/), and the test CER's gap to HTR-VT's median."""
    by = {k: [r for r in v if r["task"] == "synthetic"] for k, v in _seed_rows(
        bench, ["ocr.json", "ocr_seed1/ocr.json", "ocr_seed2/ocr.json"]).items()}
    figure = {row.keys[0]: statistics.median(r["cer"] for r in _runs(by, row)) for row in _OCR_QUALITY}
    reference = figure[_OCR_QUALITY[0].keys[0]]
    out = []
    for k, row in enumerate(_OCR_QUALITY):
        runs = _runs(by, row)
        median = f"{100 * figure[row.keys[0]]:.2f}" if len(runs) == 3 else ""
        gap = "—" if k == 0 else f"{figure[row.keys[0]] / reference - 1:+.1%}".replace("-", "−") if row.gap else ""
        out.append([row.label, f"{_rate(runs[0]['lr'])} ({runs[0]['rates']})", _joined([r["val_cer"] for r in runs],
                    100, 2), _joined([r["cer"] for r in runs], 100, 2), _bold(median, row.bold),
                    _bold(gap, row.bold and k > 0)])
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
    rows = [r for r in _read(bench, "ocr.json")["quality"]["rows"] if r["lr"] == 1e-3]
    out = []
    for task, (label, steps) in _OCR_TASKS.items():
        runs = [next(r for r in rows if r["task"] == task and r["model"] == m) for m in _OCR_RECIPE_MODELS]
        vt = runs[0]["cer"]
        cells = [f"**{vt:.2%}** / {runs[0]['wer']:.1%}"]
        cells += [f"{r['cer']:.2%} ({r['cer'] / vt - 1:+.1%}) / {r['wer']:.1%}".replace("(-", "(−") for r in runs[1:]]
        out.append([f"{label} ({runs[0]['test_lines']:,} test lines)", steps.format(runs[0]["steps"],
                    runs[0]["batch"])] + cells)
    return markdown_table(out, ["task", "steps × batch", "tiny HTR-VT CER / WER", "tiny hybrid", "tiny HTR-VPoM"])


_IMAGE_HELDOUT = [_Row("`tiny-sit+attention_shift=2`", ("tiny-sit+attention_shift=2",), True),
                  _Row("`tiny-sit`", ("tiny-sit",)),
                  _Row("`tiny-sit+position=sincos_rope`", ("tiny-sit+position=sincos_rope",)),
                  _Row("`tiny-sit+position=sincos_rope+attention_shift=2`",
                       ("tiny-sit+position=sincos_rope+attention_shift=2",)),
                  _Row("`tiny-sipom-value+position=sincos_rope`", ("tiny-sipom-value+position=sincos_rope",), True),
                  _Row("`tiny-sipom-value+position=sincos_rope+mixer=gated_value_pom`",
                       ("tiny-sipom-value+position=sincos_rope+mixer=gated_value_pom",)),
                  _Row("`tiny-sipom-value`", ("tiny-sipom-value",)),
                  _Row("`tiny-sipom-vhybrid+attention_shift=2`", ("tiny-sipom-vhybrid+attention_shift=2",)),
                  _Row("`tiny-sipom-vhybrid`", ("tiny-sipom-vhybrid",)),
                  _Row("`tiny-sipom`", ("tiny-sipom",))]


def image_heldout(bench: Path) -> str:
    """Validation and reported FD of each model form at its best rate by validation FD (``--heldout 0.15``), seeds
    0 / 1 / 2 (image_heldout/, its image_seed1/ and image_seed2/)."""
    by = _seed_rows(bench, ["image_heldout/image.json", "image_heldout/image_seed1/image.json",
                            "image_heldout/image_seed2/image.json"])
    out = []
    for row in _IMAGE_HELDOUT:
        runs = _runs(by, row)
        median = f"{statistics.median(r['fd'] for r in runs):.1f}" if len(runs) == 3 else ""
        out.append([row.label, f"{_rate(runs[0]['lr'])} ({runs[0]['rates']})", _joined([r["fd_val"] for r in runs],
                    1, 1), _joined([r["fd"] for r in runs], 1, 1), _bold(median, row.bold)])
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
    return _rate(lrs[0]) if len(lrs) == 1 else f"{_rate(lrs[0])} … {_rate(lrs[-1])} ({len(lrs)})"


def image_every_digit(bench: Path) -> str:
    """FD of each model form trained on every digit (flow; no held-out split, so the best rate is the one with the
    lowest reported FD): every rate of seed 0 (image.json), the best rate's seeds 0 / 1 / 2 (image_seed1/,
    image_seed2/), their median, and that median against SiT's with the same positions."""
    sweep: Dict[str, List[Dict[str, Any]]] = {}
    for r in _read(bench, "image.json")["quality"]["rows"]:
        if r["objective"] == "flow":
            sweep.setdefault(r["model"], []).append(r)
    seeds = {m: [next(r for r in runs if r["best_lr"])] for m, runs in sweep.items()}
    for name in ("image_seed1/image.json", "image_seed2/image.json"):
        for r in _read(bench, name)["quality"]["rows"]:
            if r["best_lr"] and r["objective"] == "flow":
                seeds[r["model"]].append(r)
    medians = {m: statistics.median(r["fd"] for r in runs) for m, runs in seeds.items() if len(runs) >= 3}
    out = []
    for label, model, reference in _IMAGE_EVERY_DIGIT:
        runs = sorted(sweep[model], key=lambda r: r["lr"])
        by_rate = " / ".join(_bold(f"{r['fd']:.1f}", r["best_lr"] and len(runs) > 1) for r in runs)
        median = medians.get(model)
        ratio = f"{median / medians[reference]:.2f}×" if median and reference in medians else ""
        out.append([label, _rates_tried([r["lr"] for r in runs]), by_rate, _joined([r["fd"] for r in seeds[model]],
                    1, 1), f"{median:.1f}" if median else "", ratio or ("—" if median else "")])
    return markdown_table(out, ["model form", "rates tried (×2 steps)", "FD by rate, seed 0",
                                "at its best rate, seeds 0 / 1 / 2", "median", "÷ SiT (same positions)"])


_EO_CURVES = [("TSViT", "tiny-tsvit"), ("value PoM preset", "tiny-tsvipom-value"),
              ("hybrid, PoM + full temporal attention", "tiny-tsvipom-hybrid"), ("TSViPoM", "tiny-tsvipom")]


def eo_curves(bench: Path) -> str:
    """Test mIoU % of each model at each tenth of a 4,000-step run (``bench eo --parts curves``), the last bold."""
    rows = {r["spec"]: r for r in _read(bench, "eo.json")["curves"]["rows"]}
    steps = [p["step"] for p in rows[_EO_CURVES[0][1]]["points"]]
    out = []
    for label, spec in _EO_CURVES:
        values = [f"{100 * p['miou']:.1f}" for p in rows[spec]["points"]]
        out.append([f"{label} ({_rate(rows[spec]['lr'])})"] + values[:-1] + [_bold(values[-1], True)])
    return markdown_table(out, ["model (rate)"] + [str(s) for s in steps])


_SLOW_DATES = "+date_rope=true+date_rope_speed=0.3+date_rope_base=30"
_EO_QUALITY = [_Row("TSViT, rotary dates", ("tiny-tsvit+date_rope=true",), True),
               _Row("local attention in time + value PoM, slower rotary dates", ("tiny-tsvipom-local" + _SLOW_DATES,),
                    True),
               _Row("local attention in time + value PoM, rotary dates", ("tiny-tsvipom-local+date_rope=true",)),
               _Row("hybrid (attention in time, PoM in space), rotary dates", ("tiny-tsvipom-hybrid+date_rope=true",)),
               _Row("gated value PoM, rotary dates", ("tiny-tsvipom-value+date_rope=true+mixer=gated_value_pom",),
                    True),
               _Row("value PoM, slower rotary dates", ("tiny-tsvipom-value" + _SLOW_DATES,)),
               _Row("value PoM, rotary dates", ("tiny-tsvipom-value+date_rope=true",)),
               _Row("TSViPoM, slower rotary dates", ("tiny-tsvipom" + _SLOW_DATES,)),
               _Row("TSViT (published date encoding)", ("tiny-tsvit",)),
               _Row("value PoM preset", ("tiny-tsvipom-value",)),
               _Row("value PoM with 1 value head and a 2-frame shift",
                    ("tiny-tsvipom-value+value_heads=1+shift_width=2",)),
               _Row("hybrid (attention in time, PoM in space)", ("tiny-tsvipom-hybrid",)),
               _Row("TSViPoM", ("tiny-tsvipom",))]


def _blocks(pattern: str) -> str:
    """A pattern of mixer letters as the guides write it, temporal blocks first: ``AAPP`` is ``AA · PP``."""
    half = len(pattern) // 2
    return f"{pattern[:half]} · {pattern[half:]}"


def eo_quality(bench: Path) -> str:
    """Test mIoU % on 24 × 24 windows of each model at its best rate by validation mIoU, every seed the JSON holds
    (eo.json, eo_seed1/, eo_seed2/, eo_seed3/), the median of those run on three seeds or more, and seed 0 on whole
    128 × 128 patches."""
    by = _seed_rows(bench, ["eo.json", "eo_seed1/eo.json", "eo_seed2/eo.json", "eo_seed3/eo.json"])
    out = []
    for row in _EO_QUALITY:
        runs = _runs(by, row)
        median = f"{100 * statistics.median(r['miou_24'] for r in runs):.1f}" if len(runs) >= 3 else ""
        out.append([row.label, _blocks(runs[0]["pattern"]), _rate(runs[0]["lr"]),
                    _joined([r["miou_24"] for r in runs], 100, 1), _bold(median, row.bold),
                    f"{100 * runs[0]['miou_whole']:.1f}"])
    return markdown_table(out, ["model (form)", "blocks", "rate", "test mIoU, seeds 0 / 1 / 2 / 3", "median",
                                "whole patch (seed 0)"])


_RECALL_STATE = [_Row("attention, no shift", ("attention",), True),
                 _Row("attention with the shift", ("attention-shift",), True),
                 _Row("value PoM, 16k state (`vpom-16k`)", ("vpom-16k",), True),
                 _Row("hybrid: local attention (window 16) then value PoM, shift in both (`hybrid-LV-shift`)",
                      ("hybrid-LV-shift",)),
                 _Row("hybrid, shift in the value PoM only (`hybrid-LV`)", ("hybrid-LV",)),
                 _Row("PoM (`pom`)", ("pom",))]


def recall_state(bench: Path) -> str:
    """MQAR accuracy at L 64, K 16 on Zoology's recipe (recall_zoology/recall.json), each mixer at its best rate,
    median and range over 3 seeds, and the same model's forward speed ÷ attention's (its speed part, this CPU)."""
    data = _read(bench, "recall_zoology/recall.json")
    rows = {r["variant"]: r for r in data["state"]["rows"] if r.get("best_lr")}
    speed = {r["variant"]: r["vs_attention"] for r in data.get("speed", {}).get("rows", [])}
    out = []
    for row in _RECALL_STATE:
        r = rows[row.keys[0]]
        timed = speed.get(row.keys[0])
        out.append([row.label, f"{r['state_floats']:,}", _rate(r["lr"]), _bold(f"{r['median']:.4f}", row.bold),
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
    for r in _read(bench, "recall_zoology/recall.json")["zoology"]["rows"]:
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
    for r in _read(bench, "recall_mixture/recall.json")["zoology"]["rows"]:
        by.setdefault(r["variant"], []).append(r)
    out = []
    for variant in _RECALL_MIXTURE:
        runs = by[variant]
        lrs = sorted({r["lr"] for r in runs})
        cells = [f"{runs[0]['family']} ({runs[0]['state_floats']:,})", " / ".join(_rate(lr) for lr in lrs)]
        for n in (64, 128, 256):
            at = sorted((r for r in runs if r["seq_len"] == n), key=lambda r: r["lr"])
            cells.append(" / ".join(_bold(f"{r['median']:.3f}", r["best_lr"] and len(at) > 1) for r in at))
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
    payload = _read(bench, "recall.json")
    best = {(part, r["variant"], r["steps"]): r for part in ("state", "length") for r in payload[part]["rows"]
            if r.get("best_lr")}
    out = []
    for label, keys in _RECALL_RECIPE:
        runs = [best[k] for k in keys]
        tried = {r["rates"] for r in runs}
        rate = _once([_rate(r["lr"]) for r in runs]) + (f" ({tried.pop()})" if len(tried) == 1 else "")
        out.append([label, _once([f"{r['state_floats']:,}" for r in runs]), rate,
                    " / ".join(f"{r['median']:.4f}" for r in runs), _once([str(r["seeds"]) for r in runs])])
    return markdown_table(out, ["variant", "state floats / layer", "best lr (rates tried)", "accuracy (median)",
                                "seeds"])


def _report_table(text: str, index: int = 0) -> str:
    """The ``index``-th table (a run of lines starting with ``|``) of a bench's text report."""
    blocks: List[List[str]] = []
    previous = False
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous:
                blocks.append([])
            blocks[-1].append(line)
        previous = line.startswith("|")
    return "\n".join(blocks[index])


# --- images (docs/image.md) ------------------------------------------------------------------------------------

def image_throughput(bench: Path) -> str:
    """Seconds per image of SiT and SiPoM by image side (``bench image --parts speed``)."""
    rows = _read(bench, "image.json")["speed"]["rows"]
    return format_table(rows, ["side", "tokens", "batch", "model", "s_per_image", "sit_over_sipom"],
                        ["side", "tokens", "batch", "model", "s / image", "SiT ÷ SiPoM"])


def image_recipe(bench: Path) -> str:
    """SiT against SiPoM at the recipe's rate (1e-3), flow and DDPM, 1,200 steps (image.json) and 2,400
    (ddpm2400/image.json)."""
    rows = [r for name in ("image.json", "ddpm2400/image.json") for r in _read(bench, name)["quality"]["rows"]
            if r["model"] in ("tiny-sit", "tiny-sipom") and r.get("lr", 1e-3) == 1e-3]
    return markdown_table([[r["model"], r["objective"], r["params"], r["steps"], r["cond_accuracy"],
                            r["classifier_accuracy"], r["fd"], r["fd_real_floor"], r["train_min"]] for r in rows],
                          ["model", "objective", "params", "steps", "cond. accuracy", "classifier acc.",
                           "Fréchet dist.", "real-vs-real", "train min"])


# --- the other families' throughput (docs/ocr.md, docs/eo.md, docs/points.md) -----------------------------------

def _by(rows: List[Dict[str, Any]], *keys: str) -> Dict[Tuple[Any, ...], Dict[str, Any]]:
    return {tuple(r[k] for k in keys): r for r in rows}


def ocr_throughput(bench: Path) -> str:
    """Lines per second of HTR-VT, HTR-VPoM and the hybrid by lines per image, fp32 and bf16."""
    rows = _read(bench, "ocr.json")["speed"]["rows"]
    by = _by(rows, "dtype", "lines", "model")
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


def eo_throughput(bench: Path) -> str:
    """km² per second of TSViT and TSViPoM by window side, fp32 and bf16 (the largest side is a whole patch)."""
    rows = _read(bench, "eo.json")["speed"]["rows"]
    by = _by(rows, "dtype", "side", "model")
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


def points_throughput(bench: Path) -> str:
    """Seconds per call and 10⁶ points per second of PTv3, PPoMv3 and the hybrid, by room size and context."""
    rows = _read(bench, "points.json")["speed"]["rows"]
    return markdown_table([[r["voxels"], r["model"], r["attn_patch"], r["pom_patch"], r["s_per_call"],
                            r["mpts_per_s"], r["speedup"]] for r in rows],
                          ["voxels", "model", "attention patch", "PoM context", "s / call", "10⁶ pts/s", "speedup"])


# --- mixers, faults, parallelism, parity, GPU models (docs/mixer.md, faults.md, parallel.md, parity.md, gpu.md) --

_MIXER_COLUMNS = ["N", "batch", "mixer", "fwd_ms", "fwd_tok_s", "fwd_vs_floor", "fwdbwd_ms", "fwdbwd_vs_floor",
                  "fwd_peak_mb", "fwdbwd_peak_mb"]
_MIXER_HEADERS = ["N", "B", "mixer", "fwd ms", "fwd tok/s", "fwd ÷ floor", "fwd+bwd ms", "fwd+bwd ÷ floor", "fwd MB",
                  "fwd+bwd MB"]


def mixer_cpu(bench: Path) -> str:
    """PoM, SDPA and the naive attention on CPU by length, against PoM's matrix-product floor (``bench mixer``)."""
    rows = [r for r in _read(bench, "mixer.json")["rows"] if not r["mixer"].startswith("value pom")]
    return format_table(rows, _MIXER_COLUMNS, _MIXER_HEADERS)


def mixer_value(bench: Path) -> str:
    """The value PoM's causal forms against their own matrix-product floor."""
    rows = [r for r in _read(bench, "mixer.json")["rows"] if r["mixer"].startswith("value pom")]
    keep = [0, 1, 2, 3, 5, 6, 7]
    return format_table(rows, [_MIXER_COLUMNS[i] for i in keep], [_MIXER_HEADERS[i] for i in keep])


def mixer_packed(bench: Path) -> str:
    """Packed sequences mixed in place, as a padded batch, and as one sequence."""
    rows = _read(bench, "mixer.json")["packed"]
    return markdown_table([[r["layout"], r["tokens"], r["mode"], r["fwdbwd_ms"], r["vs_one_sequence"]] for r in rows],
                          ["sequences", "tokens", "mixed", "fwd+bwd ms", "÷ one sequence"])


def faults_survival(bench: Path) -> str:
    """Every injected fault of ``bench faults``, survived or not, and the steps it cost."""
    payload = _read(bench, "faults.json")
    for fam in payload["families"].values():  # the point-cloud family's runs predate its name "points"
        for r in fam["rows"]:
            r["family"] = {"3d": "points"}.get(r["family"], r["family"])
    return _report_table(faults_bench.report(payload))


def parallel_report(bench: Path) -> str:
    """``bench parallel``'s whole text report (measured bytes and memory, fits, the H100 model), as a code block."""
    return "```\n" + parallel_bench.report(_read(bench, "parallel.json")) + "\n```"


def parallel_scaling(bench: Path) -> str:
    """``bench parallel --scaling``: bytes per rank against P, counted, and the model of larger P, as a code block."""
    return "```\n" + parallel_bench.scaling_report(_read(bench, "parallel_scaling.json")) + "\n```"


def parallel_million(bench: Path) -> str:
    """``bench parallel --million``: the long-context LM step's memory per rank with and without activation
    checkpointing, as a code block."""
    return "```\n" + parallel_bench.million_report(_read(bench, "parallel_million.json")) + "\n```"


def parity_families(bench: Path) -> str:
    """Attention, PoM, value PoM and the best hybrid of every family, as ``bench parity`` judges them."""
    payload = _read(bench, "parity.json")
    for fam in payload["families"]:  # the guide links its siblings: docs/lm.md is lm.md from docs/parity.md
        fam["guide"] = fam["guide"].removeprefix("docs/")
    return _report_table(parity_bench.report(payload))


def gpu_roofline(bench: Path) -> str:
    """The roofline model's GPT-2 small against GPPoM2-S on an H100 (predicted, not measured)."""
    text = roofline_bench.report(_read(bench, "roofline.json"))
    return text.splitlines()[0] + "\n" + _report_table(text)


def _h200(bench: Path, name: str) -> Dict[Tuple[int, str], Dict[str, Any]]:
    """The rows of an H200 ``bench mixer`` run by (N, mixer)."""
    return _by(_read(bench, name)["rows"], "N", "mixer")


def _pair(by: Dict[Tuple[int, str], Dict[str, Any]], n: int, mixers: Sequence[str], key: str,
          fmt: str = "{:.2f}") -> str:
    """One figure of two mixers at length ``n`` (full / causal), a dash where one was not run."""
    return " / ".join(fmt.format(by[(n, m)][key]) if (n, m) in by else "—" for m in mixers)


def _modes(mixer: str) -> Tuple[str, str]:
    """A mixer's full and causal rows (``pom {mode} triton``, ``sdpa {mode}``)."""
    return mixer.format(mode="full"), mixer.format(mode="causal")


def _speedup(by: Dict[Tuple[int, str], Dict[str, Any]], n: int) -> str:
    """SDPA's forward time over the ``triton`` PoM's, full / causal (a dash where SDPA was not run)."""
    return " / ".join(f"{by[(n, f'sdpa {m}')]['fwd_ms'] / by[(n, f'pom {m} triton')]['fwd_ms']:.2f}×"
                      if (n, f"sdpa {m}") in by else "—" for m in ("full", "causal"))


def gpu_h200_forward(bench: Path) -> str:
    """Forward ms on an H200 of PoM's routes against its matrix-product floor and SDPA (the serial-walk kernels)."""
    by = _h200(bench, "gpu_h200/mixer.json")
    out = []
    for n, batch in dict.fromkeys((n, r["batch"]) for (n, _), r in by.items()):
        out.append([f"{n:,}", batch, f"{by[(n, 'pom matmuls (floor)')]['fwd_ms']:.2f}",
                    _pair(by, n, _modes("pom {mode} triton"), "fwd_ms"),
                    _pair(by, n, _modes("pom {mode} triton"), "fwd_vs_floor", "{:.1f}"),
                    _pair(by, n, _modes("pom {mode} triton_gemm"), "fwd_ms"),
                    _pair(by, n, _modes("pom {mode}"), "fwd_ms"),
                    _pair(by, n, _modes("sdpa {mode}"), "fwd_ms"), _speedup(by, n)])
    return markdown_table(out, ["N", "batch", "PoM floor (its GEMMs)", "PoM `triton` full / causal", "÷ floor",
                                "PoM `triton_gemm` full / causal", "PoM torch form full / causal", "SDPA full / causal",
                                "`triton` speed-up over SDPA, full / causal"])


def gpu_h200_backward(bench: Path) -> str:
    """Forward + backward ms on an H200 of PoM's routes, SDPA and the value PoM's causal torch form and kernels."""
    by = _h200(bench, "gpu_h200/mixer.json")
    out = []
    for n in dict.fromkeys(n for n, _ in by):
        out.append([f"{n:,}", f"{by[(n, 'pom matmuls (floor)')]['fwdbwd_ms']:.2f}",
                    _pair(by, n, _modes("pom {mode} triton"), "fwdbwd_ms"),
                    _pair(by, n, _modes("pom {mode} triton_gemm"), "fwdbwd_ms"),
                    _pair(by, n, _modes("pom {mode}"), "fwdbwd_ms"), _pair(by, n, _modes("sdpa {mode}"), "fwdbwd_ms"),
                    f"{by[(n, 'value pom matmuls (floor)')]['fwdbwd_ms']:.2f}",
                    _pair(by, n, ["value pom causal", "value pom causal triton"], "fwdbwd_ms")])
    return markdown_table(out, ["N", "PoM floor", "PoM `triton` full / causal", "PoM `triton_gemm` full / causal",
                                "PoM torch form full / causal", "SDPA full / causal", "value PoM floor",
                                "value PoM causal: torch form / kernels"])


def gpu_h200_compiled(bench: Path) -> str:
    """PoM compiled (``torch.compile`` over the ``triton`` kernels) against the eager forms on an H200, ms."""
    by = _h200(bench, "gpu_h200_compiled/mixer.json")
    out = []
    for n in dict.fromkeys(n for n, _ in by):
        floor = by[(n, "pom matmuls (floor)")]
        out.append([f"{n:,}", f"{floor['fwd_ms']:.2f} / {floor['fwdbwd_ms']:.2f}",
                    _pair(by, n, _modes("pom {mode}"), "fwdbwd_ms"),
                    _pair(by, n, _modes("pom {mode} triton"), "fwd_ms"),
                    _pair(by, n, _modes("pom {mode} triton"), "fwdbwd_ms"),
                    _pair(by, n, _modes("pom {mode} compiled"), "fwd_ms"),
                    _bold(_pair(by, n, _modes("pom {mode} compiled"), "fwdbwd_ms"), True)])
    return markdown_table(out, ["N", "floor fwd / fwd+bwd", "torch form (eager) full / causal, fwd+bwd",
                                "`triton` (eager) full / causal, fwd", "`triton` (eager) full / causal, fwd+bwd",
                                "**compiled** full / causal, fwd", "**compiled** full / causal, fwd+bwd"])


def gpu_traffic(bench: Path) -> str:
    """The kernels' HBM passes per N·D element counted in Triton's interpreter (``polymixer kernels --traffic``),
    against the cost model and the floor: :func:`polymixer.experiments.bench.traffic.table` of traffic.json."""
    return traffic_bench.table(json.loads((bench / "traffic.json").read_text()))


@dataclass(frozen=True)
class Table:
    """A registered table: its generator and the JSON files (under docs/bench) it reads, named in its marker."""

    make: Callable[[Path], str]
    sources: Tuple[str, ...]


_REGISTRY: Dict[str, Table] = {
    "lm.throughput": Table(lm_throughput, ("lm.json",)),
    "lm.decode": Table(lm_decode, ("lm.json",)),
    "lm.quality": Table(lm_quality, ("lm.json", "lm_seed1/lm.json", "lm_seed2/lm.json")),
    "lm.layout": Table(lm_layout, ("lm.json",)),
    "lm.prose": Table(lm_prose, ("lm_prose/lm.json",)),
    "hf.decode": Table(hf_decode, ("lm.json",)),
    "hf.distill": Table(hf_distill, ("distill.json",)),
    "image.throughput": Table(image_throughput, ("image.json",)),
    "image.recipe": Table(image_recipe, ("image.json", "ddpm2400/image.json")),
    "image.heldout": Table(image_heldout, ("image_heldout/image.json", "image_heldout/image_seed1/image.json",
                                           "image_heldout/image_seed2/image.json")),
    "ocr.throughput": Table(ocr_throughput, ("ocr.json",)),
    "eo.curves": Table(eo_curves, ("eo.json",)),
    "eo.throughput": Table(eo_throughput, ("eo.json",)),
    "points.quality": Table(points_quality, ("points.json", "points_seed1/points.json", "points_seed2/points.json")),
    "ocr.quality": Table(ocr_quality, ("ocr.json", "ocr_seed1/ocr.json", "ocr_seed2/ocr.json")),
    "points.throughput": Table(points_throughput, ("points.json",)),
    "recall.state": Table(recall_state, ("recall_zoology/recall.json",)),
    "recall.zoology": Table(recall_zoology, ("recall_zoology/recall.json",)),
    "mixer.cpu": Table(mixer_cpu, ("mixer.json",)),
    "mixer.value": Table(mixer_value, ("mixer.json",)),
    "mixer.packed": Table(mixer_packed, ("mixer.json",)),
    "faults.survival": Table(faults_survival, ("faults.json",)),
    "parallel.report": Table(parallel_report, ("parallel.json",)),
    "parallel.scaling": Table(parallel_scaling, ("parallel_scaling.json",)),
    "parallel.million": Table(parallel_million, ("parallel_million.json",)),
    "parity.families": Table(parity_families, ("parity.json",)),
    "gpu.roofline": Table(gpu_roofline, ("roofline.json",)),
    "eo.quality": Table(eo_quality, ("eo.json", "eo_seed1/eo.json", "eo_seed2/eo.json", "eo_seed3/eo.json")),
    "image.every_digit": Table(image_every_digit, ("image.json", "image_seed1/image.json",
                                                   "image_seed2/image.json")),
    "ocr.recipe": Table(ocr_recipe, ("ocr.json",)),
    "recall.mixture": Table(recall_mixture, ("recall_mixture/recall.json",)),
    "recall.recipe": Table(recall_recipe, ("recall.json",)),
    "gpu.h200_forward": Table(gpu_h200_forward, ("gpu_h200/mixer.json",)),
    "gpu.h200_backward": Table(gpu_h200_backward, ("gpu_h200/mixer.json",)),
    "gpu.h200_compiled": Table(gpu_h200_compiled, ("gpu_h200_compiled/mixer.json",)),
    "gpu.traffic": Table(gpu_traffic, ("traffic.json",)),
}
#: every generated table by name: a function of the docs/bench folder returning the table's Markdown
TABLES: Dict[str, Callable[[Path], str]] = {name: t.make for name, t in _REGISTRY.items()}
#: the JSON files (relative to docs/bench) each table is generated from
SOURCES: Dict[str, Tuple[str, ...]] = {name: t.sources for name, t in _REGISTRY.items()}


def marker(name: str) -> str:
    """The line a generated table starts after: its name, the JSON it comes from and the command that writes it."""
    sources = ", ".join(f"docs/bench/{s}" for s in SOURCES[name])
    return f"<!-- table:{name} (generated from {sources}: {COMMAND}) -->"


@dataclass
class Marked:
    """One marked table in a guide: its name and the lines (0-based) of its begin and end markers."""

    name: str
    begin: int
    end: int


def find_markers(text: str, guide: str = "guide") -> List[Marked]:
    """The marked tables of a guide's text; an unknown name or an unclosed marker is a ``ValueError`` naming the
    guide and the table."""
    lines = text.splitlines()
    found: List[Marked] = []
    for i, line in enumerate(lines):
        if not line.startswith("<!-- table:"):
            continue
        m = BEGIN.match(line)
        name = m.group("name") if m else line[len("<!-- table:"):].split()[0]
        if name not in TABLES:
            raise ValueError(f"{guide}: unknown table {name!r} (not in polymixer.experiments.guides.TABLES)")
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == END), None)
        if m is None or end is None:
            raise ValueError(f"{guide}: table {name!r} has no {END!r} after its marker, or a malformed marker")
        found.append(Marked(name, i, end))
    return found


def update_guide(guide: Path, bench: Path, check: bool = False) -> List[str]:
    """Rewrite (or, with ``check``, only compare) every marked table of one guide; the names of those that were
    stale."""
    text = guide.read_text(encoding="utf-8")
    lines = text.splitlines()
    stale: List[str] = []
    for m in reversed(find_markers(text, guide.name)):
        new = [marker(m.name)] + TABLES[m.name](bench).splitlines()
        if lines[m.begin:m.end] != new:
            stale.append(m.name)
            lines[m.begin:m.end] = new
    if stale and not check:
        guide.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""), encoding="utf-8")
    return stale[::-1]


def guides_in(docs: Path) -> List[Path]:
    """The guides: every docs/*.md."""
    return sorted(docs.glob("*.md"))


def update_guides(docs: Path, bench: Optional[Path] = None, check: bool = False) -> List[Tuple[str, str]]:
    """Every guide's marked tables rewritten (or only compared); the stale ones as (guide, table) pairs."""
    bench = bench or docs / "bench"
    return [(g.name, name) for g in guides_in(docs) for name in update_guide(g, bench, check)]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", default="docs", help="the folder of the guides (*.md)")
    p.add_argument("--bench", default=None, help="the benches' JSON folder (default: DOCS/bench)")
    p.add_argument("--check", action="store_true", help="rewrite nothing; status 1 naming each stale table")
    args = p.parse_args(argv)
    try:
        stale = update_guides(Path(args.docs), Path(args.bench) if args.bench else None, check=args.check)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for guide, name in stale:
        print(f"{guide}: table {name} {'is stale' if args.check else 'rewritten'}")
    if not stale:
        print("every generated table is current")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
