"""The guides' result tables (docs/*.md), generated from the benches' JSON under docs/bench.

Each table a guide shows from a bench's results sits between two markers::

    <!-- table:lm.throughput (generated from docs/bench/lm.json: python -m polymixer.experiments.guides) -->
    | N | B | model | … |
    <!-- /table -->

``python -m polymixer.experiments.guides`` rewrites every marked table from :func:`tables`, the named generators
(each reads the JSON under a docs/bench folder and returns the table's text): those of what the families share
(:data:`SHARED`: mixers, faults, parallelism, parity, GPU) and each family's own, which its registration brings
(:attr:`~polymixer.experiments.registry.LabFamily.tables`, in ``polymixer.experiments.<family>.tables``).
``--check`` rewrites nothing and exits 1 naming each stale table, so a figure typed by hand, or a bench rerun without
regenerating, fails ``tests/test_guides.py``. Tables that are not results (options, presets, formats, commands) stay
hand-written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .bench import faults as faults_bench
from .bench import parallel as parallel_bench
from .bench import parity as parity_bench
from .bench import roofline as roofline_bench
from .bench import traffic as traffic_bench
from ..families import canonical_family
from .bench.common import same_rate
from .registry import Table, guide_tables
from .report import format_cell, format_table

__all__ = ["SHARED", "tables", "Marked", "marker", "find_markers", "update_guide", "guides_in", "update_guides",
           "main", "bench_json", "markdown_table", "rate_text", "bold", "seed_rows", "Row", "joined", "row_runs",
           "keyed", "report_table"]

COMMAND = "python -m polymixer.experiments.guides"
BEGIN = re.compile(r"^<!-- table:(?P<name>\S+) \(generated from (?P<source>[^:]*): [^)]*\) -->$")
END = "<!-- /table -->"


# --- what the tables share (each family's tables, polymixer.experiments.<family>.tables, use them too) ----------

def bench_json(bench: Path, name: str) -> Dict[str, Any]:
    """A bench's JSON, ``name`` under the docs/bench folder ``bench``."""
    return json.loads((bench / name).read_text())


def markdown_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain (unaligned) Markdown table, cells written as :func:`format_table` writes them (an empty string
    stays an empty cell, ``None`` is a dash)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    cells = [[format_cell(c) for c in row] for row in rows]
    lines += ["|" + "|".join(f" {c} " if c else " " for c in row) + "|" for row in cells]
    return "\n".join(lines)


def rate_text(lr: float) -> str:
    """A learning rate as the guides write it: 4e-3, 1.6e-2."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def bold(text: str, on: bool) -> str:
    """``text`` in bold where ``on`` (and not empty)."""
    return f"**{text}**" if on and text else text


def seed_rows(bench: Path, files: Sequence[str], part: str = "quality") -> Dict[str, List[Dict[str, Any]]]:
    """Each spec's run at its chosen rate in each seed's JSON, by spec: seed 0's best-rate row (the rate its sweep
    chose on validation; seed 0's file first), then each other seed's row of that spec (and task / objective) at that
    same rate — the other seeds run at the chosen rate only, as ``bench parity`` reads them; a row of a seed folder
    at another rate (left from an earlier choice) is not the model's figure."""
    by: Dict[str, List[Dict[str, Any]]] = {}
    chosen: Dict[Tuple[Any, ...], Any] = {}
    for k, name in enumerate(files):
        for r in bench_json(bench, name)[part]["rows"]:
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


@dataclass(frozen=True)
class Row:
    """One row of a seeds table: its label, the runs it shows (one key: every seed of it; several: seed 0 of each),
    whether its median is bold (the parity picks) and whether it shows a gap to the reference."""

    label: str
    keys: Tuple[str, ...]
    bold: bool = False
    gap: bool = True


def joined(values: Sequence[Optional[float]], scale: float, digits: int) -> str:
    """Figures × ``scale`` joined with " / ", a dash where one is missing."""
    return " / ".join("—" if v is None else f"{scale * v:.{digits}f}" for v in values)


def row_runs(by: Dict[str, List[Dict[str, Any]]], row: Row) -> List[Dict[str, Any]]:
    """The runs a row shows: every seed of its one key, or seed 0 of each of its keys."""
    return by[row.keys[0]] if len(row.keys) == 1 else [by[k][0] for k in row.keys]


def report_table(text: str, index: int = 0) -> str:
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


def keyed(rows: List[Dict[str, Any]], *keys: str) -> Dict[Tuple[Any, ...], Dict[str, Any]]:
    """The rows by the tuple of their ``keys``."""
    return {tuple(r[k] for k in keys): r for r in rows}


# --- mixers, faults, parallelism, parity, GPU models (docs/mixer.md, faults.md, parallel.md, parity.md, gpu.md) --

_MIXER_COLUMNS = ["N", "batch", "mixer", "fwd_ms", "fwd_tok_s", "fwd_vs_floor", "fwdbwd_ms", "fwdbwd_vs_floor",
                  "fwd_peak_mb", "fwdbwd_peak_mb"]
_MIXER_HEADERS = ["N", "B", "mixer", "fwd ms", "fwd tok/s", "fwd ÷ floor", "fwd+bwd ms", "fwd+bwd ÷ floor", "fwd MB",
                  "fwd+bwd MB"]


def mixer_cpu(bench: Path) -> str:
    """PoM, SDPA and the naive attention on CPU by length, against PoM's matrix-product floor (``bench mixer``)."""
    rows = [r for r in bench_json(bench, "mixer.json")["rows"] if not r["mixer"].startswith("value pom")]
    return format_table(rows, _MIXER_COLUMNS, _MIXER_HEADERS)


def mixer_value(bench: Path) -> str:
    """The value PoM's causal forms against their own matrix-product floor."""
    rows = [r for r in bench_json(bench, "mixer.json")["rows"] if r["mixer"].startswith("value pom")]
    keep = [0, 1, 2, 3, 5, 6, 7]
    return format_table(rows, [_MIXER_COLUMNS[i] for i in keep], [_MIXER_HEADERS[i] for i in keep])


def mixer_packed(bench: Path) -> str:
    """Packed sequences mixed in place, as a padded batch, and as one sequence."""
    rows = bench_json(bench, "mixer.json")["packed"]
    return markdown_table([[r["layout"], r["tokens"], r["mode"], r["fwdbwd_ms"], r["vs_one_sequence"]] for r in rows],
                          ["sequences", "tokens", "mixed", "fwd+bwd ms", "÷ one sequence"])


def faults_survival(bench: Path) -> str:
    """Every injected fault of ``bench faults``, survived or not, and the steps it cost."""
    payload = bench_json(bench, "faults.json")
    for fam in payload["families"].values():  # runs that predate a family's name read under today's
        for r in fam["rows"]:
            r["family"] = canonical_family(r["family"])
    return report_table(faults_bench.report(payload))


def parallel_report(bench: Path) -> str:
    """``bench parallel``'s whole text report (measured bytes and memory, fits, the H100 model), as a code block."""
    return "```\n" + parallel_bench.report(bench_json(bench, "parallel.json")) + "\n```"


def parallel_scaling(bench: Path) -> str:
    """``bench parallel --scaling``: bytes per rank against P, counted, and the model of larger P, as a code block."""
    return "```\n" + parallel_bench.scaling_report(bench_json(bench, "parallel_scaling.json")) + "\n```"


def parallel_million(bench: Path) -> str:
    """``bench parallel --million``: the long-context LM step's memory per rank with and without activation
    checkpointing, as a code block."""
    return "```\n" + parallel_bench.million_report(bench_json(bench, "parallel_million.json")) + "\n```"


def parity_families(bench: Path) -> str:
    """Attention, PoM, value PoM and the best hybrid of every family, as ``bench parity`` judges them."""
    payload = bench_json(bench, "parity.json")
    for fam in payload["families"]:  # the guide links its siblings: docs/lm.md is lm.md from docs/parity.md
        fam["guide"] = fam["guide"].removeprefix("docs/")
    return report_table(parity_bench.report(payload))


def parity_verdicts(bench: Path) -> str:
    """Every family's targets, one line each, as ``bench parity`` judges them (its "to run" commands stay in
    parity.txt)."""
    payload = bench_json(bench, "parity.json")
    return "\n".join(f"- {line}" for f in payload["families"] for line in parity_bench.target_lines(f)
                     if not line.startswith(f"{f['family']}: to run: "))


def parity_claims(bench: Path) -> str:
    """The paper's claims against what reproduces here: each family's paper models (its targets "the paper's …"),
    in the form compared, with the paper's gap, the mean paired gap to attention here with its 95% interval and
    seeds, the paper's tolerance and the verdict (its first clause; the reason in the verdicts above)."""
    rows = []
    for fam in bench_json(bench, "parity.json")["families"]:
        for t in fam["targets"]:
            if not t["what"].startswith("the paper's ") or not t.get("measured"):
                continue  # (a target not run has no figure: its verdict line above says so)
            paper = t["what"].split("(the paper: ")[1].rstrip(")") if "(the paper: " in t["what"] else "—"
            model, gap = t["measured"].split(" ", 1)
            bound = t["what"].split(" within ")[1].split(" (")[0]
            rows.append([fam["family"], f"`{model}`", paper, gap, bound, t["verdict"].split(":")[0]])
    return markdown_table(rows, ["family", "the paper's model (form compared)", "the paper's gap",
                                 "gap here [95% interval] (seeds)", "tolerance", "verdict"])


def gpu_roofline(bench: Path) -> str:
    """The roofline model's GPT-2 small against GPPoM2-S on an H100 (predicted, not measured)."""
    text = roofline_bench.report(bench_json(bench, "roofline.json"))
    return text.splitlines()[0] + "\n" + report_table(text)


def _h200(bench: Path, name: str) -> Dict[Tuple[int, str], Dict[str, Any]]:
    """The rows of an H200 ``bench mixer`` run by (N, mixer)."""
    return keyed(bench_json(bench, name)["rows"], "N", "mixer")


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
                    bold(_pair(by, n, _modes("pom {mode} compiled"), "fwdbwd_ms"), True)])
    return markdown_table(out, ["N", "floor fwd / fwd+bwd", "torch form (eager) full / causal, fwd+bwd",
                                "`triton` (eager) full / causal, fwd", "`triton` (eager) full / causal, fwd+bwd",
                                "**compiled** full / causal, fwd", "**compiled** full / causal, fwd+bwd"])


def gpu_traffic(bench: Path) -> str:
    """The kernels' HBM passes per N·D element counted in Triton's interpreter (``polymixer kernels --traffic``),
    against the cost model and the floor: :func:`polymixer.experiments.bench.traffic.table` of traffic.json."""
    return traffic_bench.table(json.loads((bench / "traffic.json").read_text()))


# the tables of what every family shares (each family's own come from its registration: its ``tables``)
SHARED: Dict[str, Table] = {
    "mixer.cpu": Table(mixer_cpu, ("mixer.json",)),
    "mixer.value": Table(mixer_value, ("mixer.json",)),
    "mixer.packed": Table(mixer_packed, ("mixer.json",)),
    "faults.survival": Table(faults_survival, ("faults.json",)),
    "parallel.report": Table(parallel_report, ("parallel.json",)),
    "parallel.scaling": Table(parallel_scaling, ("parallel_scaling.json",)),
    "parallel.million": Table(parallel_million, ("parallel_million.json",)),
    "parity.families": Table(parity_families, ("parity.json",)),
    "parity.verdicts": Table(parity_verdicts, ("parity.json",)),
    "parity.claims": Table(parity_claims, ("parity.json",)),
    "gpu.roofline": Table(gpu_roofline, ("roofline.json",)),
    "gpu.h200_forward": Table(gpu_h200_forward, ("gpu_h200/mixer.json",)),
    "gpu.h200_backward": Table(gpu_h200_backward, ("gpu_h200/mixer.json",)),
    "gpu.h200_compiled": Table(gpu_h200_compiled, ("gpu_h200_compiled/mixer.json",)),
    "gpu.traffic": Table(gpu_traffic, ("traffic.json",)),
}


def tables() -> Dict[str, Table]:
    """Every generated table by name (a function of the docs/bench folder returning the table's Markdown, and the
    JSON files under docs/bench it reads): the shared ones and every registered family's. A family's table named
    like a shared one is a ValueError."""
    families = guide_tables()
    twice = sorted(set(SHARED) & set(families))
    if twice:
        raise ValueError(f"the guide table {twice[0]!r} is both a family's and a shared one")
    return {**SHARED, **families}


def marker(name: str) -> str:
    """The line a generated table starts after: its name, the JSON it comes from and the command that writes it."""
    sources = ", ".join(f"docs/bench/{s}" for s in tables()[name].sources)
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
    known = tables()
    for i, line in enumerate(lines):
        if not line.startswith("<!-- table:"):
            continue
        m = BEGIN.match(line)
        name = m.group("name") if m else line[len("<!-- table:"):].split()[0]
        if name not in known:
            raise ValueError(f"{guide}: unknown table {name!r} (not in polymixer.experiments.guides.tables())")
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
    known = tables()
    for m in reversed(find_markers(text, guide.name)):
        new = [marker(m.name)] + known[m.name].make(bench).splitlines()
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
