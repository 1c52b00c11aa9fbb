"""The lm family's tables in its guides (docs/lm.md and docs/hf.md: the language models, their decoding through
transformers, the distilled students), generated from the benches' JSON under docs/bench by ``python -m
polymixer.experiments.guides``: each a function of the docs/bench folder returning the table's Markdown, registered
by name in :data:`TABLES` (which the family's registration brings to the guides)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

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


# --- why PoM misses at LM (docs/lm.md): bytes and tokens side by side --------------------------------------------

WHY_ROOT = "lm_why"  # docs/bench/lm_why/<tokens>_<steps>/lm.json: the runs the table adds to the comparisons'
WHY_ATTENTION = "tiny-attention+block_size=1024"
# the PoM: the paper's form, or polymixer's where only it ran at the comparison's budget (the cell names it)
WHY_POMS = ("tiny-pom-paper+block_size=1024", "tiny-pom+block_size=1024")
WHY_LOCAL = WHY_ATTENTION + "+mixer=L+window=8"  # local attention in every layer, over the last 8 positions
WHY_SHIFT = WHY_POMS[0] + "+pom_shift=4"  # the paper's PoM, W_h c shifted over the last 4 tokens
WHY_LIKE = {WHY_LOCAL: WHY_ATTENTION, WHY_SHIFT: WHY_POMS[0]}  # the model whose rate and time a variant borrows
WHY_BUDGETS = (0.25, 1.0, 4.0)  # × the comparison's steps, each run with its own warm-up and cosine
RECIPE_LR = 2e-3  # bench lm's quality_lr, where a JSON names none: --lr-factors multiply it
BPE_EMBEDDING = 491_392  # the parameters a BPE of 4,096 entries adds to a tiny preset (tied: docs/lm.md, Tokens)


@dataclass(frozen=True)
class WhyTokens:
    """One tokenization of the table: its comparison's JSON and budget, and what its commands add."""

    name: str  # "bytes" | "tokens": the column and the folder prefix under lm_why
    label: str
    main: str  # the comparison's JSON under docs/bench (its full attention and PoM at 1×)
    steps: int  # the comparison's budget
    tokenizer: str  # the n-gram rows of its tokens
    flags: str  # its bench lm flags besides the budget and models
    batch: int


WHY_TOKENS = (WhyTokens("bytes", "bytes, context 1,024 bytes", "lm_prose/lm.json", 375, "bytes", "--corpus prose", 32),
              WhyTokens("tokens", "BPE 4,096 tokens, context 1,024 tokens", "lm_tokens/lm.json", 235,
                        "prose-bpe-4096", "--corpus prose --tokenizer prose-bpe-4096 --quality-batch 16", 16))
WHY_NGRAM = "lm_prose_ngram/lm.json"


def _quality(bench: Path, name: str) -> Dict[str, Any]:
    """The quality part of ``name`` under ``bench`` ({} where the file or part is absent)."""
    path = bench / name
    return json.loads(path.read_text()).get("quality", {}) if path.is_file() else {}


def _why_files(tok: WhyTokens, steps: int) -> List[str]:
    """The JSON files a run of ``tok`` at ``steps`` may be in: its own folder under lm_why, and at the comparison's
    budget the comparison's JSON."""
    return [f"{WHY_ROOT}/{tok.name}_{steps}/lm.json"] + ([tok.main] if steps == tok.steps else [])


def _why_run(bench: Path, tok: WhyTokens, spec: str, steps: int) -> Optional[Dict[str, Any]]:
    """``spec``'s run at ``steps`` at its best rate (the first file that has one), else None."""
    for name in _why_files(tok, steps):
        for r in _quality(bench, name).get("rows", []):
            if r.get("spec") == spec and r.get("steps") == steps and r.get("best_lr", True):
                return r
    return None


def _why_bits(row: Dict[str, Any], split: str) -> Optional[float]:
    """A run's bits per byte on ``split`` (test or val), None where it has none."""
    v = row.get(f"{split}_bpb")
    return float(v) if isinstance(v, (int, float)) else None


def _why_pair(mine: Dict[str, Any], base: Dict[str, Any]) -> str:
    """Two runs' bits per byte on the split both have (test first; "val" marks validation) and the first's gap."""
    split = "test" if _why_bits(mine, "test") and _why_bits(base, "test") else "val"
    a, b = _why_bits(mine, split), _why_bits(base, split)
    if a is None or b is None:
        return "no bits per byte"
    mark = "" if split == "test" else " val"
    return f"{a / b - 1:+.1%} ({a:.3f} against {b:.3f}{mark})"


def _why_minutes(bench: Path, tok: WhyTokens, spec: str) -> float:
    """Training minutes per step of ``spec`` in ``tok`` (an estimate from measured rows): the median over the
    comparison's own runs of it (local attention: of full attention; else of any model of its size) of train_min ÷
    steps; for tokens without measured
    runs, the byte runs' time per step scaled by the tokens a step trains and the parameters (6·N·T: the BPE's
    embedding and head)."""
    def per_step(name: str) -> Tuple[Optional[float], Optional[int]]:
        rows = [r for r in _quality(bench, name).get("rows", []) if "smaller" not in r
                and isinstance(r.get("train_min"), (int, float)) and r.get("steps")]
        like = WHY_LIKE.get(spec, spec)  # (local attention: at most full attention's time)
        own = [r for r in rows if r["spec"] == like] or rows
        if not own:
            return None, None
        return statistics.median(r["train_min"] / r["steps"] for r in own), own[0].get("params")

    minutes, params = per_step(tok.main)
    if minutes is not None:
        return minutes
    byte = WHY_TOKENS[0]
    minutes, params = per_step(byte.main)
    if minutes is None or not params:
        return math.nan
    return minutes * tok.batch / byte.batch * (params + (BPE_EMBEDDING if tok.name != "bytes" else 0)) / params


def _why_command(bench: Path, tok: WhyTokens, spec: str, steps: int) -> str:
    """The command that runs ``spec`` at ``steps`` (none on file): at the comparison's budget, the comparison's own
    sweep; else one run at the rate its model chose at that budget (local attention: full attention's, the shifted
    PoM: the paper's PoM's), or a sweep of three rates where none is chosen yet."""
    from .targets import PROSE, PROSE_TOKENS

    if steps == tok.steps and spec not in WHY_LIKE:
        return (PROSE if tok.name == "bytes" else PROSE_TOKENS).sweep_command(spec)
    main = _quality(bench, tok.main)
    recipe = (main.get("config") or {}).get("quality_lr") or RECIPE_LR
    chosen = _why_run(bench, tok, WHY_LIKE.get(spec, spec), tok.steps)
    factors = f"{chosen['lr'] / recipe:g}" if chosen and chosen.get("lr") else "1 2 4"
    return (f"polymixer bench lm --parts quality {tok.flags} --quality-steps {steps} --presets {spec} --sweep {spec} "
            f"--lr-factors {factors} --out docs/bench/{WHY_ROOT}/{tok.name}_{steps}")


def _why_cell(bench: Path, tok: WhyTokens, spec: str, steps: int, todo: Dict[str, float]
              ) -> Optional[Dict[str, Any]]:
    """``spec``'s run, or None with its command added to ``todo`` (command → estimated minutes)."""
    row = _why_run(bench, tok, spec, steps)
    if row is None:
        command = _why_command(bench, tok, spec, steps)
        runs = len(command.split("--lr-factors ")[1].split(" --")[0].split())
        minutes = _why_minutes(bench, tok, spec) * steps * runs
        todo[command] = minutes
    return row


def _why_pom(bench: Path, tok: WhyTokens) -> str:
    """The PoM form of ``tok``'s column: the paper's, unless only polymixer's ran at the comparison's budget."""
    return next((p for p in WHY_POMS if _why_run(bench, tok, p, tok.steps)), WHY_POMS[0])


def _why_ngram(bench: Path, tok: WhyTokens) -> str:
    """The best n-gram of 0–5 tokens of context of ``tok``'s tokens: test (validation) bits per byte and order."""
    path = bench / WHY_NGRAM
    rows = [r for r in (json.loads(path.read_text()).get("ngram", {}).get("rows", []) if path.is_file() else [])
            if r.get("tokenizer") == tok.tokenizer]
    if not rows:
        return "not run"
    test = min(rows, key=lambda r: r["test_bpb"])
    val = min(rows, key=lambda r: r["val_bpb"])
    return f"{test['test_bpb']:.3f} (order {test['order']}; validation {val['val_bpb']:.3f})"


def lm_why(bench: Path) -> str:
    """Why PoM misses at LM, measured, bytes and tokens side by side (bits per byte, test where both runs of a
    gap have it, else validation): the n-gram baseline; full attention; attention over the last 8 positions only
    against it; the paper's PoM against full attention at ¼, 1 and 4 times the comparison's budget, each with its own
    schedule; the paper's PoM with a short token shift. Runs not on file read "not run", listed below the table with
    their commands and estimated minutes (from measured train minutes). Reads docs/bench/lm_why/<tokens>_<steps>/,
    the comparisons' JSON (lm_prose, lm_tokens) and the n-gram's, each where present."""
    todo: Dict[str, float] = {}
    rows: List[List[str]] = [["n-gram baseline, best of 0–5 tokens of context (test)"]
                             + [_why_ngram(bench, tok) for tok in WHY_TOKENS]]

    def gap(spec: Optional[str], base: str, factor: float) -> List[str]:
        cells = []
        for tok in WHY_TOKENS:
            steps, mine_spec = round(tok.steps * factor), spec or _why_pom(bench, tok)
            mine, theirs = (_why_cell(bench, tok, s, steps, todo) for s in (mine_spec, base))
            ours = "" if mine_spec == WHY_POMS[0] or spec else f", as `{mine_spec.split('+')[0]}`"
            cells.append(_why_pair(mine, theirs) + ours if mine and theirs else "not run")
        return cells

    full = []
    for tok in WHY_TOKENS:
        row = _why_cell(bench, tok, WHY_ATTENTION, tok.steps, todo)
        split = "test" if row and _why_bits(row, "test") else "val"
        full.append("not run" if row is None else f"{_why_bits(row, split) or math.nan:.3f}"
                    + ("" if split == "test" else " val"))
    rows.append([f"full attention (`{WHY_ATTENTION}`), the comparison's budget"] + full)
    rows.append(["attention over the last 8 positions (`+mixer=L+window=8`) against full"]
                + gap(WHY_LOCAL, WHY_ATTENTION, 1.0))
    budgets = lambda f: " / ".join(f"{round(t.steps * f):,}" for t in WHY_TOKENS)  # noqa: E731
    for factor in WHY_BUDGETS:
        rows.append([f"the paper's PoM (`{WHY_POMS[0]}`) against full attention, {factor:g}× the budget "
                     f"({budgets(factor)} steps)"] + gap(None, WHY_ATTENTION, factor))
    rows.append([f"the paper's PoM with a short token shift (`{WHY_SHIFT}`) against full attention"]
                + gap(WHY_SHIFT, WHY_ATTENTION, 1.0))
    table = markdown_table(rows, ["bits per byte (gap to full attention)", *(t.label for t in WHY_TOKENS)])
    if not todo:
        return table
    folders: Dict[str, List[str]] = {}  # the commands by the folder they write (one line each)
    for command, minutes in todo.items():
        folders.setdefault(command.rsplit("--out ", 1)[1], []).append(f"`{command}` (~{minutes:.0f} min)")
    return "\n".join([table, "", f"Not run yet ({len(todo)} commands, ~{sum(todo.values()) / 60:.1f} h on one "
                                 "thread, estimated from measured train minutes), by the folder each writes:"]
                     + [f"- {folder}: {'; '.join(lines)}" for folder, lines in folders.items()])


# every table of the family by name, with the JSON files (under docs/bench) it reads
TABLES = {
    "lm.throughput": Table(lm_throughput, ("lm.json",)),
    "lm.decode": Table(lm_decode, ("lm.json",)),
    "lm.quality": Table(lm_quality, ("lm.json", "lm_seed1/lm.json", "lm_seed2/lm.json")),
    "lm.prose": Table(lm_prose, ("lm_prose/lm.json",)),
    # (and, where present, lm_tokens/lm.json and the lm_why/ folders: runs not on file read "not run")
    "lm.why": Table(lm_why, ("lm_prose/lm.json", WHY_NGRAM)),
    "hf.decode": Table(hf_decode, ("lm.json",)),
    "hf.distill": Table(hf_distill, ("distill.json",)),
}
