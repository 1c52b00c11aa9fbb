"""The recall family's comparisons with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`), with the family's own: attention learns MQAR, and the value PoM at least level with Based on Zoology's
figure 2 (:func:`versus_based_target`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from ..bench.common import ACCURACY_CEILING, beyond
from ..bench.comparison import Comparison
from ..bench.parity import past_end

__all__ = ["RECALL", "RECALL_ZOOLOGY", "versus_based_target"]

FIGURE_2 = "zoology"  # the part of the JSON holding Zoology's figure 2 (bench recall --zoology --parts zoology)


def versus_based_target(fam: Comparison, data: Optional[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
    """Issue 39's state target, judged on Zoology's figure 2 (the ``zoology`` part of the recall JSON): the value
    PoM's accuracy at least level with Based's (within :data:`~polymixer.experiments.recall.bench.LEVEL`) at every
    state size, length and form. Met needs every one of them run on 3 seeds of both; a miss on 3 seeds settles a
    MISSED. With the command that runs what is missing (``Comparison.extra_target`` of Zoology's recipe)."""
    from .bench import LEVEL, STATE_SIZES, ZOOLOGY_POINTS, versus_based

    rows = (data or {}).get(FIGURE_2, {}).get("rows", [])
    ladder = (data or {}).get(FIGURE_2, {}).get("grid", [])
    pairs = versus_based(rows)
    what = ("value PoM at least level with Based at every state size (Zoology's figure 2: L "
            + " / ".join(str(L) for L, _ in ZOOLOGY_POINTS) + f", {' / '.join(STATE_SIZES)} state floats, with and "
            f"without the shift, each model trained on its test point alone (Zoology trains on a mixture of points: "
            f"bench recall --mixture, docs/recall.md); level: within {100 * LEVEL:g} point)")

    def command(cells: List[Tuple[int, int, bool, str]]) -> str:
        """The bench run that trains ``cells`` ((L, K, shift, size)), each swept at every rate, on 3 seeds."""
        points = sorted({(L, K) for L, K, _, _ in cells})
        forms = {(shift, size) for _, _, shift, size in cells}
        variants = [f"{m}-{'' if shift else 'noshift-'}{size}" for m in ("vpom", "based") for shift in (True, False)
                    for size in STATE_SIZES if (shift, size) in forms]
        return (f"polymixer bench recall --zoology --parts zoology --zoology-points "
                f"{' '.join(f'{L}:{K}' for L, K in points)} --zoology-variants {' '.join(variants)} --seeds 0 1 2 "
                f"--out docs/bench/recall_zoology")

    every = [(L, K, shift, size) for L, K in ZOOLOGY_POINTS for shift in (True, False) for size in STATE_SIZES]
    if not pairs:
        return {"what": what, "verdict": "not run", "measured": None}, [command(every)]

    def where(L: int, shift: bool, size: str) -> str:
        return f"L {L} {size}{'' if shift else ' no shift'}"

    def name(c: Dict[str, Any]) -> str:
        return where(c["seq_len"], c["shift"], c["size"])

    measured = ", ".join(f"{name(c)} {100 * c['value']['median']:.1f} vs {100 * c['based']['median']:.1f}"
                         + ("" if c["seeds"] >= 3 else f" ({c['seeds']} seed{'s' if c['seeds'] > 1 else ''})")
                         + (" (neither learns)" if c["neither"] else "")
                         for c in pairs)
    ran = {(c["seq_len"], c["pairs"], c["shift"], c["size"]) for c in pairs}
    lacking = [cell for cell in every if cell not in ran]
    few = [c for c in pairs if c["seeds"] < 3]
    for c in pairs:  # the side whose better rate would flip the cell: the value PoM's where missed, Based's where met
        side = c["based" if c["met"] else "value"]
        c["beyond"] = beyond(rows, side, "variant", ("seq_len", "pairs", "steps"), "select", fam.ceiling,
                             ladder=ladder)
        c["past"] = {"model": side["variant"], "lr": side["lr"], "beyond": c["beyond"]}
        c["one_rate"] = side.get("rates") == 1
    ends = [c for c in pairs if c["beyond"] is not None]
    single = [c for c in pairs if c["one_rate"]]
    gaps = lacking + [(c["seq_len"], c["pairs"], c["shift"], c["size"]) for c in few + ends + single]
    why = ([f"not run at {', '.join(where(L, shift, size) for L, _, shift, size in lacking)}"] if lacking else []) + \
        ([f"fewer than 3 seeds at {', '.join(name(c) for c in few)}"] if few else []) + \
        ([f"best at an end of the rates tried at {', '.join(name(c) + ': ' + past_end(c['past']) for c in ends)}"]
         if ends else []) + \
        ([f"run at one rate only at {', '.join(name(c) + ': ' + c['past']['model'] for c in single)}"]
         if single else [])
    missed = [c for c in pairs if not c["met"]]
    if missed:
        settled = [c for c in missed if c["seeds"] >= 3 and c["beyond"] is None and not c["one_rate"]]
        at = " at " + ", ".join(name(c) + (" (where neither learns)" if c["neither"] else "") for c in missed)
        if settled:  # settled by the rule; the figure the target is read on may yet be incomplete
            verdict = "MISSED" + at + (f"; figure 2 {'; '.join(why)}" if why else "")
        elif all(c["beyond"] is None and not c["one_rate"] for c in missed):
            verdict = f"MISSED on {min(c['seeds'] for c in missed)} seed(s), unsettled: needs 3 seeds" + at
        else:  # another rate of the value PoM (past the end of its rates, or its sweep) could level it
            verdict = "MISSED" + at + f", unsettled: {'; '.join(why)}"
        return {"what": what, "verdict": verdict, "measured": measured}, [command(gaps)] if gaps else []
    verdict = "met" if not why else f"met where run, unsettled: {'; '.join(why)}"
    return {"what": what, "verdict": verdict, "measured": measured}, [command(gaps)] if gaps else []


RECALL = Comparison(
    "recall (MQAR, L 64, K 16)", "recall", "accuracy %", "median", True, "points", "attention", "pom",
    "vpom-16k", hybrids=("hybrid-LV",), where={"seq_len": 64, "pairs": 16, "steps": 2000}, key="variant",
    scale=100, part="state", guide="docs/recall.md", options=("-shift",), shift_options=("-shift",),
    select="val_accuracy", ceiling=ACCURACY_CEILING, seed_folders=False, attention_floor=99, digits=2,
    trained_on="MQAR, the bench's own recipe",
    command="polymixer bench recall --parts state --variants {spec} --sweep {spec} --out docs/bench",
)
# the same probe under Zoology's recipe (mixer-only blocks, batch 128, rates 0.3× to 10×: bench recall --zoology),
# in which attention learns MQAR at the equal budget
RECALL_ZOOLOGY = replace(
    RECALL, name="recall, Zoology's recipe (L 64, K 16)", bench="recall_zoology",
    # its speeds: bench recall --zoology --parts speed, in the same file
    file="recall_zoology/recall.json", speed_file="recall_zoology/recall.json",
    command="polymixer bench recall --zoology --parts state --variants {spec} --sweep {spec} "
            "--out docs/bench/recall_zoology", extra_target=versus_based_target, trained_on="MQAR, Zoology's recipe",
)
