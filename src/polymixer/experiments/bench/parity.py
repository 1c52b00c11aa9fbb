"""``polymixer bench parity``: the table a user chooses a model from, and every family's linear-time models judged
against attention at equal budget.

It trains nothing: it reads the quality part of each family's bench (its ``<bench>.json`` in ``--out``, e.g.
``lm.json``), each comparison a family registers (:attr:`~polymixer.experiments.registry.LabFamily.comparisons`,
in the families' order), takes each model at its best learning rate (the rate the bench's sweep chose, or the
recipe's where the model was not swept) and writes, per family, every compared model
(attention, PoM, the value-carrying PoM, every hybrid) in the form it is compared as: its quality (median and range
over seeds), its gap to attention, its parameters relative to attention's, the speed of that same model, the paper's
figure beside the paper's models and the Pareto front (:func:`models_table`); then the issue's parity targets judged
(met / MISSED / unsettled / not run). Outputs: ``parity.txt`` (Markdown, its links relative to the repository root,
for the README), ``parity.json``.

Choices on validation only. Every choice — a model's form (``_choose``: its preset or an option), the hybrid a line
shows (``hybrid``), the best linear-time model (``best_linear``) and the all-PoM candidate (``all_pom``: PoM or the
value PoM) — is made on the family's validation figure (``Comparison.select``, direction ``Comparison.higher``), each
candidate scored by its median over the seeds it ran at that choice (``selection`` in the JSON). A candidate never
scored on validation is not chosen on the test figure instead: the report names it ("X not scored on validation:
not chosen"). Only where no candidate has a validation figure does a choice fall back to the reported figure's
median, and it says so (``picked_by``, ``hybrid_picked_by``, ``best_linear_picked_by``, ``all_pom_picked_by``).
Where attention's own choice passed over a form not scored on validation (recall: ``attention-shift``), the
baseline may be weaker than attention at its best: a "met" against it reads unsettled ("attention's X not scored on
validation") and the tables show the note beside the baseline (``note``).

Seeds: a family's runs of other seeds live beside its JSON, one folder per seed (``<bench>_seed<N>/<bench>.json``,
written by ``polymixer bench <family> --seed N --out <out>/<bench>_seed<N>``; for a JSON in a folder of its own,
such as ``image_heldout/image.json``, inside that folder). A model's runs there at the rate its seed-0 sweep chose
(same steps) count as its other seeds. Seed 0 is the selection seed: each bench's sweep chose the rates on it. A
reported figure is the median over the seeds a model shares with attention (never seeds attention did not run),
leaving seed 0 out where at least 3 other seeds ran (``reported_seeds``); otherwise over all of them, marked
``selection_seed_in_median`` (shown †). Each entry carries its ``range`` over those seeds and attention's
(``against_range``).

Verdicts settle on paired seeds (:mod:`~polymixer.experiments.bench.interval`): on each of those seeds the gap
between the model and attention, both trained on it at their own chosen rates (``paired_gaps``); the entry's
``gap`` is their mean, ``interval`` its 95% Student-t interval. A target is "met" where the whole interval lies
inside its bound, "MISSED" where it lies wholly outside, else "unsettled" — with the seeds it has and the next seed
to run (seeds are added one at a time up to 5), whose commands are the "to run" lines. Under 2 paired seeds a
verdict is unsettled; so is every verdict of a family whose reported figure is the figure its choices are made on
(no held-out test figure: :attr:`Comparison.heldout`), and every verdict an option not run, a choice on the
reported figure or a rate not shown to be best could change (below). A rate where any seed diverged or stalled
(:func:`_unhealthy`) is flagged and not chosen: the model is compared at its next best rate. A larger model at its
smaller model's rate carried over (``bench lm --larger``) is at a rate not bracketed at its own size: the verdicts
that rate could change are unsettled, with the sweep at that size.

Options (the fairness rule): a family offers every model the same variants of its preset — rotary positions
(image: ``+position=sincos_rope``), rotary dates (satellite: ``+date_rope=true``) and the token shift / short causal
convolution the value PoM carries, given to attention's keys and values (``+attention_shift=W``, the value PoM's
width; recall: the ``-shift`` variants) — so an option that helps attention as much as PoM raises the baseline
rather than crediting the mixer. A model's own forms are offered alike (``Comparison.forms``: the paper's PoM and
hybrid are compared in the paper's form, ``tiny-*-paper``, with polymixer's beside it; the LM's attention also in
GPT-2's learned positions). A variant that applies to a model but was not run is listed as "not run", and a
verdict it could change (attention not run with an option: a "met"; a hybrid not run with it: a "MISSED") reads
"unsettled"; so does a compared model not run in any form (listed with its preset and every option; a "MISSED" it
could meet). A verdict that differs from the one the earlier rule gave (forms and models picked on the main seed's
reported figure, no shift offered to attention) says so, with both figures.

Speed: the family's speed bench (``lm.json``'s throughput, the other benches' speed part; the ``<bench>.json`` in
``--out``; ``Comparison.speed_file`` where another bench times it): the throughput of the model's preset (or of the
form ``Comparison.timed_as`` names) ÷ attention's at the longest length both were timed (``Comparison.speed_length``:
at the family's own context), on the device the JSON names. A form with options (the token shift, rotary encodings,
another mixer or patch size) is timed as itself where its bench took it (``bench lm --kinds``, ``bench eo`` /
``bench points --presets`` with ``+field=value`` options); one no bench timed reads "not measured" — never its plain
preset's speed. The paper's figures (``Comparison.paper``, GPU scale) stand beside attention, PoM and the paper's
hybrid; the Pareto front marks the models no other is both better and faster than.

A family may judge targets of its own beside these: attention itself at a floor (``Comparison.attention_floor``;
recall: attention learns MQAR) and one its comparison computes (``Comparison.extra_target``; recall under Zoology's
recipe: the value PoM at least level with Based at every state size, length and form of Zoology's figure 2).

Beside a language-model comparison stands its count-based baseline (``Comparison.ngram_files``: ``bench lm --parts
ngram``, an interpolated n-gram of 0 to 5 tokens of context of the models' own tokens): each compared model's bits
per byte (test, else validation) against the best of those orders on the same split (``bits``); a model that does not
beat it is ``undertrained``, and each verdict on it ends "undertrained: …" (:func:`undertrained`) — the verdict itself
stays what its interval says. A comparison with no such baseline on file names the command that runs it.

Gaps are signed so that positive is worse than attention where the metric is a loss or a distance (val loss and
CER: relative; Fréchet distance: a ratio) and negative is worse where it is an accuracy (mIoU, MQAR: points).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from statistics import mean, median
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...files import write_text_atomic
from ..registry import comparisons
from ..report import format_table
from .common import best_rows, beyond, payload_seed, read_json, same_rate
from .comparison import Comparison
from .interval import MAX_SEEDS, paired_interval, settle

__all__ = ["comparisons", "family", "seeded_rows", "judge", "collect", "target_lines", "verdict_lines",
           "models_table", "report", "past_end", "gap_interval", "ngram_baseline", "undertrained", "ngram_lines",
           "main", "add_arguments"]


_SPEED_PARTS = ("throughput", "speed")  # where a family's bench keeps its speed rows
_LENGTHS = ("N", "side", "lines", "voxels")  # a speed row's length, named as the table names it
_TIMES = ("ms", "s_per_image", "s_per_call")  # a speed row's time per call (per image: already per item)


def _load(fam: Comparison, folder: Path) -> Optional[Dict[str, Any]]:
    """The family's main bench JSON, or None where it has none."""
    path = folder / fam.json_name
    return read_json(path) if path.is_file() else None


def _rows(fam: Comparison, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each model's row at its best rate, of the family's task and budget."""
    return [r for r in best_rows(rows) if all(r.get(k) == v for k, v in fam.where.items())]


def _longer_runs(fam: Comparison, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Attention's runs of the family's task trained for more steps than the equal budget (recall: attention leaves
    its loss plateau only with more steps), fewest steps first, the best rate first within a budget."""
    if "steps" not in fam.where:
        return []
    same = {k: v for k, v in fam.where.items() if k != "steps"}
    longer = [r for r in rows if r.get(fam.key) == fam.attention and isinstance(r.get("steps"), int)
              and r["steps"] > fam.where["steps"] and all(r.get(k) == v for k, v in same.items())
              and isinstance(r.get(fam.metric), (int, float))]
    return sorted(longer, key=lambda r: (r["steps"], -r[fam.metric] if fam.higher else r[fam.metric]))


def _beyond(fam: Comparison, raw: Sequence[Dict[str, Any]], row: Optional[Dict[str, Any]],
            ladder: Sequence[float] = ()) -> Optional[float]:
    """:func:`~polymixer.experiments.bench.common.beyond` for a family's compared row, chosen on its validation figure
    where it
    has one; ``ladder``: the grid of its sweep, whose next rate past an end is the one not run."""
    score = fam.select if row is not None and _number(row.get(fam.select)) else fam.metric
    return beyond(raw, row, fam.key, tuple(fam.where), score, fam.ceiling, ladder=ladder)


def _recipe_rate(fam: Comparison, data: Optional[Dict[str, Any]]) -> Optional[float]:
    """The recipe's rate the family's JSON was run with (None where it names none)."""
    config = (data or {}).get(fam.part, {}).get("config") or {}
    recipe = config.get("lr", config.get("quality_lr"))
    return recipe if _number(recipe) and recipe > 0 else None


def _form(option: str) -> str:
    """An option as the "not run" lines name it: the preset itself ("") as "its preset"."""
    return option or "its preset"


def _spec(fam: Comparison, name: str, form: str) -> str:
    """The spec of ``name``'s form ``form``: its preset with an option's suffix ("", "+…", recall's "-shift"), or
    another spec that is one of the model's own forms (``Comparison.forms``)."""
    return form if form in fam.forms.get(name, ()) and not form.startswith("+") else name + form


def past_end(e: Dict[str, Any]) -> str:
    """``e``'s model, its rate at the end of its sweep and the rate beyond it not run."""
    return f"{e['model']} at {e['lr']:g} ({e['beyond']:g} not run)"


def seeded_rows(fam: Comparison, payloads: List[Dict[str, Any]]) -> List[Tuple[int, Dict[str, Any]]]:
    """(seed, row) of every run of the family's task in other seeds' bench JSONs (``payloads``: what
    :func:`~polymixer.experiments.bench.common.seed_payloads` reads); rows written before sweeps existed carry no rate
    and get
    the recipe's of their file."""
    out = []
    for data in payloads:
        part = data.get(fam.part, {})
        config = part.get("config") or data.get("config") or {}
        for r in part.get("rows", []):
            if all(r.get(k) == v for k, v in fam.where.items()):
                out.append((int(config["seed"]), {"lr": config.get("lr"), **{k: v for k, v in r.items()
                                                                             if v is not None or k != "lr"}}))
    return out


def _by_seed(fam: Comparison, row: Dict[str, Any], seed: int, seeded: List[Tuple[int, Dict[str, Any]]],
             key: Optional[str] = None) -> Dict[int, float]:
    """The model's figure ``key`` (the metric unless named: ``fam.select``, its validation figure) per seed at
    ``row``'s rate and steps: ``row`` itself (seed ``seed``) and its seed folders, those with the figure only; a row
    that summarises its own seeds (recall: ``by_seed``, the metric their median; ``val_by_seed`` on validation) gives
    those."""
    key = key or fam.metric
    own = row.get("by_seed")
    if isinstance(own, dict) and own and all(_number(v) for v in own.values()):
        if key != fam.metric:  # the validation figure of each of its seeds
            own = row.get("val_by_seed")
            if not isinstance(own, dict):
                return {seed: float(row[key])} if _number(row.get(key)) else {}
        return {int(s): float(v) for s, v in sorted(own.items(), key=lambda kv: int(kv[0])) if _number(v)}
    values = {seed: row[key]} if _number(row.get(key)) else {}
    for s, r in seeded:
        if (r.get(fam.key) == row[fam.key] and _number(r.get(key))
                and r.get("steps") == row.get("steps") and s not in values
                and (r.get("lr") == row.get("lr") or (_number(r.get("lr")) and _number(row.get("lr"))
                                                      and same_rate(r["lr"], row["lr"])))):
            values[s] = r[key]
    return dict(sorted(values.items()))


def _validation(fam: Comparison, row: Dict[str, Any], seed: int, seeded: List[Tuple[int, Dict[str, Any]]]
                ) -> Optional[Dict[str, Any]]:
    """The row's validation figure (``fam.select``, unscaled) as its median over the seeds that have it and those
    seeds; None where it was never scored on validation (or the family has no validation figure)."""
    values = _by_seed(fam, row, seed, seeded, fam.select) if fam.select else {}
    return {"median": median(values.values()), "seeds": sorted(values)} if values else None


def _reported(seeds: Sequence[int], selection_seed: int) -> Tuple[List[int], bool]:
    """The seeds a reported median is over: those other than the selection seed (the seed the sweeps chose the
    rates on) where at least 3 of them ran, else all; and whether the selection seed is among them."""
    others = [s for s in seeds if s != selection_seed]
    chosen = others if len(others) >= 3 else list(seeds)
    return chosen, selection_seed in chosen


def _best(higher: bool, options: Sequence[Tuple[str, Any, Optional[float], float]], noun: str
          ) -> Tuple[Any, str, List[str]]:
    """The best of ``options`` — (name, candidate, its median validation figure or None, its median reported
    figure) — on validation among those scored there (the first of equals: the plain preset), how it was chosen, and
    the names passed over for want of a validation figure; on the reported figure only where none was scored."""
    pick = max if higher else min
    scored = [o for o in options if o[2] is not None]
    if scored:
        unscored = [o[0] for o in options if o[2] is None]
        how = "validation" + (f" ({', '.join(unscored)} not scored on validation: not chosen)" if unscored else "")
        return pick(scored, key=lambda o: o[2])[1], how, unscored
    return pick(options, key=lambda o: o[3])[1], f"the reported figure (no {noun} has a validation figure)", []


def _main_seed(fam: Comparison, data: Dict[str, Any]) -> int:
    """The seed of the family's main JSON (0 where it names none)."""
    return payload_seed(data, fam.part) or 0


def _gap(fam: Comparison, value: float, base: float) -> float:
    if fam.gap == "relative":
        return value / base - 1
    if fam.gap == "ratio":
        return value / base
    return (value - base) * fam.scale


def _gap_text(kind: str, gap: float, target: Optional[float] = None) -> str:
    """The gap of ``kind`` (a ``Comparison.gap``) as the table shows it; one more digit where it would read as the
    ``target`` it misses or meets."""
    def text(extra: int) -> str:
        return {"relative": f"{100 * gap:+.{1 + extra}f}%", "ratio": f"{gap:.{2 + extra}f}×"}.get(
            kind, f"{gap:+.{1 + extra}f}")

    if target is not None and gap != target and text(0) == _gap_text(kind, target):
        return text(1)
    return text(0)


def _bound(fam: Comparison, target: float) -> str:
    if fam.gap == "points":
        return f"{-target:g} point" + ("" if abs(target) == 1 else "s")
    return _gap_text(fam.gap, target)


def _worse(fam: Comparison, gap: float, target: float) -> bool:
    """Whether ``gap`` misses ``target`` (a bound on how much worse than attention)."""
    return gap < target if fam.gap == "points" else gap > target


def _entry(fam: Comparison, row: Optional[Dict[str, Any]], base: Optional[Dict[str, Any]], seed: int = 0,
           seeded: Optional[List[Tuple[int, Dict[str, Any]]]] = None) -> Dict[str, Any]:
    """A model's figures in the form ``row``: its seeds, its validation median (``selection``), its reported median
    over the seeds it shares with attention (``base``; seed ``seed``, the selection seed, left out where 3 others
    ran), their range and, against attention, the gap and attention's median and range over the same seeds."""
    if row is None or not _number(row.get(fam.metric)):
        return {"run": False}
    seeded = seeded or []
    mine = _by_seed(fam, row, seed, seeded)
    out = {"run": True, "model": row[fam.key], "lr": row.get("lr"), "rates": row.get("rates", 1),
           "own_seeds": sorted(mine), "selection_seed": seed, "selection": _validation(fam, row, seed, seeded)}
    compared = base is not None and row is not base and _number(base.get(fam.metric))
    theirs = _by_seed(fam, base, seed, seeded) if compared else {}
    seeds, in_median = _reported([s for s in mine if s in theirs] if compared else list(mine), seed)  # seeds both ran
    value = median(mine[s] for s in seeds)
    out |= {"value": value * fam.scale, "by_seed": {s: mine[s] * fam.scale for s in seeds}, "reported_seeds": seeds,
            "selection_seed_in_median": in_median,
            "range": [min(mine[s] for s in seeds) * fam.scale, max(mine[s] for s in seeds) * fam.scale],
            "seeds": row.get("seeds", len(seeds))}
    if not compared:
        return out
    against = median(theirs[s] for s in seeds)
    paired = {s: _gap(fam, mine[s], theirs[s]) for s in seeds}  # each seed's gap, both sides trained on it
    stats = paired_interval(list(paired.values()))
    return out | {"gap": mean(paired.values()), "paired_gaps": paired,
                  "interval": None if stats is None else [stats[1], stats[2]],
                  "median_gap": _gap(fam, value, against), "against": against * fam.scale,
                  "against_range": [min(theirs[s] for s in seeds) * fam.scale,
                                    max(theirs[s] for s in seeds) * fam.scale]}


def _seeds_run(e: Dict[str, Any], attention: Dict[str, Any]) -> List[int]:
    """The seeds either side of a verdict ran (at its chosen rate)."""
    return sorted(set(e.get("own_seeds", [])) | set(attention.get("own_seeds", [])))


def _next_seed(seeds: Sequence[int]) -> int:
    """The lowest seed not among ``seeds``."""
    return next(s for s in range(len(seeds) + 1) if s not in seeds)


def _wanted_seeds(e: Dict[str, Any], attention: Dict[str, Any]) -> List[int]:
    """The seeds a verdict waiting on seeds asks both sides to have run: those either ran, and new ones (the
    lowest first) until 3 — or, where both ran the same 3 or more, one more, up to
    :data:`~polymixer.experiments.bench.interval.MAX_SEEDS`."""
    seeds = _seeds_run(e, attention)
    lacking = any(s not in who.get("own_seeds", []) for s in seeds for who in (e, attention))
    want = max(len(seeds), min(MAX_SEEDS, max(3, len(seeds) + (0 if lacking else 1))))
    while len(seeds) < want:
        seeds = sorted(seeds + [_next_seed(seeds)])
    return seeds


def _verdict(fam: Comparison, e: Optional[Dict[str, Any]], target: float, attention: Dict[str, Any],
             doubts: Sequence[str] = ()) -> Dict[str, Any]:
    """The verdict on ``e`` against ``target`` from its paired gaps (:func:`_entry`): "met" where the 95% interval
    of their mean lies inside the bound, "MISSED" where it lies wholly outside, else "unsettled" — and unsettled
    too, whatever the interval, under 2 paired seeds, where the family has no held-out test figure, and where
    anything in ``doubts`` could change it (options not run, choices on the reported figure, rates not shown to be
    best: :meth:`_Judging.missing`). With the verdict: the paired gaps, their mean and interval, the seeds, the
    reason, and whether a seed is to run (``needs_seeds``: a straddling interval or too few seeds, while fewer than
    :data:`~polymixer.experiments.bench.interval.MAX_SEEDS` seeds ran)."""
    if e is None:
        return {"verdict": "not run", "reason": "not run"}
    gaps = e.get("paired_gaps") or {}
    out = {"paired_gaps": gaps, "mean_gap": e["gap"], "interval": e.get("interval"), "seeds": len(gaps)}
    both = set(e.get("own_seeds", [])) & set(attention.get("own_seeds", []))
    new = [s for s in _wanted_seeds(e, attention) if s not in both]
    then = (f"seed{'s' if len(new) > 1 else ''} {', '.join(map(str, new))} to run (up to {MAX_SEEDS})" if new
            else f"{len(both)} seeds ran")
    read = None if e.get("interval") is None else settle(*e["interval"], target, fam.gap == "points")
    # what the figures alone read (the interval's reading; on one seed its gap's side of the bound): the reading a
    # simpler rule is compared on
    out["reads"] = read or ("MISSED" if _worse(fam, e["gap"], target) else "met")
    if read is None:
        why = [f"{len(gaps)} paired seed{'s' if len(gaps) != 1 else ''} (an interval needs 2); {then}"]
    else:
        why = [f"the interval straddles {_bound(fam, target)} on {len(gaps)} seeds; {then}"] if read == "unsettled" \
            else []
    if not fam.heldout:
        doubts = [f"no held-out test figure ({fam.label} is both the figure chosen on and the one reported)",
                  *doubts]
    out["needs_seeds"] = bool(why)
    if why or doubts:
        reason = "; ".join(why + ([f"its interval alone reads {read}"] if read in ("met", "MISSED") else [])
                           + list(doubts))
        return out | {"verdict": f"unsettled: {reason}", "reason": reason}
    return out | {"verdict": read, "reason": f"the interval lies {'inside' if read == 'met' else 'outside'} "
                                             f"{_bound(fam, target)}"}


def _seed_commands(fam: Comparison, data: Optional[Dict[str, Any]], attention: Dict[str, Any],
                   models: Sequence[Dict[str, Any]]) -> List[str]:
    """The commands that run the seeds the verdicts on ``models`` wait on (:func:`_wanted_seeds`), each side at
    the rate its sweep chose, into the seed folders. None where the family keeps its seeds another way (recall) or
    its JSON names no recipe rate."""
    recipe = _recipe_rate(fam, data)
    if not fam.seed_folders or "--lr-factors" not in fam.command or recipe is None:
        return []
    out: List[str] = []
    for e in models:
        for who in (attention, e):
            for seed in _wanted_seeds(e, attention):
                if seed not in who.get("own_seeds", []) and _number(who.get("lr")):
                    command = fam.seed_command(who["model"], who["lr"] / recipe, seed)
                    if command not in out:
                        out.append(command)
    return out


def _bounds(kind: str, interval: Sequence[float]) -> str:
    """An interval of gaps of ``kind`` as the tables show it, without the unit: "[-4.1, +28.7]" (relative, in %),
    "[0.95, 1.23]" (ratio), "[-0.5, +4.3]" (points)."""
    def one(v: float) -> str:
        return {"relative": f"{100 * v:+.1f}", "ratio": f"{v:.2f}"}.get(kind, f"{v:+.1f}")

    return f"[{one(interval[0])}, {one(interval[1])}]"


def gap_interval(kind: str, e: Dict[str, Any], target: Optional[float] = None, seeds: bool = True) -> str:
    """A model's mean paired gap to attention with its 95% interval and (``seeds``) the number of paired seeds:
    "+12.3% [-4.1, +28.7] (3 seeds)"; the gap alone where it has one seed."""
    n = len(e.get("paired_gaps") or {}) or 1
    text = _gap_text(kind, e["gap"], target)
    if e.get("interval"):
        text += f" {_bounds(kind, e['interval'])}"
    return f"{text} ({n} seed{'s' if n > 1 else ''})" if seeds else text


def _measured(fam: Comparison, e: Dict[str, Any], target: float) -> str:
    """The model, its mean paired gap (precise enough to tell it from ``target``) with the 95% interval and, over
    several seeds, which seeds (``†``: the selection seed among them)."""
    text = f"{e['model']} {gap_interval(fam.gap, e, target)}"
    if len(e.get("paired_gaps") or {}) < 2:
        return text
    mark = " †" if e.get("selection_seed_in_median") else ""
    return text[:-1] + f": seeds {', '.join(map(str, e.get('reported_seeds', sorted(e['paired_gaps']))))}{mark})"


def family(bench: str) -> Comparison:
    """The parity family whose results are ``<bench>.json``."""
    for fam in comparisons():
        if fam.bench == bench:
            return fam
    names = ", ".join(dict.fromkeys(f.bench for f in comparisons()))
    raise ValueError(f"no parity family reads {bench}.json (families: {names})")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _has_attention(fam: Comparison, name: str) -> bool:
    """Whether the compared model has attention layers (attention and every hybrid): the token shift applies."""
    return name == fam.attention or name in fam.hybrids + fam.full_hybrids


def _choose(fam: Comparison, by: Dict[str, Dict[str, Any]], name: str, fair: bool, seed: int = 0,
            seeded: Sequence[Tuple[int, Dict[str, Any]]] = ()) -> Tuple[Optional[Dict[str, Any]], List[str], str,
                                                                     List[str]]:
    """The model's form it is compared as: its preset, a variant (``fam.options`` that apply to it) or, under the
    fair rule, another run of its own preset fields (``fam.tuned``), whichever scores best on the median validation
    figure over the seeds each form ran (``fair``; forms never scored on validation are not chosen, and are named),
    else on the reported figure (``fair`` False: the earlier rule, options on the main seed's reported figure, no
    shift offered); the options that apply but were not run; how it was picked; the forms passed over for want of a
    validation figure."""
    options = [o for o in fam.options if (fair or o not in fam.shift_options)
               and (o not in fam.shift_options or _has_attention(fam, name))]
    mine = [o for o in fam.value_options if fair and name == fam.value]
    own = list(fam.forms.get(name, ()))  # the model's own forms (polymixer's beside the paper's), with the options
    forms = [name] + [name + o for o in options + mine] + [_spec(fam, name, f) + o for f in own for o in [""] + options]
    if fair and fam.tuned:  # the model's own run variants over its preset's fields (and the options' fields)
        allowed = set(fam.tuned) | {kv.split("=")[0] for o in options for kv in o.split("+")[1:]}
        fixed = {kv for o in mine for kv in o.split("+")[1:]}  # the value PoM's own forms: with their values only
        forms += [n for n in by if n.startswith(name + "+") and n not in forms
                  and all(kv.split("=")[0] in allowed or kv in fixed for kv in n[len(name) + 1:].split("+"))]
    options += mine
    def ran(spec: str) -> bool:  # a run with the reported figure (a row without it, such as an LM run before the
        return spec in by and _number(by[spec].get(fam.metric))  # bench recorded a test loss, is a form not run)

    found = [by[n] for n in forms if ran(n)]
    # the forms not run: the options, and the preset itself ("") where it has no run either (a model not run in any
    # form lists all of them: it is a candidate its verdicts have not seen)
    missing = [o for o in ([] if ran(name) else [""]) + options + own if not ran(_spec(fam, name, o))]
    if not found:
        return None, missing, "", []
    if len(found) == 1:
        return found[0], missing, "", []  # nothing to choose from
    if not fair:  # the earlier rule: the main seed's reported figure
        return (max if fam.higher else min)(found, key=lambda r: r[fam.metric]), missing, "the reported figure", []
    seeded = list(seeded)
    scores = []
    for r in found:
        val = _validation(fam, r, seed, seeded)
        scores.append((r[fam.key], r, None if val is None else val["median"],
                       median(_by_seed(fam, r, seed, seeded).values())))
    chosen, how, unscored = _best(fam.higher, scores, "form")
    return chosen, missing, how, unscored


class _Judging:
    """One family's judgement in the making: its rows, the form each compared model was picked in, the entries
    made so far (``item``), and the models whose verdicts wait on a rate (``unswept``: run at one rate only;
    ``past``: best at an end of their rates), in the order the verdicts named them."""

    def __init__(self, fam: Comparison, data: Optional[Dict[str, Any]], seeded: List[Tuple[int, Dict[str, Any]]],
                 fair: bool, ngram: Optional[Dict[str, Any]] = None) -> None:
        self.fam, self.data, self.seeded, self.fair, self.ngram = fam, data, seeded, fair, ngram
        part = {} if data is None else data.get(fam.part, {})
        self.raw, self.ladder = part.get("rows", []), part.get("grid", [])  # every rate and budget; its sweep's grid
        self.seed = _main_seed(fam, data or {})
        # each model at a rate where no seed diverged or stalled; the rates passed over, and those kept for want of
        # another (``flagged``, by model and rate)
        self.rows, self.flagged, self.rate_flags = (None, {}, []) if data is None else _healthy(
            fam, self.raw, _rows(fam, self.raw), self.seed, seeded)
        self.by = {r[fam.key]: r for r in self.rows or []}
        self.picked: Dict[str, Tuple[Optional[Dict[str, Any]], List[str], str, List[str]]] = {}
        self.base = self.pick(fam.attention)
        self.item: Dict[str, Any] = {}
        self.absent: List[str] = []  # compared models never run in any form
        self.linear: List[Dict[str, Any]] = []  # the linear-time models' entries that have a gap
        self.unswept: List[Dict[str, Any]] = []
        self.past: List[Dict[str, Any]] = []
        self.carried: List[Dict[str, Any]] = []  # larger models at a rate carried over from the smaller size

    def pick(self, name: str) -> Optional[Dict[str, Any]]:
        """The row of the form ``name`` is compared as (:func:`_choose`), remembered with its forms not run."""
        self.picked[name] = _choose(self.fam, self.by, name, self.fair, self.seed, self.seeded)
        return self.picked[name][0]

    def entry(self, name: Optional[str], row: Optional[Dict[str, Any]] = None, compared: bool = True) -> Dict[str, Any]:
        """``name``'s entry (:func:`_entry`; against attention where ``compared``) in its picked form (or ``row``),
        with its forms not run, how it was picked, its rate's standing and its parameters relative to attention."""
        fam = self.fam
        if name is None:  # a model the family does not compare (the prose LM has no value PoM)
            return {"run": False}
        row = self.pick(name) if row is None else row
        e = _entry(fam, row, self.base if compared else None, self.seed, self.seeded)
        if e["run"]:
            e["preset"] = name  # the compared model whose form this is
            e["not_run"] = self.picked[name][1]
            e["picked_by"] = self.picked[name][2]
            # chosen on the reported figure: its form, or its rate (a run without a validation figure)
            e["on_reported"] = self.fair and bool(fam.select) and not _number(row.get(fam.select))
            # a larger model (its row names its ``smaller`` one: bench lm --larger) runs at its smaller model's
            # chosen rate carried over by the width rule: a rate not bracketed at its own size
            e["carried"] = bool(row.get("smaller"))
            e["beyond"] = None if e["carried"] else _beyond(fam, self.raw, row, self.ladder)
            e["one_rate"] = row.get("rates") == 1 and not e["carried"]  # its sweep says it ran one rate only
            if row.get("lr") in self.flagged.get(row[fam.key], {}):  # every rate of it diverged or stalled
                e["unhealthy"] = self.flagged[row[fam.key]][row["lr"]]
            params, base_params = row.get("params"), (self.base or {}).get("params")
            if _number(params) and _number(base_params) and base_params:
                e["params"] = params
                e["params_vs_attention"] = params / base_params - 1
            if self.picked.get(name, (None, [], "", []))[3] and row is self.picked[name][0]:
                e["unscored"] = self.picked[name][3]  # forms passed over for want of a validation figure
            self.bits(e, row)
        return e

    def bits(self, e: Dict[str, Any], row: Dict[str, Any]) -> None:
        """With an n-gram baseline (:func:`ngram_baseline`): ``e``'s bits per byte against it (``bits``) — the
        median over its reported seeds of ``test_bpb`` where every one of them has it, else of ``val_bpb`` (the
        validation figure, marked so) —, the n-gram's best over its orders on that split, and ``undertrained``:
        the model does not beat it."""
        if self.ngram is None:
            return
        for split in ("test", "val"):
            per = _by_seed(self.fam, row, self.seed, self.seeded, f"{split}_bpb")
            values = [per[s] for s in e["reported_seeds"] if s in per]
            bar = self.ngram.get(split)
            if bar and values and len(values) == len(e["reported_seeds"]):
                bpb = median(values)
                e["bits"] = {"bpb": bpb, "split": split, "ngram": bar["best"], "ngram_order": bar["best_order"],
                             "tokenizer": self.ngram["tokenizer"]}
                e["undertrained"] = bpb >= bar["best"]
                return

    def missing(self, e: Optional[Dict[str, Any]], candidates: List[Dict[str, Any]], target: float,
                names: Sequence[str] = ()) -> List[str]:
        """What could change the verdict on ``e``: the options not run — attention's (it could only do better, so
        they matter to a "met") and the linear-time candidates' (they matter to a "MISSED") —, a choice of form or
        rate made on the reported figure, by attention or ``e``, and (to a "met") attention's forms passed over for
        want of a validation figure: the baseline may be weaker than attention at its best."""
        if e is None:
            return []
        fam, attention = self.fam, self.item["attention"]
        worse = _worse(fam, e["gap"], target)
        who = [attention] if not worse else [c for c in candidates if c.get("not_run")]
        runs = [f"{c.get('preset', c['model']) if fam.key != 'variant' else c['model']} "
                f"{' / '.join(map(_form, c['not_run']))}" for c in who if c.get("run") and c.get("not_run")]
        if worse:  # a candidate never run in any form could meet it
            runs += [f"{name} (any form)" for name in self.absent if name in names]
        out = [f"not run with {', '.join(runs)}"] if runs else []
        test = [c["model"] for c in (attention, e) if c.get("on_reported")]
        if test:
            out.append(f"{' and '.join(test)} chosen on the reported figure (no validation figure)")
        if not worse and attention.get("unscored"):  # the baseline passed over a form it could not score
            out.append(f"attention's {', '.join(attention['unscored'])} not scored on validation")
        return out + self._rate_doubts([attention] if not worse else [e])

    def _rate_doubts(self, side: List[Dict[str, Any]]) -> List[str]:
        """The two models a verdict compares must each be at a rate shown to be its best, where a better rate would
        flip it — attention for a "met", the judged model for a "MISSED" (``side``) — not run at one rate only
        (never swept), not best at an end of its rates. Those that are are remembered for the "to run" lines."""
        side = [c for c in side if c.get("run")]
        out: List[str] = []
        carried = [c for c in side if c.get("carried")]
        if carried:
            out.append(f"rate carried over from the smaller size, not bracketed at its own: "
                       f"{', '.join(c['model'] for c in carried)}")
            self.carried.extend(c for c in carried if c not in self.carried)
        sick = [c for c in side if c.get("unhealthy")]
        if sick:
            out.append(f"every rate run {'; '.join(c['unhealthy'] for c in sick)}")
        single = [c for c in side if c.get("one_rate")]
        if single:
            out.append(f"run at one rate only: {', '.join(c['model'] for c in single)}")
            self.unswept.extend(c for c in single if c not in self.unswept)
        ends = [c for c in side if c.get("beyond")]
        if ends:
            out.append(f"best at an end of the rates tried: {', '.join(past_end(c) for c in ends)}")
            self.past.extend(c for c in ends if c not in self.past)
        return out


def _judge(fam: Comparison, data: Optional[Dict[str, Any]], seeded: List[Tuple[int, Dict[str, Any]]],
           fair: bool = True, ngram: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """:func:`judge` under the fair rule (``fair``) or the earlier one (forms and models picked on the main seed's
    reported figure, no token shift offered)."""
    j = _Judging(fam, data, seeded, fair, ngram)
    item = _compared(j)
    item["ngram"] = ngram
    targets: List[Dict[str, Any]] = []
    waiting: List[Dict[str, Any]] = []  # the models whose verdict waits on seeds
    attention = item["attention"]

    def add(e: Optional[Dict[str, Any]], bound: float, doubts: List[str], what: str, short: str) -> None:
        verdict = _verdict(fam, e, bound, attention, doubts)
        under = undertrained([c for c in (e, attention) if c])
        if under:  # a side that does not beat the count-based baseline: the verdict says so
            verdict |= {"verdict": f"{verdict['verdict']}; {under}", "undertrained": under}
        targets.append({"what": what, "short": short, **verdict,
                        "measured": None if e is None else _measured(fam, e, bound)})
        if verdict.get("needs_seeds") and e not in waiting:
            waiting.append(e)

    if fam.best_target is not None:
        best, bound = item["best_linear"], _bound(fam, fam.best_target)
        add(best, fam.best_target, j.missing(best, j.linear, fam.best_target, [fam.pom, fam.value, *fam.hybrids]),
            f"best without full attention within {bound}", f"no full attention within {bound}")
    if fam.all_target is not None:
        alls = [e for e in (item["pom"], item["value"]) if e["run"] and "gap" in e]
        top, bound = item["all_pom"], _bound(fam, fam.all_target)  # PoM or the value PoM: validation's choice
        add(top, fam.all_target, j.missing(top, alls, fam.all_target, [fam.pom, fam.value]),
            f"all-PoM or all-value-PoM within {bound}", f"all-PoM within {bound}")
    for preset, bound in fam.paper_targets:
        e = _paper_model(item, preset)
        paper = _paper(fam, item, preset)[1]
        add(e, bound, j.missing(e, [e] if e else [], bound, [preset]),
            f"the paper's {preset} within {_bound(fam, bound)}" + (f" (the paper: {paper})" if paper else ""),
            f"paper's {'PoM' if preset == fam.pom else 'hybrid'} within {_bound(fam, bound)}")
    if fam.attention_floor is not None:  # attention itself, without the shift
        targets.append(_attention_unshifted(j))
    if fam.extra_target is not None:  # the family's own target
        target, commands = fam.extra_target(fam, data)
        targets.append(target)
        item["to_run"] += commands
    item["targets"] = targets
    item["to_run"] += _seed_commands(fam, data, item["attention"], waiting)
    item["to_run"] += _rate_commands(j)
    return item


STALL_SPAN, STALL_DROP = 0.1, 0.02  # a stall: over a tenth of a run's steps, in its first half, under 2% lower


def _unhealthy(fam: Comparison, row: Dict[str, Any]) -> Optional[str]:
    """Why a run cannot stand for its rate, else None: a figure that is not finite, a training loss (its
    ``train_curve``) that ends at or above where it began — diverged —, or one that stalls in the first half of the
    run, where training still falls fast: over a stretch of at least ``STALL_SPAN`` of its steps it falls by under
    ``STALL_DROP`` of its value. A row without a curve is judged on its figures alone (no stall can be seen)."""
    for key in (fam.metric, fam.select, "final_loss"):
        v = row.get(key) if key else None
        if isinstance(v, float) and not math.isfinite(v):
            return f"diverged ({key} {v})"
    curve = [(step, loss) for step, loss in row.get("train_curve") or []]
    if len(curve) < 2:
        return None
    (s0, first), (s1, last) = curve[0], curve[-1]
    if not all(math.isfinite(loss) for _, loss in curve) or last >= first:
        return f"diverged (training loss {first:g} at step {s0}, {last:g} at {s1})"
    steps = row.get("steps") if _number(row.get("steps")) else s1
    early = [(step, loss) for step, loss in curve if step <= steps / 2]
    for i, (a, la) in enumerate(early):
        b, lb = next(((st, lo) for st, lo in early[i + 1:] if st - a >= STALL_SPAN * steps), (None, la))
        if b is not None and lb > la * (1 - STALL_DROP):
            return f"stalled (training loss {la:g} at step {a}, {lb:g} at {b})"
    return None


def _rate_health(fam: Comparison, row: Dict[str, Any], seed: int, seeded: Sequence[Tuple[int, Dict[str, Any]]]
                 ) -> Optional[str]:
    """Why ``row``'s rate cannot be chosen: the first of its seeds' runs at that rate (``row`` itself, seed
    ``seed``, and the seed folders') that diverged or stalled (:func:`_unhealthy`), else None."""
    runs = [(seed, row)] + [(s, r) for s, r in seeded if r.get(fam.key) == row.get(fam.key)
                            and r.get("steps") == row.get("steps") and _number(r.get("lr"))
                            and _number(row.get("lr")) and same_rate(r["lr"], row["lr"])]
    for s, r in runs:
        why = _unhealthy(fam, r)
        if why:
            return f"{why} on seed {s}"
    return None


def _healthy(fam: Comparison, raw: Sequence[Dict[str, Any]], rows: List[Dict[str, Any]], seed: int,
             seeded: Sequence[Tuple[int, Dict[str, Any]]]
             ) -> Tuple[List[Dict[str, Any]], Dict[str, Dict[float, str]], List[str]]:
    """Each model's row at a rate none of whose seeds diverged or stalled: its sweep's choice, or, where a seed
    did at that rate, the best of its other rates (on the validation figure, else the reported one; its other
    seeds then run at that rate) whose seeds did not. With the rates kept for want of a healthy one (by model and
    rate: why) and a line for each rate flagged."""
    out, flagged, lines = [], {}, []
    sign = 1 if fam.higher else -1
    compared = [m for m in (fam.attention, fam.pom, fam.value, *fam.hybrids, *fam.full_hybrids) if m]
    for row in rows:
        name = str(row.get(fam.key))
        why = None if not any(name == m or name.startswith(m + "+") for m in compared) else _rate_health(
            fam, row, seed, seeded)  # a model no target compares is not judged here
        if why is None:
            out.append(row)
            continue
        score = fam.select if fam.select and _number(row.get(fam.select)) else fam.metric
        others = [r for r in raw if r is not row and r.get(fam.key) == row[fam.key] and r.get("steps") == row.get(
            "steps") and all(r.get(k) == v for k, v in fam.where.items()) and _number(r.get(score))
                  and _rate_health(fam, r, seed, seeded) is None]
        pick = max(others, key=lambda r: sign * r[score]) if others else None
        rate = f"{row[fam.key]} at {row.get('lr'):g}" if _number(row.get("lr")) else row[fam.key]
        if pick is None:
            flagged.setdefault(row[fam.key], {})[row.get("lr")] = f"{rate}: {why}"
            lines.append(f"rate flagged: {rate} {why}, and no other rate of it ran clean: kept, its verdicts "
                         f"unsettled")
            out.append(row)
        else:
            lines.append(f"rate flagged and not chosen: {rate} {why}; its next best rate {pick.get('lr'):g} "
                         f"instead")
            out.append(pick)
    return out, flagged, lines


def _paper_model(item: Dict[str, Any], preset: str) -> Optional[Dict[str, Any]]:
    """The entry of the paper's model ``preset`` (PoM or one of the hybrids) in the form it is compared as; None
    where it has not run."""
    for e in [item["pom"], *item.get("hybrids", [])]:
        if e.get("run") and "gap" in e and e.get("preset") == preset:
            return e
    return None


def ngram_baseline(fam: Comparison, parts: Sequence[Tuple[str, Optional[Dict[str, Any]]]]
                   ) -> Optional[Dict[str, Any]]:
    """The comparison's count-based baseline from the first of ``parts`` — (file, its ``ngram`` part), in
    ``Comparison.ngram_files``' order — with rows of its models' tokens (``Comparison.tokenizer``): on each split
    scored (``test``, ``val``) the bits per byte by order (``by_order``: [order, bpb], 0 to 5 tokens of context) and
    the best of them (``best``, ``best_order``). None where no part has such rows."""
    for file, part in parts:
        rows = sorted((r for r in (part or {}).get("rows", []) if r.get("tokenizer", "bytes") == fam.tokenizer
                       and _number(r.get("order"))), key=lambda r: r["order"])
        out: Dict[str, Any] = {"file": file, "tokenizer": fam.tokenizer}
        for split in ("test", "val"):
            bpb = [[int(r["order"]), float(r[f"{split}_bpb"])] for r in rows if _number(r.get(f"{split}_bpb"))]
            if bpb:
                order, best = min(bpb, key=lambda ob: ob[1])
                out[split] = {"by_order": bpb, "best": best, "best_order": order}
        if "test" in out or "val" in out:
            return out
    return None


def _ngram_parts(fam: Comparison, data: Dict[str, Any]) -> List[Tuple[str, Optional[Dict[str, Any]]]]:
    """The n-gram parts a family's own report reads (``Comparison.ngram_files``' order): its JSON's own, then those
    beside the folder it was written to (its configuration's ``out``, the benches' folder that many levels up)."""
    parts = [(fam.json_name, data.get("ngram"))]
    out = (data.get("config") or {}).get("out")
    if isinstance(out, str) and out:
        root = Path(out)
        for _ in Path(fam.json_name).parent.parts:
            root = root.parent
        parts += [(name, read_json(root / name).get("ngram")) for name in fam.ngram_files
                  if name != fam.json_name and (root / name).is_file()]
    return parts


def undertrained(side: Sequence[Dict[str, Any]]) -> str:
    """The models of ``side`` (compared entries) that do not beat their n-gram baseline, as a verdict says it:
    "undertrained: tiny-pom 2.31 bits per byte against the n-gram's 1.90 (test, bytes, order 5)"; "" where none."""
    under = [c for c in side if c.get("undertrained")]
    return "" if not under else "undertrained: " + ", ".join(
        f"{c['model']} {c['bits']['bpb']:.2f} bits per byte against the n-gram's {c['bits']['ngram']:.2f} "
        f"({'test' if c['bits']['split'] == 'test' else 'validation'}, {c['bits']['tokenizer']}, "
        f"order {c['bits']['ngram_order']})" for c in under)


def ngram_lines(item: Dict[str, Any]) -> List[str]:
    """The comparison's n-gram baseline beside its models: bits per byte by order on each split, its best, and each
    compared model's bits per byte against it (test, else validation, so marked); or the command that runs it."""
    ngram = item.get("ngram")
    if ngram is None:
        return [f"no n-gram baseline run: `{item['ngram_missing']}`"] if item.get("ngram_missing") else []
    splits = []
    for split, word in (("test", "test"), ("val", "validation")):
        if split in ngram:
            n = ngram[split]
            splits.append(f"on {word} {' / '.join(f'{v:.3f}' for _, v in n['by_order'])} (orders "
                          f"{n['by_order'][0][0]}–{n['by_order'][-1][0]}; best: order {n['best_order']}, "
                          f"{n['best']:.3f})")
    models = [m for m in (item["attention"], item["pom"], item["value"], *item.get("hybrids", []))
              if m.get("run") and m.get("bits")]
    shown = [f"{m['model']} {m['bits']['bpb']:.3f}" + ("" if m["bits"]["split"] == "test" else " (validation)")
             + (" — undertrained" if m.get("undertrained") else "") for m in models]
    return [f"n-gram baseline ({ngram['tokenizer']}, {ngram['file']}), bits per byte " + "; ".join(splits)
            + (f"; the compared models: {', '.join(shown)}" if shown else "")]


def _compared(j: _Judging) -> Dict[str, Any]:
    """The family's comparison without its targets: attention, PoM, the value PoM and every hybrid in the form each
    is compared as, the hybrid a line shows, the best linear-time model and the all-PoM candidate (each chosen on
    validation, :func:`_pick_entry`), and the forms not run (with the commands that run them). Leaves the item and
    the linear-time candidates (``linear``) on ``j``."""
    fam, rows = j.fam, j.rows
    item: Dict[str, Any] = {"family": fam.name, "bench": fam.bench, "metric": fam.label, "higher": fam.higher,
                            "gap_kind": fam.gap, "guide": fam.guide, "found": rows is not None,
                            "options": list(fam.options), "value_options": list(fam.value_options),
                            "forms": {name: list(forms) for name, forms in fam.forms.items()},
                            "select": fam.select, "file": fam.file, "heldout": fam.heldout,
                            "rate_flags": list(j.rate_flags),
                            "presets": {"attention": fam.attention, "pom": fam.pom, "value": fam.value},
                            "attention": j.entry(fam.attention, j.base, compared=False), "pom": j.entry(fam.pom),
                            "value": j.entry(fam.value)}
    hybrids = [j.entry(h) | {"full_attention": h in fam.full_hybrids} for h in fam.hybrids + fam.full_hybrids]
    # every compared model has been picked (``entry``); one never run in any form has all its forms to run
    found = rows is not None  # without the family's JSON nothing is "not run": the family is
    item["not_run"] = {name: miss for name, (row, miss, _, _) in j.picked.items() if miss and found}
    item["to_run"] = [_first_command(j, _spec(fam, name, o)) for name, miss in item["not_run"].items() for o in miss
                      if fam.command]
    item["absent"] = j.absent = [name for name, (row, _, _, _) in j.picked.items() if row is None and found]
    item["hybrids"] = hybrids = [h for h in hybrids if h["run"] and "gap" in h]
    hybrid, item["hybrid_picked_by"] = _pick_entry(j, hybrids)
    item["hybrid"] = hybrid or {"run": False}
    item["hybrid_presets"] = list(fam.hybrids + fam.full_hybrids)
    j.linear = [e for e in [item["pom"], item["value"]] + [h for h in hybrids if not h["full_attention"]]
                if e["run"] and "gap" in e]
    item["best_linear"], item["best_linear_picked_by"] = _pick_entry(j, j.linear)
    all_pom, item["all_pom_picked_by"] = _pick_entry(j, [e for e in (item["pom"], item["value"])
                                                         if e["run"] and "gap" in e])
    item["all_pom"] = all_pom
    unscored = item["attention"].get("unscored") or []
    if unscored:  # the baseline passed over forms it could not score: a "met" against it is unsettled
        forms = ", ".join(unscored) if len(", ".join(unscored)) <= 40 else f"{len(unscored)} forms"
        item["attention"]["note"] = f"{forms} not scored on validation: a met against it is unsettled"
    j.item = item
    return item


def _pick_entry(j: _Judging, entries: List[Dict[str, Any]]) -> Tuple[Optional[Dict[str, Any]], str]:
    """The best of the compared models ``entries`` and how it was chosen: on the median validation figure over the
    seeds each ran (``selection``; one never scored there is not chosen, and named), on the median reported figure
    only where none was scored; under the earlier rule, on the gap. None (and "") where there is none."""
    if not entries:
        return None, ""
    fam = j.fam
    if not j.fair:
        sign = 1 if fam.gap == "points" else -1  # larger × sign is better
        return max(entries, key=lambda e: sign * e["gap"]), "the reported figure"
    scores = [(e["model"], e, (e.get("selection") or {}).get("median"),
               median(_by_seed(fam, j.by[e["model"]], j.seed, j.seeded).values()) if e["model"] in j.by
               else e["value"] / fam.scale) for e in entries]
    chosen, how, _ = _best(fam.higher, scores, "candidate")
    return chosen, how


def _attention_unshifted(j: _Judging) -> Dict[str, Any]:
    """Attention's own target (``Comparison.attention_floor``; recall: attention learns MQAR): attention itself,
    without the shift, at least at that figure at its best rate (unsettled on fewer than 3 seeds, or where a better
    rate could meet a miss), with its longer runs beside the equal budget."""
    fam = j.fam
    floor, unit = fam.attention_floor, "%" if fam.label.endswith("%") else ""
    preset = j.by.get(fam.attention)
    a = _entry(fam, preset, None, j.seed, j.seeded)
    short = a["run"] and (a["value"] < floor if fam.higher else a["value"] > floor)
    verdict = "not run" if not a["run"] else ("MISSED" if short else "met")
    na = len(a.get("by_seed", {})) or 1
    missed = verdict == "MISSED"  # a better rate could meet it
    a["beyond"] = _beyond(fam, j.raw, preset, j.ladder) if missed else None
    single = missed and preset.get("rates") == 1
    why = (["needs 3 seeds"] if a["run"] and na < 3 else []) + (
        [f"best at an end of the rates tried: {past_end(a)}"] if a.get("beyond") else []) + (
        [f"run at one rate only: {a['model']}"] if single else [])
    j.past += [a] if a.get("beyond") else []
    j.unswept += [a] if single else []
    if why:
        verdict += (f" on {na} seed{'s' if na > 1 else ''}" if na < 3 else "") + f", unsettled: {'; '.join(why)}"
    measured = None if not a["run"] else f"{a['value']:.1f}{unit}"
    longer: Dict[int, Dict[str, Any]] = {}
    for r in _longer_runs(fam, j.raw):  # the best rate at each longer budget
        longer.setdefault(r["steps"], r)
    if measured and longer:
        measured += (f" at {fam.where['steps']:,} steps; with more steps (not the equal budget): "
                     + ", ".join(f"{r[fam.metric] * fam.scale:.1f}{unit} at {n:,} (lr {r.get('lr'):g})"
                                 for n, r in longer.items()))
    at_least = "≥" if fam.higher else "≤"
    return {"what": f"attention without the shift {at_least} {floor:g}{unit} at its best rate", "verdict": verdict,
            "measured": measured}


def _first_command(j: _Judging, spec: str) -> str:
    """The command that trains a form never run: its sweep over the family's grid — or, for a larger model
    (``Comparison.larger``), its smaller model at the rate that model's sweep chose (the bench carries it over to
    the larger one), not a sweep that would train the smaller model's other rates again."""
    fam = j.fam
    recipe = _recipe_rate(fam, j.data)
    small = fam.smaller(spec)
    if small and recipe:
        chosen = next((r for r in j.raw if r.get(fam.key) == small and r.get("best_lr") and _number(r.get("lr"))
                       and all(r.get(k) == v for k, v in fam.where.items())), None)
        if chosen is not None:
            return fam.rate_command(spec, chosen["lr"] * fam.larger_rate / recipe)
    return fam.sweep_command(spec)


def _rate_commands(j: _Judging) -> List[str]:
    """The commands that settle the verdicts waiting on a rate: a sweep of each model run at one rate only, a run
    past the end of the rates of each model best at an end; none already listed, none without a family command."""
    fam = j.fam
    recipe = _recipe_rate(fam, j.data) or 1.0
    commands = [fam.sweep_command(e["model"], e["lr"] / recipe if _number(e.get("lr")) else None) for e in j.unswept]
    commands += [fam.rate_command(e["model"], e["beyond"] / recipe) for e in j.past]
    commands += [fam.own_sweep_command(e["model"], e["lr"] / recipe if _number(e.get("lr")) else None)
                 for e in j.carried]
    return [c for c in dict.fromkeys(commands) if fam.command and c not in j.item["to_run"]]


def judge(fam: Comparison, data: Optional[Dict[str, Any]], seeded: List[Tuple[int, Dict[str, Any]]],
          ngram: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One family's comparison and its targets judged, from its main bench JSON ``data`` (None: not run) and the
    rows of its other seeds (:func:`seeded_rows`), under the fairness rule (module docstring). A target whose
    verdict differs under the earlier rule (forms and models picked on the main seed's reported figure, no shift
    offered to attention) carries ``flipped``: that verdict and its figure. Verdicts are compared on what their
    figures read (``reads``: the interval's reading, or on one seed the gap's side of the bound), so an unsettled
    verdict that leans the other way under the earlier rule is a flip too. ``ngram``: the comparison's n-gram
    baseline (:func:`ngram_baseline`), against which each compared model's bits per byte are read."""
    fam = fam.resolved(data)
    item = _judge(fam, data, seeded, ngram=ngram)
    before = _judge(fam, data, seeded, fair=False, ngram=ngram)
    for now, then in zip(item["targets"], before["targets"]):
        lean, earlier = now.get("reads", now["verdict"]), then.get("reads", then["verdict"])
        if lean.split()[0].rstrip(",") != earlier.split()[0].rstrip(","):
            now["flipped"] = {"verdict": earlier + (" (unsettled)" if then["verdict"].startswith("unsettled") and
                                                    earlier != "unsettled" else ""), "measured": then["measured"]}
    return item


def collect(folder: Path) -> Dict[str, Any]:
    """Each family's comparison from the bench results in ``folder``, with the speeds its speed bench timed
    (``speed``, from ``<bench>.json``) and every compared model with its own speed (``models``)."""
    families = []
    for fam in comparisons():
        files = [(name, read_json(folder / name).get("ngram")) for name in fam.ngram_files if (folder / name).is_file()]
        ngram = ngram_baseline(fam, files)
        item = judge(fam, _load(fam, folder), seeded_rows(fam, fam.seed_payloads(folder)), ngram)
        if ngram is None and fam.ngram_command:
            item["ngram_missing"] = fam.ngram_command
        timed = folder / (fam.speed_file or f"{fam.bench}.json")
        item["speed"], lengths = _speed(read_json(timed) if timed.is_file() else None,
                                        _speed_name(fam.attention, fam.timed_as), fam.speed_length)
        if item["speed"]:
            item["speed"]["file"] = timed.name
        item["models"] = _models(fam, item, lengths)
        families.append(item)
    return {"families": families, "source": str(folder)}


def _speed_name(model: str, timed_as: Optional[Dict[str, str]] = None) -> str:
    """The name a family's speed bench times ``model`` under: its spec without ``tiny-`` (a form with options too,
    ``hybrid+attention_shift=4``, where the bench timed that form; a form it did not time finds no row and reads
    "not measured", never its preset's speed); ``timed_as``: forms it times under another name."""
    if model in (timed_as or {}):
        return timed_as[model]
    return model.removeprefix("tiny-").lower()


def _timings(part: Dict[str, Any]) -> Tuple[Optional[str], Dict[str, Dict[Any, Tuple[float, float]]]]:
    """The speed rows of ``part`` by model and length: (time per call, batch), fp32 and the presets themselves only
    (points: the ``sizes`` set); and what the rows' length is named."""
    label, times = None, {}
    for r in part.get("rows", []):
        if r.get("dtype", "fp32") != "fp32" or r.get("set", "sizes") != "sizes":
            continue
        length = next((k for k in _LENGTHS if _number(r.get(k))), None)
        time = next((k for k in _TIMES if _number(r.get(k))), None)
        # named as _speed_name looks a compared model up (a tiny preset's form timed at the bench's size too)
        name = _speed_name(str(r.get("spec") or r.get("preset") or r.get("model") or ""))
        if length and time and name:
            label = label or length
            batch = r.get("batch", 1) if time != "s_per_image" else 1
            times.setdefault(name, {})[r[length]] = (r[time], batch if _number(batch) else 1)
    return label, times


def _speed(data: Optional[Dict[str, Any]], attention: Optional[str], length: Optional[int] = None
           ) -> Tuple[Optional[Dict[str, Any]], Dict[str, str]]:
    """The family's speed bench in ``data`` (its ``<bench>.json``): each timed model's throughput ÷ attention's
    (``ratio``, by the speed bench's name; ``attention``: the name it times attention under) at the longest length
    both were timed (``length``: at that length only, the family's own context), the longest of those lengths
    (``at``) and the device the JSON names (a GPU only where it names the card); and each model's length as the
    table names it. None where no model was timed beside attention."""
    part = next((data[k] for k in _SPEED_PARTS if isinstance((data or {}).get(k), dict)), None)
    if part is None:
        return None, {}
    label, times = _timings(part)
    own = times.get(attention or "")
    ratio: Dict[str, float] = {}
    lengths: Dict[str, Any] = {}
    for name, mine in times.items():
        common = [n for n in mine if own and n in own and (length is None or n == length)]
        if common:
            n = max(common)
            (ta, ba), (tm, bm) = own[n], mine[n]
            ratio[name] = ta / tm if ba == bm else (ta / ba) / (tm / bm)
            lengths[name] = n
    others = [n for name, n in lengths.items() if name != attention]
    if not others:
        return None, {}
    machine = part.get("machine") or data.get("machine") or {}
    gpu = machine.get("gpu") if isinstance(machine.get("gpu"), str) else None
    facts = [str(machine["cpu"])] if machine.get("cpu") else []
    facts += [f"{machine['cores']} cores"] if machine.get("cores") else []
    device = f"GPU ({gpu})" if gpu else "CPU" + (f" ({', '.join(facts)})" if facts else "")
    return ({"at": f"{label} {max(others):,}", "device": device, "gpu": gpu is not None, "ratio": ratio},
            {name: f"{label} {n:,}" for name, n in lengths.items()})


def _paper(fam: Comparison, item: Dict[str, Any], model: str) -> Tuple[str, str]:
    """The paper's figure of ``model`` (``Comparison.paper``, by its preset) and, beside a model other than attention,
    its gap to the paper's attention, signed as the family's gaps are; empty where the paper has no such model."""
    labels, figures = fam.paper
    preset, base = model.split("+")[0], str(item.get("presets", {}).get("attention")).split("+")[0]
    mine, theirs = figures.get(preset), figures.get(base)
    if not mine or not theirs:
        return "", ""
    if preset == base:
        return "; ".join(f"{v:g} ({label})" for v, label in zip(mine, labels)), ""
    kind = item["gap_kind"]
    gaps = [_gap_text(kind, v / b - 1 if kind == "relative" else v / b if kind == "ratio" else v - b)
            for v, b in zip(mine, theirs)]
    return "; ".join(f"{v:g}, {g} ({label})" for v, g, label in zip(mine, gaps, labels)), " / ".join(gaps)


def _models(fam: Comparison, item: Dict[str, Any], lengths: Dict[str, str]) -> List[Dict[str, Any]]:
    """Every compared model that ran (attention, PoM, the value PoM, every hybrid) in its compared form, with its
    role, its own speed (``speed``: ÷ attention's; None where that very form was not timed), the paper's figure and
    gap, whether it is on the Pareto front (``pareto``, timed models only: no other timed model both at least as
    good and at least as fast, and better in one) and its speed as the table shows it."""
    roles = [("attention", item["attention"]), ("PoM", item["pom"]), ("value PoM", item["value"])] + [
        ("hybrid, full attention" if h.get("full_attention") else "hybrid", h) for h in item.get("hybrids", [])]
    ratio = (item.get("speed") or {}).get("ratio", {})
    models = []
    for role, e in roles:
        if e.get("run"):
            paper, paper_gap = _paper(fam, item, e.get("preset", e["model"]))
            speed = ratio.get(_speed_name(e["model"], fam.timed_as))
            models.append(dict(e) | {"role": role, "speed": speed, "paper": paper, "paper_gap": paper_gap})
    sign = 1 if item["higher"] else -1
    timed = [m for m in models if m["speed"] is not None]
    for m in timed:
        m["pareto"] = not any(sign * o["value"] >= sign * m["value"] and o["speed"] >= m["speed"]
                              and (sign * o["value"] > sign * m["value"] or o["speed"] > m["speed"])
                              for o in timed if o is not m)
    device = "GPU" if (item.get("speed") or {}).get("gpu") else "CPU"
    for m in models:
        at = lengths.get(_speed_name(m["model"], fam.timed_as))
        m["speed_text"] = "not measured" if m["speed"] is None else f"{m['speed']:.2f}× ({device}, {at})"
    return models


def target_lines(item: Dict[str, Any]) -> List[str]:
    """A family's targets (:func:`judge`), one line each, with the rule its options follow, the options not run and
    the verdicts the fairness rule flipped."""
    lines = []
    if item.get("options"):
        most = "best" if len(item["options"]) > 1 else "better"
        on = f"validation ({item['select']})" if item.get("select") else \
            "the reported figure (the family has no validation figure)"
        lines.append(f"{item['family']}: every model is compared as its preset or with "
                     f"{' / '.join(item['options'])} where it applies (the token shift: to attention and hybrids), "
                     f"whichever scores {most} on {on}"
                     + (f"; the value PoM also as {' / '.join(item['value_options'])}" if item.get("value_options")
                        else "") + "; the option shown beside a figure is the one taken")
        odd = sorted({e["picked_by"] for e in [item["attention"], item["pom"], item["value"], item["hybrid"]]
                      if e.get("run") and e.get("picked_by") not in (None, "", "validation")})
        if item.get("select") and odd:
            lines.append(f"{item['family']}: some forms were picked on {'; '.join(odd)}")
    if item.get("forms"):
        lines.append(f"{item['family']}: also offered, and chosen on validation like the options: "
                     + "; ".join(f"{name} as {' / '.join(forms)}" for name, forms in item["forms"].items()))
    chosen = [f"{what} on {item[key]}" for key, what in (("hybrid_picked_by", "the hybrid shown"),
                                                          ("best_linear_picked_by", "the best without full attention"),
                                                          ("all_pom_picked_by", "the best all-PoM"))
              if item.get(key) not in (None, "", "validation")]
    if item.get("select") and chosen:
        lines.append(f"{item['family']}: chosen {'; '.join(chosen)}")
    if item.get("found") and item.get("select") and not item.get("heldout", True):
        lines.append(f"{item['family']}: no held-out test figure: {item['metric']} is both the figure chosen on and "
                     f"the one reported, so no verdict settles")
    lines += [f"{item['family']}: {line}" for line in item.get("rate_flags") or []]
    lines += [f"{item['family']}: {line}" for line in ngram_lines(item)]
    for name, options in (item.get("not_run") or {}).items():
        lines.append(f"{item['family']}: not run — {name} " + (
            "in any form" if name in item.get("absent", []) and len(options) > 1 else
            f"with {', '.join(map(_form, options))}"))
    for command in item.get("to_run") or []:
        lines.append(f"{item['family']}: to run: `{command}`")
    for t in item["targets"]:
        measured = f": {t['measured']}" if t["measured"] else ""
        lines.append(f"{item['family']}: {t['what']}{measured} — **{t['verdict']}**")
        if t.get("flipped"):
            f = t["flipped"]
            lines.append(f"{item['family']}: ↳ flipped by the fairness rule: under the earlier rule (forms and models "
                         f"picked on the main seed's reported figure, no shift offered to attention) it read "
                         f"{f['verdict']}"
                         + (f" at {f['measured']}" if f.get("measured") else ""))
    return lines


def verdict_lines(bench: str, payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
                  main_json: Optional[Dict[str, Any]] = None) -> List[str]:
    """The parity targets of the family whose bench wrote ``payload`` (its other seeds' JSONs in ``seeds``), judged
    exactly as ``polymixer bench parity`` judges them — the one verdict path, so a family's bench report and the
    parity table never disagree. Where ``payload`` is a seed folder's, ``main_json`` is the family's main JSON (and
    ``seeds`` its seed folders, this one among them): the verdicts are the family's, not this seed's alone, which
    would ask again for the seeds the main folder holds. Empty where the payload holds no part the family is
    judged on. A bench judged by several comparisons (the prose LM at two sizes) gives each one's lines."""
    family(bench)  # (an unknown bench: the error naming the families)
    lines = []
    for fam in [f for f in comparisons() if f.bench == bench]:
        if fam.part in payload:
            data = main_json if main_json is not None else payload
            item = judge(fam, data, seeded_rows(fam, seeds or []), ngram_baseline(fam, _ngram_parts(fam, data)))
            lines += [f"parity (as `polymixer bench parity` judges): {line}" for line in target_lines(item)]
    return lines


def _digits(fam: Dict[str, Any]) -> int:
    """The decimals a family's figures are shown with (``Comparison.digits`` of its bench; 1 for a bench no family
    registers)."""
    return next((c.digits for c in comparisons() if c.bench == fam["bench"]), 1)


def models_table(payload: Dict[str, Any]) -> str:
    """The table a user chooses from: per family every compared model (:func:`collect`'s ``models``) with its
    quality (median, range and seeds; † where the selection seed is in the median), gap, parameters and speed
    against attention, the paper's figure and the Pareto front (★; blank: off it; —: no speed to place it)."""
    rows = []
    for f in payload["families"]:
        digits = _digits(f)
        for m in f.get("models", []):
            n = len(m.get("by_seed", {})) or 1
            lo, hi = m.get("range") or (m["value"], m["value"])
            spread = f"{lo:.{digits}f}–{hi:.{digits}f}, " if n > 1 else ""
            mark = " †" if n > 1 and m.get("selection_seed_in_median") else ""
            role = m["role"] + (f"; {m['note']}" if m.get("note") else "")
            rows.append({"family": f["family"], "model": f"{m['model']} ({role})",
                         "metric": f["metric"] + (" ↑" if f["higher"] else " ↓"),
                         "median": f"{m['value']:.{digits}f} ({spread}{n} seed{'s' if n > 1 else ''}{mark})",
                         "gap": gap_interval(f["gap_kind"], m) if "gap" in m else "—", "params": _params(m),
                         "speed": m["speed_text"], "paper": m.get("paper") or "—", "bits": _bits_text(m),
                         "front": "★" if m.get("pareto") else ("" if "pareto" in m else "—")})
    cols = ["family", "model", "metric", "median", "gap", "params", "speed", "paper", "bits", "front"]
    heads = ["family", "model (role)", "metric", "median (range, seeds)", "gap to attention", "params vs attention",
             "speed ÷ attention's (device, length)", "the paper (GPU scale)", "bits per byte (n-gram's best)",
             "Pareto front"]
    return format_table(rows, cols, heads)


def _bits_text(m: Dict[str, Any]) -> str:
    """A model's bits per byte beside its n-gram baseline's best on the same split: "2.243 (n-gram 1.896)",
    "validation" where the model has no test figure, "undertrained" where it does not beat it; "—" without one."""
    b = m.get("bits")
    if not b:
        return "—"
    return (f"{b['bpb']:.3f} ({'' if b['split'] == 'test' else 'validation; '}n-gram {b['ngram']:.3f})"
            + (", undertrained" if m.get("undertrained") else ""))


def _models_notes(payload: Dict[str, Any]) -> List[str]:
    """What the models table's seeds, marks and speeds mean, and where each family's speeds were timed."""
    gpu = any((f.get("speed") or {}).get("gpu") for f in payload["families"])
    lines = ["- Rates are chosen by each bench's sweep on seed 0, the selection seed (other seeds run at the chosen "
             "rate only); forms, the hybrid, the best linear-time model and the all-PoM candidate on the median "
             "validation figure over the seeds each ran. A median is over the seeds other than seed 0 where at least "
             "3 of them ran; † marks one that includes seed 0 (fewer than 3 other seeds ran). A gap is the mean of "
             "the per-seed paired gaps to attention over those seeds, with its 95% Student-t interval [low, high].",
             "- Speed: the throughput of that same model (its preset at the family's speed-bench size) ÷ attention's "
             "preset's, at the longest length both were timed or at the family's own context (the lines below say "
             "which); a form with options (the token shift, rotary encodings, another mixer or patch size) timed as "
             "itself where its bench took it, else \"not measured\""
             + ("; a GPU figure names its card" if gpu else
                ", as does every GPU figure: no family's measured JSON names a card")
             + ". ★: on the Pareto front (no model both better and faster); — : no speed to place it.",
             "- Bits per byte: the model's median over the same seeds on the test split (validation where it has no "
             "test figure), beside the best of its n-gram baseline's orders 0–5 (counts of the same tokens on the "
             "same train split, scored on the same split); a model that does not beat it is undertrained, and every "
             "verdict on it says so."]
    return lines + [f"- {f['family']}: speeds timed on {f['speed']['device']} at {f['speed']['at']} "
                    f"({f['speed'].get('file', f['bench'] + '.json')})" for f in payload["families"] if f.get("speed")]


def _cell(fam: Dict[str, Any], e: Dict[str, Any], option: bool = True) -> str:
    """A model's figure in the table, its gap to attention and (``option``) the option it is compared with."""
    if not e.get("run"):
        return "not run"
    digits = _digits(fam)
    text = f"{e['value']:.{digits}f}"
    if "gap" in e:
        text += f" ({_gap_text(fam['gap_kind'], e['gap'])})"
    preset = str(e.get("preset") or str(e.get("model", "")).split("+")[0])
    if option and str(e.get("model", "")).startswith(preset + "+"):
        text += ", " + e["model"][len(preset):]  # the option this model is compared with
    elif option and e.get("model", preset) != preset:
        text += f", as {e['model']}"  # another of its forms (polymixer's beside the paper's)
    return text


def _params(e: Dict[str, Any]) -> str:
    """The model's parameter count relative to attention's (the forms compared)."""
    return f"{100 * e['params_vs_attention']:+.1f}%" if "params_vs_attention" in e else "—"


def _rates(e: Dict[str, Any]) -> str:
    """How many rates the model has tried (1: the recipe's only)."""
    return str(e.get("rates", 1)) if e.get("run") else "—"


def report(payload: Dict[str, Any]) -> str:
    """The table a user chooses from (:func:`models_table`) with its notes, the families side by side, and the
    targets, one line each."""
    rows = []
    for f in payload["families"]:
        h = f["hybrid"]
        hyb = _cell(f, h, option=False) + (f", {h['model']}" + (" (full attention)" if h.get("full_attention") else "")
                             if h.get("run") else "")
        if not f.get("hybrid_presets", True):
            hyb = "— (no hybrid preset)"
        seeds = sorted({e.get("seeds", 1) for e in (f["attention"], f["pom"], f["value"], h) if e.get("run")})
        where = f.get("file") or f["bench"] + ".json"
        rows.append({"family": f["family"] if f["found"] else f"{f['family']} (no {where})",
                     "metric": f["metric"] + (" ↑" if f["higher"] else " ↓"), "attention": _cell(f, f["attention"]),
                     "pom": _cell(f, f["pom"]), "value": _cell(f, f["value"]), "hybrid": hyb,
                     "rate": " / ".join(_rates(e) for e in (f["attention"], f["pom"], f["value"])),
                     "params": " / ".join(_params(e) for e in (f["pom"], f["value"], h)),
                     "seeds": "/".join(map(str, seeds)) or "—", "guide": f"[{f['bench']}]({f['guide']})"})
    cols = ["family", "metric", "attention", "pom", "value", "hybrid", "params", "rate", "seeds", "guide"]
    heads = ["family", "metric", "attention", "PoM (gap)", "value PoM (gap)", "best hybrid (gap)",
             "params vs attention: PoM / value PoM / hybrid", "rates tried: attention / PoM / value PoM", "seeds",
             "bench"]
    lines = [models_table(payload), "", *_models_notes(payload), "", format_table(rows, cols, heads), ""]
    for f in payload["families"]:
        lines += [f"- {line}" for line in target_lines(f)]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="docs/bench", help="the folder of the benches' JSON files; parity.* go there")


def main(args: argparse.Namespace) -> int:
    folder = Path(args.out)
    files = list(dict.fromkeys(f.json_name for f in comparisons()))
    if not any((folder / name).is_file() for name in files):
        looked = ", ".join(files)
        raise SystemExit(f"polymixer bench parity: no bench results in {folder} (looked for {looked}); run the "
                         f"families' benches there first")
    payload = collect(folder)
    text = report(payload)
    write_text_atomic(folder / "parity.json", json.dumps(payload, indent=1) + "\n")
    write_text_atomic(folder / "parity.txt", text + "\n")
    print(text)
    print(f"\nwrote {folder / 'parity.txt'}, {folder / 'parity.json'}")
    return 0
