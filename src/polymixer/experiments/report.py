"""What people read rather than compute: text tables and matplotlib figures (PNG), shared by the tasks, the
training loop and the benchmarks; and ``polymixer plot RUN [RUN …]``, training curves of runs overlaid.

Figures use the non-interactive Agg backend (everything here runs headless) and are written atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..files import atomic_path

__all__ = ["format_cell", "format_table", "per_class_table", "new_figure", "figure_title", "save_figure",
           "plot_speed_vs_baseline", "read_history", "plot_history", "add_plot_arguments", "main_plot"]


def format_cell(v: Any) -> str:
    """A table cell: 3 significant digits (thousands separated from 100 on), a dash for None."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def format_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str],
                 headers: Optional[Sequence[str]] = None) -> str:
    """A plain aligned text table (also valid Markdown)."""
    headers = list(headers or columns)
    body = [[format_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(b) for b in body])


def per_class_table(scores: Dict[str, Any], unit: str) -> str:
    """The per-class table of a segmentation evaluation (``ConfusionMatrix.as_dict()``): IoU and recall in %,
    support and predictions counted in ``unit`` (pixels, points)."""
    rows = [{**r, "iou": None if r["iou"] is None else 100 * r["iou"],
             "recall": None if r["recall"] is None else 100 * r["recall"]} for r in scores["per_class"]]
    return format_table(rows, ["class", "name", "iou", "recall", "support", "predicted"],
                        ["class", "name", "IoU %", "recall %", unit, "predicted"])


def new_figure(ncols: int, width: float = 5.2, height: float = 4.0, nrows: int = 1):
    """A matplotlib figure on the non-interactive backend (benchmarks run headless) and its axes, row by row;
    ``width`` and ``height`` are per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def plot_speed_vs_baseline(ax, ax2, rows: Sequence[Dict[str, Any]], x: str, y: str, names: Dict[str, str],
                           xlabel: str, ylabel: str, baseline: str) -> None:
    """Throughput (``ax``, log-log) and ratio to the baseline (``ax2``) of each preset, one line per preset and dtype
    (fp32 solid, bf16 dashed): the speed panel of the model-family benches."""
    styles = {"fp32": "-", "bf16": "--"}
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for k, preset in enumerate(dict.fromkeys(r["preset"] for r in rows)):
            pts = [r for r in rows if r["preset"] == preset and r["dtype"] == dtype]
            kw = dict(marker="o", ls=styles.get(dtype, ":"), color=f"C{k}",
                      label=f"{names.get(preset, preset)} {dtype}")
            ax.plot([r[x] for r in pts], [r[y] for r in pts], **kw)
            ax2.plot([r[x] for r in pts], [r["speedup"] for r in pts], **kw)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel(xlabel)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax2.set_ylabel(f"speed ÷ {baseline} (same dtype)")
    ax2.axhline(1.0, color="gray", lw=0.8)


def figure_title(fig: Any, text: str, fontsize: float = 9) -> None:
    """``fig``'s title, wrapped to the figure's width: a long title over one narrow panel is not cut at its edges."""
    per_line = max(30, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))  # characters of ~0.55 em fit a line
    fig.suptitle(textwrap.fill(text, per_line), fontsize=fontsize)


def save_figure(fig: Any, path: Union[str, Path]) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=130)
    finally:
        plt.close(fig)




# ----------------------------------------------------------------------------------------------------------------
# training curves
# ----------------------------------------------------------------------------------------------------------------

Run = Tuple[str, List[Dict[str, Any]]]  # (label, history records)


def read_history(run: Union[str, Path]) -> List[Dict[str, Any]]:
    """The records of a run folder's ``history.json`` (or of that file itself): training records (step, loss, lr,
    throughput, …) and evaluation records (step, ``eval_<metric>``)."""
    path = Path(run)
    path = path / "history.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a run folder holds history.json once it has logged a step")
    try:
        history = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable history: {e}") from e
    if not isinstance(history, list):
        raise ValueError(f"{path} is not a training history (a JSON list of records)")
    return history


def _series(history: Sequence[Dict[str, Any]], key: str) -> Tuple[List[int], List[float]]:
    pts = [(r["step"], r[key]) for r in history if key in r and isinstance(r[key], (int, float))
           and math.isfinite(r[key])]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def plot_history(runs: Sequence[Run], path: Union[str, Path], title: str = "", warmup: Optional[int] = None
                 ) -> Path:
    """One PNG of training curves: the training loss, the learning rate, and one panel per evaluation metric, each
    run a colour (``runs``: (label, history) pairs). ``warmup`` shades the warm-up steps of a single run."""
    metrics = list(dict.fromkeys(k[len("eval_"):] for _, h in runs for r in h for k in r if k.startswith("eval_")))
    panels = ["loss", "lr"] + metrics
    ncols = min(len(panels), 4)
    nrows = -(-len(panels) // ncols)
    fig, axes = new_figure(ncols, width=4.0, height=3.0, nrows=nrows)
    for k, (label, history) in enumerate(runs):
        for ax, panel in zip(axes, panels):
            key = panel if panel in ("loss", "lr") else f"eval_{panel}"
            steps, values = _series(history, key)
            if steps:
                ax.plot(steps, values, marker="o" if panel in metrics and len(steps) < 30 else None, ms=3,
                        color=f"C{k % 10}", label=label)
    names = {"loss": "training loss", "lr": "learning rate"}
    from matplotlib.ticker import MaxNLocator

    for ax, panel in zip(axes, panels):
        ax.set_title(names.get(panel, f"eval {panel}"), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole (a one-point panel too)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        last = max((r["step"] for _, h in runs for r in h if "step" in r), default=0)
        if warmup and len(runs) == 1 and last:
            ax.axvspan(0, min(warmup, last), color="0.92", zorder=0, label="warm-up" if panel == "lr" else None)
            if panel == "lr":
                ax.legend(fontsize=6)
        if len(runs) > 1:
            ax.legend(fontsize=6)
    losses = [v for _, h in runs for v in _series(h, "loss")[1]]
    if losses and min(losses) > 0 and max(losses) / min(losses) > 20:
        axes[0].set_yscale("log")
    for ax in axes[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    save_figure(fig, path)
    return path


def add_plot_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or their history.json)")
    p.add_argument("--out", default=None,
                   help="the PNG to write (default: <run>/curves.png for one run, curves.png for several)")
    p.add_argument("--labels", nargs="+", default=None, help="one label per run (default: the run folders as given)")


def main_plot(args: argparse.Namespace) -> int:
    if args.labels is not None and len(args.labels) != len(args.runs):
        raise ValueError(f"{len(args.labels)} labels for {len(args.runs)} runs")
    # a run is named by its folder as given (runs/points/tiny-ppomv3), not its last name alone ("run", "seed1")
    labels = args.labels or [str(Path(r) if Path(r).is_dir() else Path(r).parent) for r in args.runs]
    runs = [(label, read_history(r)) for label, r in zip(labels, args.runs)]
    if args.out:
        out = Path(args.out)
    elif len(runs) == 1:
        out = (Path(args.runs[0]) if Path(args.runs[0]).is_dir() else Path(args.runs[0]).parent) / "curves.png"
    else:
        out = Path("curves.png")
    plot_history(runs, out, title=" vs ".join(labels) if len(runs) > 1 else labels[0])
    print(f"wrote {out}")
    return 0
