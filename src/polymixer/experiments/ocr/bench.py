"""``polymixer bench ocr``: HTR-VT vs HTR-VPoM vs the hybrid on this CPU.

1. speed: lines per second of the three paper-sized models (53.4M parameters) in evaluation, round-robin in one run,
   on single lines (64×512, 128 tokens) and on pages of 2, 4, 8 and 16 lines side by side (≈ 256 → 2,100 tokens),
   at a fixed budget of lines per forward call; the ResNet stem alone is timed too, since it is shared by all three;
2. quality at equal budget: the tiny presets (HTR-VT, the hybrid, HTR-VPoM, HTR-VPoM with the value-carrying PoM)
   trained with the same steps, batches and seed on the offline default (synthetic lines; single lines and
   multi-line pages) and on lines of real handwritten digits, scored by CER and WER on the held-out test split. Each
   swept preset is trained at every rate of a learning-rate sweep (0.5×, 1×, 2× the recipe's rate) and reported at
   its best rate, chosen on the validation CER; page runs fine-tune each model's single-line run at its best rate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ...models import count_parameters
from ..report import format_table, new_figure, plot_speed_vs_baseline, save_figure
from ..bench.parity import verdict_lines
from ..bench.common import (
    BRACKET, edge_note, FamilyBench, add_sweep_arguments, bench_main, run_bench, LR_FACTORS, best_rows,
    describe_variant, QualitySweep, Stage, SweepRun, keep_freed_memory, mark_best, picture_owner, quality_rows,
    render_report, section_lines, stale_rate_notes, sweep_folder, sweep_table, time_interleaved, variant_model,
)
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["OCRBenchConfig", "run_speed", "run_quality", "main", "add_arguments"]

NAMES = {"htr-vt": "HTR-VT", "htr-vpom": "HTR-VPoM", "htr-vpom-hybrid": "HTR-VPoM Hybrid",
         "htr-vpom-value": "HTR-VPoM value", "tiny-htr-vt": "tiny HTR-VT", "tiny-htr-vpom": "tiny HTR-VPoM",
         "tiny-htr-vpom-hybrid": "tiny hybrid", "tiny-htr-vpom-value": "tiny HTR-VPoM value"}
BASELINE = "tiny-htr-vt"  # the attention model every ratio is taken against
QUALITY = ("tiny-htr-vt", "tiny-htr-vpom-hybrid", "tiny-htr-vpom-value", "tiny-htr-vpom")
PICTURE = "tiny-htr-vpom"  # whose test predictions are drawn (else the last quality preset)
RECIPE_LR = 1e-3  # the rate of the runs made before sweeps existed (rows without an "lr")


@dataclass
class OCRBenchConfig:
    presets: Tuple[str, ...] = ("htr-vt", "htr-vpom", "htr-vpom-hybrid")
    lines: Tuple[int, ...] = (1, 2, 4, 8, 16)  # lines per page; 1 = single lines
    budget: int = 16  # lines per forward call (batch = budget / lines per page)
    repeats: int = 5
    dtypes: Tuple[str, ...] = ("fp32", "bf16")  # bf16: bf16 weights, channels-last convolutions (AMX where present)
    quality_presets: Tuple[str, ...] = QUALITY
    tasks: Tuple[str, ...] = ("synthetic", "synthetic-multiline", "digits")
    quality_steps: int = 1000  # single lines (synthetic); ≈ 15 min per tiny model on 2 cores
    multiline_steps: int = 200  # pages, fine-tuned from each model's single-line run (multiline_init)
    digits_steps: int = 300
    # "single-line": a multi-line run starts from the same model's single-line run (the synthetic task runs first),
    # as one trains page models in practice; "scratch": from random weights (1,000 steps leave all three models on
    # CTC's blank plateau for ~600 steps and all-PoM still on it at 1,000)
    multiline_init: str = "single-line"
    quality_batch: int = 32  # lines per step
    multiline_batch: int = 2  # pages (of up to max_lines lines, ≈ 20 lines on average) per step
    max_lines: int = 16
    lr: float = RECIPE_LR  # the recipe's rate: the middle of each sweep (cosine to lr / 100)
    lr_factors: Tuple[float, ...] = LR_FACTORS
    # presets trained at every rate of the grid (single-line tasks and scratch page runs); a page run fine-tuned from
    # single lines takes its model's best single-line rate
    sweep: Tuple[str, ...] = ("tiny-htr-vt", "tiny-htr-vpom", "tiny-htr-vpom-value", "tiny-htr-vpom-hybrid")
    lrs: Tuple[float, ...] = ()  # run only these rates (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    sam_rho: float = 0.0
    eval_limit: int = 0  # held-out examples scored (0: all)
    parts: Tuple[str, ...] = ("speed", "quality")
    data_dir: Optional[str] = None  # a dataset folder used instead of the offline defaults (tests, real data)
    model_overrides: Dict[str, Any] = field(default_factory=dict)  # applied to every preset (tests: toy sizes)
    seed: int = 0
    out: str = "runs/bench/ocr"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(presets=("htr-vt", "htr-vpom"), lines=(1, 4), budget=4, repeats=2, dtypes=("bf16",), quality_steps=40,
             multiline_steps=20, digits_steps=40, quality_batch=8, multiline_batch=2, max_lines=4, eval_limit=40,
             tasks=("digits",))


def _page_width(lines: int, height: int = 64, line_width: int = 512) -> int:
    """Pixels of a page of ``lines`` full lines side by side with the data pipeline's gaps (height / 4)."""
    return lines * line_width + (lines - 1) * (height // 4)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@torch.inference_mode()
def run_speed(cfg: OCRBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Lines/s of each model per dtype and page length, round-robin with the shared stem timed alone. A model is a
    preset, optionally with ``+field=value`` options (``htr-vt+attention_shift=2``): a compared form is timed as
    itself."""
    from tqdm.auto import tqdm

    bad = sorted(set(cfg.dtypes) - set(DTYPES))
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}; expected some of {', '.join(DTYPES)}")
    for n in cfg.lines:
        if n < 1 or cfg.budget % n:
            raise ValueError(f"the budget of {cfg.budget} lines per call is not a multiple of {n} lines per page")
    allocator = keep_freed_memory()
    torch.manual_seed(cfg.seed)
    rows: List[Dict[str, Any]] = []
    params: Dict[str, int] = {}
    bar = tqdm(total=len(cfg.dtypes) * len(cfg.lines) * (len(cfg.presets) + 1) * (cfg.repeats + 1),
               disable=not progress, desc="bench ocr speed", unit="call")
    for dtype in cfg.dtypes:
        models = {p: variant_model(p, **cfg.model_overrides).optimize_for_inference(DTYPES[dtype]) for p in cfg.presets}
        params.update({p: count_parameters(m) for p, m in models.items()})
        stem = models[cfg.presets[0]].stem
        height = next(iter(models.values())).config.height
        for n in cfg.lines:
            batch = cfg.budget // n
            width = _page_width(n, height)
            x = torch.rand(batch, 1, height, width)
            xn = torch.nn.functional.layer_norm(x, x.shape[1:]).to(DTYPES[dtype])
            fns = {p: (lambda m=m, x=x: m(x)) for p, m in models.items()}
            fns["stem"] = lambda s=stem, xn=xn: s(xn)
            timing = time_interleaved(fns, warmup=1, repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
            bar.update(len(fns))
            base, stem_t = timing[cfg.presets[0]].median, timing["stem"].median
            for p in cfg.presets:
                t = timing[p].median
                rows.append({"dtype": dtype, "lines": n, "tokens": (width + 3) // 4, "batch": batch,
                             "model": describe_variant(p, NAMES), "spec": p, "preset": p.split("+")[0],
                             "s_per_call": t, "lines_per_s": cfg.budget / t,
                             "speedup": base / t, "stem_share": stem_t / t, "spread": timing[p].spread,
                             "encoder_speedup": (base - stem_t) / max(t - stem_t, 1e-9)})
    bar.close()
    return {"rows": rows, "params": params, "allocator_tuned": allocator}


def _select(rows: List[Dict[str, Any]], cfg: OCRBenchConfig) -> List[Dict[str, Any]]:
    """Order the rows (task, preset, rate), mark each model's best rate per task (the lowest validation CER) and give
    each row its test CER ÷ HTR-VT's at HTR-VT's best rate."""
    d = OCRBenchConfig()  # the default order first, whichever subset this process ran
    tasks = list(dict.fromkeys(list(d.tasks) + list(cfg.tasks) + sorted({r["task"] for r in rows})))
    presets = list(dict.fromkeys(list(d.quality_presets) + list(cfg.quality_presets)
                                 + sorted({r["preset"] for r in rows})))
    rows = sorted(rows, key=lambda r: (tasks.index(r["task"]), presets.index(r["preset"]), r["lr"]))
    for task in tasks:
        mine = [r for r in rows if r["task"] == task]
        mark_best(mine, "val_cer", higher=False, key="preset")
        vt = next((r for r in best_rows(mine) if r["preset"] == BASELINE), None)
        for r in mine:
            r["cer_vs_vt"] = r["cer"] / vt["cer"] if vt and vt["cer"] > 0 else None
    return rows


def run_quality(cfg: OCRBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Train the quality presets per task with the same steps, batch and seed: each swept preset at every rate of the
    grid, a page run fine-tuned from single lines at its model's best single-line rate (the recipe's where that has no
    run yet). Finished runs are only evaluated again; runs of an earlier ocr.json not redone keep their rows."""
    from .data import load_split
    from .synth import resolve_data
    from .task import evaluate_ocr, train_ocr
    from ...checkpoint import load_weights

    if cfg.multiline_init not in ("single-line", "scratch"):
        raise ValueError(f"multiline_init must be 'single-line' or 'scratch', got {cfg.multiline_init!r}")
    roots: Dict[str, Path] = {}
    drawn: Dict[str, Optional[str]] = {}

    def recipe(cfg: OCRBenchConfig, job: SweepRun, stage: Stage) -> Any:
        return _quality_recipe(cfg, job, stage, progress)

    def evaluate(cfg: OCRBenchConfig, job: SweepRun, stage: Stage,
                 tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        task = stage.name
        data, spec, steps, batch = _task_of(cfg, task)
        if data not in roots:
            roots[data] = resolve_data(data, progress=progress)
        if task not in drawn:  # whose pictures: decided before the task's first run, as the file stood then
            drawn[task] = picture_owner(PICTURE, cfg.quality_presets,
                                        (Path(cfg.out) / f"ocr_samples_{task}.png").is_file())
        res = train_ocr(job.preset, tcfg, data, spec, eval_limit=cfg.eval_limit or None, progress=progress,
                        **job.overrides)
        model, charset = res["model"], res["charset"]
        load_weights(model, job.out, ema=True)
        test = load_split(roots[data], "test", model.config.height, model.config.max_width)
        m = evaluate_ocr(model, test, charset, spec, limit=cfg.eval_limit or None, progress=progress)
        # one picture per task and rate: test examples, references, predictions
        sample_png = _sample_picture(cfg, job, task, test, spec, m) if job.spec == drawn[task] else None
        val = res["metrics"]  # the training loop's final evaluation: the validation split (EMA weights)
        return res, {"task": task, "model": describe_variant(job.spec, NAMES), "preset": job.spec,
                     "params": count_parameters(model), "pattern": model.config.layer_pattern(), "steps": steps,
                     "batch": batch, "val_cer": val.get("cer"), "val_wer": val.get("wer"),
                     "cer": m["cer"], "wer": m["wer"], "test_examples": m["examples"], "test_lines": m["lines"],
                     "final_loss": res["history"][-1].get("loss") if res["history"] else None,
                     "samples": None if sample_png is None else sample_png.name}

    sweep = QualitySweep("ocr", RECIPE_LR, ("task", "preset"), recipe, evaluate, _select, lambda rows: "val_cer",
                         model="preset", stage_key="task")
    return sweep.run(cfg, _quality_stages(cfg))


def _task_of(cfg: OCRBenchConfig, task: str) -> Tuple[str, Any, int, int]:
    """A quality task's data (a folder, or the "digits" / "synthetic" generator), page layout (a ``PageSpec``),
    steps and batch."""
    from .task import PageSpec

    multiline = task.endswith("multiline")
    steps = cfg.multiline_steps if multiline else cfg.digits_steps if task.startswith("digits") else \
        cfg.quality_steps
    batch = cfg.multiline_batch if multiline else cfg.quality_batch
    data = cfg.data_dir or ("digits" if task.startswith("digits") else "synthetic")
    return data, PageSpec(multiline=multiline, max_lines=cfg.max_lines), steps, batch


def _quality_recipe(cfg: OCRBenchConfig, job: SweepRun, stage: Stage, progress: bool) -> Any:
    """The TrainConfig of one quality run: HTR-VT's recipe (EMA, strong weight decay, SAM as configured) at the
    job's rate; a page run under ``multiline_init="single-line"`` starts from its single-line run at that rate."""
    from ..train.loop import TrainConfig

    task = stage.name
    _, spec, steps, batch = _task_of(cfg, task)
    init = None
    if spec.multiline and cfg.multiline_init == "single-line":
        single = task.replace("-multiline", "")
        init = sweep_folder(Path(cfg.out) / "quality", f"{single}-{job.slug}", job.lr, cfg.lr)
        if not (init / "checkpoints").is_dir():
            raise ValueError(f"{task} starts from the single-line run {init}, which does not exist: put "
                             f"{single!r} before it in tasks, or multiline_init='scratch'")
    return TrainConfig(steps=steps, batch_size=batch, lr=job.lr, min_lr=job.lr / 100,
                       warmup=max(1, steps // 20), weight_decay=0.5, beta2=0.99, grad_clip=0.0, ema=0.999,
                       sam_rho=cfg.sam_rho, init_from=None if init is None else str(init),
                       eval_every=steps, ckpt_every=steps, out=str(job.out), progress=progress,
                       seed=cfg.seed + 11)


def _sample_picture(cfg: OCRBenchConfig, job: SweepRun, task: str, test: Any, spec: Any,
                    m: Dict[str, Any]) -> Path:
    """Draw up to 6 test examples spread over the split with their references and the run's predictions (``m``:
    its test evaluation) into ``ocr_samples_<task><rate suffix>.png`` under ``cfg.out``; returns the file."""
    from .task import draw_samples, examples_of, make_example

    examples = examples_of(test, spec)[:cfg.eval_limit or None]
    pick = sorted(set(int(i) for i in torch.linspace(0, len(examples) - 1, min(6, len(examples)))))
    suffix = job.out.name[len(f"{task}-{job.slug}"):].replace("-", "_")  # "" at the recipe's rate
    sample_png = Path(cfg.out) / f"ocr_samples_{task}{suffix}.png"
    draw_samples([make_example(test, examples[i], spec)[0] for i in pick],
                 [m["references"][i] for i in pick],
                 [m["predictions"][i] for i in pick], sample_png,
                 title=f"{describe_variant(job.spec, NAMES)}, {task}, lr {job.lr:g}: test CER "
                       f"{100 * m['cer']:.2f}%")
    return sample_png


def _quality_stages(cfg: OCRBenchConfig) -> List[Stage]:
    """One sweep stage per task: a page task fine-tuned from single lines takes each model's best single-line rate
    among the runs known when it starts."""
    def single_line_rates(task: str) -> Callable[[List[Dict[str, Any]]], Dict[str, float]]:
        """Each model's best rate on the task's single-line form among the runs known now."""
        return lambda rows: {r["preset"]: r["lr"] for r in rows if r["task"] == task and r.get("best_lr")}

    stages = []
    for task in cfg.tasks:
        single = task.replace("-multiline", "")
        derived = task.endswith("multiline") and cfg.multiline_init == "single-line"
        stages.append(Stage(tuple(cfg.quality_presets), name=task, prefix=f"{task}-",
                            rates=single_line_rates(single) if derived else None,
                            rates_label=lambda p, single=single: f"best {single}"))
    return stages


def _speed_verdicts(payload: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    rows = payload["speed"]["rows"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        pom = {r["lines"]: r for r in rows if r.get("spec", r["preset"]) == "htr-vpom" and r["dtype"] == dtype}
        ahead = [n for n in sorted(pom) if n >= 8]
        if ahead:
            ok = all(pom[n]["speedup"] > 1 for n in ahead)
            figures = ", ".join(f"{n} lines {pom[n]['speedup']:.3f}×" for n in ahead)
            out.append(f"{dtype}: HTR-VPoM ahead of HTR-VT from 8-line pages on: {figures} "
                       f"({'met' if ok else 'MISSED'})")
        if 16 in pom:
            s = pom[16]["speedup"]
            out.append(f"{dtype}: HTR-VPoM ÷ HTR-VT at 16 lines: {s:.3f}× ({'met' if s >= 1.1 else 'MISSED'}: "
                       f"≥ 1.1×)")
    return out


def _quality_verdicts(payload: Dict[str, Any], seeds: Optional[Any], main_json: Optional[Any]) -> List[str]:
    out: List[str] = []
    rows = best_rows(quality_rows(payload["quality"], RECIPE_LR))
    for task in dict.fromkeys(r["task"] for r in rows):
        by = {r["preset"]: r for r in rows if r["task"] == task}
        vt, pom, hyb = by.get(BASELINE), by.get("tiny-htr-vpom"), by.get("tiny-htr-vpom-hybrid")
        if vt is None:
            continue
        parts = [f"{task}: HTR-VT CER {100 * vt['cer']:.2f}%"]
        if task == "synthetic":
            parts[0] += f" ({'met' if vt['cer'] < 0.05 else 'MISSED'}: < 5%)"
        if hyb is not None:
            rel = hyb["cer"] / max(vt["cer"], 1e-9) - 1
            parts.append(f"hybrid {100 * hyb['cer']:.2f}% ({100 * rel:+.1f}% relative, "
                         f"{'met' if rel <= 0.10 else 'MISSED'}: ≤ +10%)")
        if pom is not None:
            rel = pom["cer"] / max(vt["cer"], 1e-9) - 1
            parts.append(f"all-PoM {100 * pom['cer']:.2f}% ({100 * rel:+.1f}% relative, "
                         f"{'met' if rel <= 0.25 else 'MISSED'}: ≤ +25%)")
        out.append(", ".join(parts))
    by_task = {(r["task"], r["preset"]): r for r in rows}  # a multi-line task takes its single-line best rate
    out += stale_rate_notes(rows, lambda r: by_task.get((r["lr_from"][5:], r["preset"]))
                            if r["lr_from"].startswith("best ") else None,
                            lambda r: f"--tasks {r['task']} --quality-presets {r['preset']}",
                            lambda r: f"{r['task']} {r['model']}", lambda p: f"{p['task']} {p['model']}")
    out += verdict_lines("ocr", payload, seeds, main_json)
    return out


def verdicts(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
             main_json: Optional[Dict[str, Any]] = None) -> List[str]:
    """The OCR bench's verdicts (lines/s against HTR-VT, the CER targets), each met or MISSED with its
    figure, then the parity targets over the seeds (``seeds``, ``main_json``: see
    :func:`~polymixer.experiments.bench.parity.verdict_lines`)."""
    return section_lines(payload, {"speed": _speed_verdicts,
                                   "quality": lambda p: _quality_verdicts(p, seeds, main_json)})


def _speed_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    p = payload["speed"]
    budget = p.get('config', payload['config'])['budget']
    lines += [f"lines/s in evaluation, {budget} lines per forward call; speedup = HTR-VT's "
              f"time ÷ the model's; stem share = the shared ResNet stem's share of the time; encoder speedup = "
              f"the same ratio without the stem's time (what the mixers change); spread = (max − min) / median "
              f"of the repeats"
              + ("; glibc malloc set to recycle freed memory" if p.get("allocator_tuned") else ""),
              format_table(p["rows"], ["dtype", "lines", "tokens", "batch", "model", "s_per_call", "lines_per_s",
                                       "speedup", "stem_share", "encoder_speedup", "spread"],
                           ["dtype", "lines/page", "tokens", "batch", "model", "s / call", "lines/s", "speedup",
                            "stem share", "encoder speedup", "spread"]),
              "params: " + ", ".join(f"{NAMES.get(k, k)} {v:,}" for k, v in p["params"].items()), ""]
    return lines


def _quality_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    q = payload["quality"]
    all_rows = quality_rows(q, RECIPE_LR)
    lines += ["equal budget (same steps, batch, seed); CER / WER on the held-out test split, each model at its "
              "best learning rate: the lowest validation CER (the training loop's final evaluation, EMA weights); "
              "page runs fine-tuned from single lines are not swept: they take their model's best single-line rate "
              "(lr from: best <task>)",
              format_table(best_rows(all_rows), ["task", "model", "params", "lr", "rates", "lr_from", "steps",
                                                 "batch", "val_cer", "cer", "cer_vs_vt", "wer", "test_lines",
                                                 "train_min"],
                           ["task", "model", "params", "best lr", "rates tried", "lr from", "steps", "batch",
                            "val CER", "CER", "÷ HTR-VT", "WER", "test lines", "train min"]),
              "", "every rate (AdamW, warm-up then cosine to lr / 100; * = best by validation CER): validation "
                  "CER %, then test CER %"]
    for task in dict.fromkeys(r["task"] for r in all_rows):
        mine = [r for r in all_rows if r["task"] == task]
        lines += [sweep_table(mine, metric, f"{task} {label} CER %", scale=100, key="preset")
                  for metric, label in (("val_cer", "val"), ("cer", "test"))]
        lines += [note for note in [edge_note(mine, key="preset")] if note]
    lines.append("")
    return lines


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The OCR bench's text: lines/s per page length, the quality sweep per task, then the verdicts (``seeds``:
    the other seeds' JSONs; ``main_json``: the family's main JSON where ``payload`` is a seed folder's)."""
    return render_report(payload, {"speed": _speed_report, "quality": _quality_report},
                         verdicts(payload, seeds, main_json))


def plot(payload: Dict[str, Any], path: Path) -> None:
    if "speed" not in payload:
        return
    fig, (ax, ax2) = new_figure(2, width=5.4)
    plot_speed_vs_baseline(ax, ax2, payload["speed"]["rows"], "tokens", "lines_per_s", NAMES,
                           "tokens per example (lines per page × 128)", "lines / s (evaluation)", "HTR-VT")
    fig.suptitle(f"paper-sized models (53.4M) — {payload['machine']['cpu']}", fontsize=9)
    save_figure(fig, path)


BENCH = FamilyBench("ocr", {"speed": run_speed, "quality": run_quality}, plot, report)


def run(cfg: OCRBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other part of an earlier run in the same folder."""
    return run_bench(BENCH, cfg, progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = OCRBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of both parts")
    p.add_argument("--parts", nargs="+", choices=["speed", "quality"], default=list(d.parts))
    p.add_argument("--presets", nargs="+", default=None,
                   help="models of the speed part (the first is the baseline), each optionally with +field=value "
                        "options (e.g. htr-vt+attention_shift=2)")
    p.add_argument("--lines", type=int_at_least(1), nargs="+", default=None, help="lines per page of the speed part")
    p.add_argument("--budget", type=int_at_least(1), default=None, help="lines per forward call")
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=None)
    p.add_argument("--tasks", nargs="+", choices=["synthetic", "synthetic-multiline", "digits"], default=None)
    p.add_argument("--quality-steps", type=int_at_least(1), default=None)
    p.add_argument("--multiline-steps", type=int_at_least(1), default=None)
    p.add_argument("--digits-steps", type=int_at_least(1), default=None)
    p.add_argument("--multiline-init", choices=["single-line", "scratch"], default=None,
                   help="page models start from their single-line run (default) or from random weights")
    p.add_argument("--sam-rho", type=float_in(Range(0)), default=None)
    p.add_argument("--quality-presets", nargs="+", default=None,
                   help=f"presets of the quality part (default: {' '.join(d.quality_presets)}; runs not redone keep "
                        f"their earlier rows); a variant overrides fields of its preset's config: "
                        f"tiny-htr-vt+attention_shift=2")
    add_sweep_arguments(p, "ocr", d.lr, d.lr_factors, d.out,
                        lrs_note="a page run's rate is its model's best single-line rate")


def main(args: argparse.Namespace) -> int:
    cfg = OCRBenchConfig(parts=tuple(args.parts), out=args.out)
    return bench_main(BENCH, args, cfg, QUICK,
                      {n: n for n in ("presets", "lines", "budget", "repeats", "dtypes", "tasks", "quality_steps",
                                      "multiline_steps", "digits_steps", "multiline_init", "sam_rho",
                                      "quality_presets")})
