"""The lm family's tables in its guides (docs/lm.md and docs/hf.md: the language models, their decoding through
transformers, the distilled students), generated from the benches' JSON under docs/bench by ``python -m
polymixer.experiments.guides``: each a function of the docs/bench folder returning the table's Markdown, registered
by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict

from ..guides import bench_json, bold, markdown_table, rate_text, seed_rows
from ..registry import Table
from ..report import format_table

__all__ = ["TABLES"]


def lm_throughput(bench: Path) -> str:
    """Forward throughput of every timed model (``bench lm --parts throughput``; a kind with options is that form)
    at each length for a fixed token budget: thousand tokens/s and, in brackets, ÷ attention's; one row a model."""
    part = bench_json(bench, "lm.json")["throughput"]
    rows, params = part["rows"], part.get("params", {})
    lengths = sorted({r["N"] for r in rows})
    batch = {r["N"]: r["batch"] for r in rows}
    at = {(r["model"], r["N"]): r for r in rows}
    out = [[f"`{m}`", f"{params[m]:,}" if m in params else ""]
           + [f"{at[m, n]['ktok_s']:.3g} ({at[m, n]['vs_attention']:.2f}×)" if (m, n) in at else "" for n in lengths]
           for m in dict.fromkeys(r["model"] for r in rows)]
    return markdown_table(out, ["model (`--kinds`)", "params", *(f"N {n:,} (batch {batch[n]})" for n in lengths)])


def lm_decode(bench: Path) -> str:
    """Per-token decoding time and state size after a prefilled context: one row a context, one column a model
    (its prefill times and ratios to the first context: the bench's lm.txt)."""
    rows = bench_json(bench, "lm.json")["decode"]["rows"]
    at = {(r["model"], r["context"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    def mb(v: float) -> str:
        return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"

    out = [[f"{n:,}"] + [f"{at[m, n]['ms_per_token']:.3g} ms, {mb(at[m, n]['state_mb'])} MB" if (m, n) in at else ""
                         for m in models] for n in sorted({r["context"] for r in rows})]
    return markdown_table(out, ["context", *(f"`{m}`" for m in models)])


def hf_decode(bench: Path) -> str:
    """The same decoding through transformers' ``generate()`` loop and the ``PolymixerCache``."""
    rows = bench_json(bench, "lm.json")["hf_decode"]["rows"]
    return format_table(rows, ["context", "model", "ms_per_token", "vs_first_context", "state_mb"],
                        ["context", "model", "ms / token", "÷ first context", "state MB"])


def hf_distill(bench: Path) -> str:
    """The teacher and every student of ``bench distill`` (distilled, fine-tuned only, from scratch)."""
    rows = bench_json(bench, "distill.json")["quality"]["rows"]
    precise = {"after_stage1": 4, "val_loss": 4, "val_bpb": 4, "vs_teacher": 4, "train_min": 1}
    shown = [{k: f"{v:.{precise[k]}f}" if k in precise and isinstance(v, float) else v for k, v in r.items()}
             for r in rows]
    return format_table(shown, ["model", "method", "params", "steps", "tokens", "after_stage1", "val_loss",
                                "val_bpb", "vs_teacher", "train_min"],
                        ["student", "method", "params", "steps", "tokens", "loss after stage 1", "val loss",
                         "val bpb", "÷ teacher", "train min"])


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
    by = seed_rows(bench, ["lm.json", "lm_seed1/lm.json", "lm_seed2/lm.json"])
    reference = statistics.median(r["val_loss"] for r in by[_LM_QUALITY[0][1]])
    rows = []
    for label, spec, strong in _LM_QUALITY:
        runs = by[spec]
        losses = [r["val_loss"] for r in runs]
        median = statistics.median(losses) if len(runs) > 1 else None
        gap = ("—" if spec == _LM_QUALITY[0][1] else f"{median / reference - 1:+.1%}") if median else ""
        rows.append([f"{label} (`{spec}`)", f"{runs[0]['params']:,}",
                     f"{rate_text(runs[0]['lr'])} ({runs[0]['rates']})", " / ".join(f"{v:.4f}" for v in losses),
                     bold(f"{median:.4f}" if median else "", strong), bold(gap, strong and gap != "—")])
    return markdown_table(rows, ["model", "params", "rate (rates tried)", "seeds 0 / 1 / 2", "median",
                                 "vs attention + shift"])


def lm_prose(bench: Path) -> str:
    """The LM at the paper's proportions (lm_prose/lm.json: context 1,024 on English prose): each model's validation
    loss at every rate it ran on seed 0 (its best bold) and its best against the best of attention's forms (with or
    without the shift) at the same size — smaller models first, attention's forms first within a size."""
    rows = bench_json(bench, "lm_prose/lm.json")["quality"]["rows"]
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
                   + [bold(f"{at[lr]:.4f}", lr == best[spec]["lr"]) if lr in at else "" for lr in rates]
                   + ["— (the reference)" if base == spec else "" if gap is None else f"{gap:+.1%}", along])
    return markdown_table(out, ["model", "params", *(f"{rate_text(lr)}" for lr in rates),
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
    rows = bench_json(bench, "lm.json")["quality"]["rows"]
    attention = next(r["val_loss"] for r in rows if r["spec"] == "tiny-attention" and r.get("best_lr"))
    at = {r["spec"]: r["val_loss"] for r in rows if r["lr"] == 4e-3}
    out = []
    for label, spec in _LM_LAYOUT:
        preset = spec == "tiny-vpom"
        out.append([bold(label, preset), bold(f"{at[spec]:.4f}", preset),
                    bold(f"{at[spec] / attention - 1:+.1%}", preset)])
    return markdown_table(out, ["value PoM in every layer", "val loss at 4e-3", f"÷ attention ({attention:.4f})"])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "lm.throughput": Table(lm_throughput, ("lm.json",)),
    "lm.decode": Table(lm_decode, ("lm.json",)),
    "lm.quality": Table(lm_quality, ("lm.json", "lm_seed1/lm.json", "lm_seed2/lm.json")),
    "lm.layout": Table(lm_layout, ("lm.json",)),
    "lm.prose": Table(lm_prose, ("lm_prose/lm.json",)),
    "hf.decode": Table(hf_decode, ("lm.json",)),
    "hf.distill": Table(hf_distill, ("distill.json",)),
}
