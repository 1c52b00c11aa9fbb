"""``polymixer bench eo``: TSViT vs TSViPoM (and the hybrid) on this CPU.

1. speed: km²/s (10 m pixels) of the paper-sized models (1.66M parameters) in evaluation under
   ``torch.inference_mode()``, round-robin in one run, on series of T = 60 dates over windows of 24 (the training
   crops), 48, 96 and 128 pixels (a whole PASTIS patch) at a fixed budget of pixels per forward call, in fp32 and
   bf16. The temporal encoder costs the same per pixel at every window size; the spatial encoder's attention grows
   with the number of patches of the window (144 → 4,096 tokens) where PoM's stays linear;
2. quality at equal budget: the tiny presets (and variants: the reverse hybrid, rotary spatial positions) trained
   with the same steps, batches and seed on 24 × 24 windows of the offline default (the PASTIS stand-in, fold 1), then
   scored — OA and mIoU over every non-void pixel of the test fold — by windows of the training size covering each
   patch and on whole patches in one call (``--eval-windows 24 48 96 0`` on PASTIS's 128 × 128 patches: which
   spatial position keeps its accuracy beyond the training size; the stand-in's patches are one window). A confusion
   matrix and a picture of test tiles are drawn for one model. Attention, PoM, the value PoM and the hybrid are
   trained at every rate of a learning-rate sweep (×2 around the recipe's), each reported at its best rate by
   validation mIoU;
3. curves: the same four models at their best rates for 5× the quality part's steps, with a checkpoint every tenth
   of the run kept and scored on the test fold: test mIoU against steps (does the gap close with budget?) and the
   per-class IoU of the classes whose seasons differ by weeks rather than months (winter cereals; corn, soybeans,
   sorghum).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from .data import PIXEL_KM2
from ...models import count_parameters
from ..report import format_table, new_figure, plot_speed_vs_baseline, save_figure
from ..bench.parity import verdict_lines
from ..bench.common import (
    BRACKET, edge_note, FamilyBench, add_sweep_arguments, bench_main, run_bench, LR_FACTORS, QualitySweep, Stage,
    SweepRun, best_rows, describe_variant, earlier_part, keep_freed_memory, mark_best, parse_variant, picture_owner,
    render_report, section_lines, resume_point, same_rate, sweep_table, time_interleaved, training_claim, variant_model,
    training_minutes, variant_slug, read_json,
)
from ..tasks.common import int_at_least

__all__ = ["EOBenchConfig", "run_speed", "run_quality", "parse_variant", "verdicts", "report", "plot", "run", "main",
           "add_arguments"]

NAMES = {"tsvit": "TSViT", "tsvipom": "TSViPoM", "tsvipom-hybrid": "TSViPoM Hybrid", "tiny-tsvit": "tiny TSViT",
         "tiny-tsvipom": "tiny TSViPoM", "tiny-tsvipom-hybrid": "tiny hybrid", "tsvipom-value": "TSViPoM-value",
         "tsvipom-local": "TSViPoM-local",
         "tiny-tsvipom-value": "tiny TSViPoM-value"}
# the classes whose seasons share one shape and differ by weeks (synth.SEASONS): the winter cereals, and corn, soybeans
# and sorghum
TIMING_CLASSES = {"winter cereals": (2, 4, 10, 11, 17), "summer crops": (3, 15, 18)}
SWEPT = ("tiny-tsvit", "tiny-tsvipom", "tiny-tsvipom-value", "tiny-tsvipom-hybrid")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class EOBenchConfig:
    presets: Tuple[str, ...] = ("tsvit", "tsvipom", "tsvipom-hybrid")
    sides: Tuple[int, ...] = (24, 48, 96, 128)  # window side in pixels
    frames: int = 60  # dates per series (TSViT's maximum)
    budget: int = 16384  # pixels per forward call (batch = ⌈budget / side²⌉): one PASTIS patch
    repeats: int = 3
    dtypes: Tuple[str, ...] = ("fp32", "bf16")
    # each entry: a preset, optionally "+field=value" overrides of its config (variants)
    quality_models: Tuple[str, ...] = ("tiny-tsvit", "tiny-tsvipom", "tiny-tsvipom-value", "tiny-tsvipom-hybrid",
                                       "tiny-tsvipom-hybrid+hybrid_pom=temporal", "tiny-tsvit+spatial_position=rope",
                                       "tiny-tsvipom+spatial_position=rope")
    quality_steps: int = 800  # ≈ 10 min per tiny model on 2 free cores (estimated from per-step timings)
    quality_batch: int = 8
    lr: float = 1e-3  # the recipe's rate: the middle of each sweep
    lr_factors: Tuple[float, ...] = LR_FACTORS
    sweep: Tuple[str, ...] = SWEPT  # quality models trained at every rate of the grid (the others at lr)
    lrs: Tuple[float, ...] = ()  # run only these rates of the grid (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    curve_models: Tuple[str, ...] = SWEPT  # the curves part: these at their best rates …
    curve_factor: int = 5  # … for this many times quality_steps …
    curve_points: int = 10  # … scored on the test fold at this many checkpoints
    crop: int = 24  # training windows
    eval_windows: Tuple[int, ...] = (24, 0)  # 0: whole patches in one call (add 48 96 for PASTIS's 128 px patches)
    eval_limit: int = 0  # test patches scored (0: all)
    picture_model: str = "tiny-tsvipom"  # whose confusion matrix and tiles are drawn (else the last quality model)
    fold: int = 1
    parts: Tuple[str, ...] = ("speed", "quality")
    data_dir: Optional[str] = None  # a PASTIS-layout folder instead of the offline default (tests, real PASTIS)
    model_overrides: Dict[str, Any] = field(default_factory=dict)  # applied to every model (tests: toy sizes)
    seed: int = 0
    out: str = "runs/bench/eo"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(presets=("tsvit", "tsvipom"), sides=(24, 48), frames=24, budget=2304, repeats=2, dtypes=("bf16",),
             quality_models=("tiny-tsvit", "tiny-tsvipom"), quality_steps=40, quality_batch=4,
             eval_windows=(24, 0), eval_limit=2, sweep=(), curve_models=("tiny-tsvit", "tiny-tsvipom"), curve_factor=2,
             curve_points=2)


def variant_name(spec: str) -> str:
    return describe_variant(spec, NAMES)


@torch.inference_mode()
def run_speed(cfg: EOBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """km²/s of each model per dtype and window side, round-robin, T = ``cfg.frames`` dates. A model is a preset,
    optionally with ``+field=value`` options (``tsvit+date_rope=true``): the form a quality comparison picked is
    timed as itself, never as its plain preset."""
    from tqdm.auto import tqdm

    bad = sorted(set(cfg.dtypes) - set(DTYPES))
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}; expected some of {', '.join(DTYPES)}")
    allocator = keep_freed_memory()
    torch.manual_seed(cfg.seed)
    rows: List[Dict[str, Any]] = []
    params: Dict[str, int] = {}
    bar = tqdm(total=len(cfg.dtypes) * len(cfg.sides) * len(cfg.presets) * (cfg.repeats + 1), disable=not progress,
               desc="bench eo speed", unit="call")
    for dtype in cfg.dtypes:
        models = {p: variant_model(p, **cfg.model_overrides).eval().to(DTYPES[dtype]) for p in cfg.presets}
        params.update({p: count_parameters(m) for p, m in models.items()})
        first = next(iter(models.values())).config
        for side in cfg.sides:
            if side % first.patch_size:
                raise ValueError(f"window side {side} is not a multiple of the patch size {first.patch_size}")
            batch = -(-cfg.budget // (side * side))
            x = torch.randn(batch, cfg.frames, side, side, first.num_bands)
            doy = torch.sort(torch.randint(0, 365, (batch, cfg.frames)), dim=1).values
            fns = {p: (lambda m=m: m(x, doy)) for p, m in models.items()}
            timing = time_interleaved(fns, warmup=1, repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
            bar.update(len(fns))
            base = timing[cfg.presets[0]].median
            grid = side // first.patch_size
            for p in cfg.presets:
                t = timing[p].median
                rows.append({"dtype": dtype, "side": side, "batch": batch, "spatial_tokens": grid * grid,
                             "temporal_tokens": first.num_classes + cfg.frames, "model": variant_name(p), "spec": p,
                             "preset": p.split("+")[0],
                             "s_per_call": t, "km2_per_s": batch * side * side * PIXEL_KM2 / t, "speedup": base / t,
                             "spread": timing[p].spread})
    bar.close()
    return {"rows": rows, "params": params, "allocator_tuned": allocator}


def _train_cfg(cfg: EOBenchConfig, out: Path, lr: float, steps: int, ckpt_every: int, keep: int,
               progress: bool) -> Any:
    from ..train.loop import TrainConfig

    return TrainConfig(steps=steps, batch_size=cfg.quality_batch, lr=lr, min_lr=lr / 100,
                       warmup=max(1, cfg.quality_steps // 20), weight_decay=0.0, beta2=0.999, grad_clip=1.0,
                       eval_every=steps, ckpt_every=ckpt_every, keep=keep, out=str(out), progress=progress,
                       seed=cfg.seed + 11)


def run_quality(cfg: EOBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """The quality models trained with the same steps, batches and seed (the swept ones at every rate of the grid),
    scored on the test fold by windows of each side and whole patches; each model's best rate by validation mIoU."""

    from .data import PastisSplit, fold_splits
    from .synth import resolve_data
    from .task import draw_confusion, draw_tiles, evaluate_eo, train_eo

    root = resolve_data(cfg.data_dir, progress=progress)
    path = Path(cfg.out) / "eo.json"
    pictures: Dict[str, str] = dict(earlier_part(path).get("pictures", {}))
    drawn = picture_owner(cfg.picture_model, cfg.quality_models, "confusion" in pictures)
    draw_window = cfg.crop if cfg.crop in cfg.eval_windows else cfg.eval_windows[0]

    def evaluate(cfg: EOBenchConfig, job: SweepRun, stage: Stage, tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        res = train_eo(job.preset, tcfg, str(root), cfg.fold, cfg.crop, eval_limit=cfg.eval_limit or None,
                       progress=progress, **job.overrides)
        model, stats = res["model"], res["stats"]
        test = PastisSplit(root, fold_splits(cfg.fold)["test"], model.config.num_bands, model.config.max_frames)
        by_window: Dict[str, Dict[str, float]] = {}
        per_class = None
        for w in cfg.eval_windows:
            draw = job.spec == drawn and w == draw_window and same_rate(job.lr, cfg.lr)
            m = evaluate_eo(model, test, stats, window=w or None, limit=cfg.eval_limit or None, progress=progress,
                            keep_predictions=3 if draw else 0)
            key = str(w) if w else "whole"
            by_window[key] = {"oa": m["oa"], "miou": m["miou"], "km2_per_s": m["km2_per_s"], "pixels": m["pixels"],
                              "side": w or max(test.sizes[0])}
            if w == cfg.crop:
                per_class = {int(c["class"]): c["iou"] for c in m["per_class"]}
            if draw:  # one model's pictures: its confusion matrix and three test tiles
                title = f"{variant_name(job.spec)}, test fold: OA {100 * m['oa']:.1f}%, mIoU {100 * m['miou']:.1f}%"
                pictures["confusion"] = draw_confusion(m["confusion"], Path(cfg.out) / "eo_confusion.png", title).name
                pictures["tiles"] = draw_tiles(test, m["predictions"], Path(cfg.out) / "eo_tiles.png", title).name
        return res, {"model": variant_name(job.spec), "spec": job.spec, "preset": job.preset,
                     "params": count_parameters(model), "pattern": model.pattern,
                     "spatial_position": model.config.spatial_position,
                     "steps": cfg.quality_steps, "batch": cfg.quality_batch,
                     "final_loss": res["history"][-1].get("loss") if res["history"] else None,
                     "val_miou": res["metrics"].get("miou"), "test_patches": m["patches"], "windows": by_window,
                     "per_class_iou": per_class,
                     **{f"oa_{k}": v["oa"] for k, v in by_window.items()},
                     **{f"miou_{k}": v["miou"] for k, v in by_window.items()}}

    sweep = QualitySweep("eo", cfg.lr, ("spec",),
                         recipe=lambda c, job, stage: _train_cfg(c, job.out, job.lr, c.quality_steps,
                                                                 c.quality_steps, 3, progress),
                         evaluate=evaluate, select=_select, selected_by=lambda rows: "val_miou", model="spec")
    return {**sweep.run(cfg, [Stage(tuple(cfg.quality_models))]), "data": str(root), "pictures": pictures}


def _select(rows: List[Dict[str, Any]], cfg: EOBenchConfig) -> List[Dict[str, Any]]:
    """Each model's best rate marked, chosen on validation mIoU."""
    return mark_best(rows, "val_miou", higher=True)


def best_rates(cfg: EOBenchConfig) -> Dict[str, float]:
    """Each quality model's best rate from the quality part in ``<out>/eo.json`` (models not there: the recipe's)."""
    path = Path(cfg.out) / "eo.json"
    rows = read_json(path).get("quality", {}).get("rows", []) if path.is_file() else []
    return {r["spec"]: r["lr"] for r in rows if r.get("best_lr")}


def run_curves(cfg: EOBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Learning curves: each of ``curve_models`` at its best rate of the quality part, trained for ``curve_factor``
    × the quality steps (same batch, seed, warm-up), a checkpoint every 1 / ``curve_points`` of the run kept and
    scored on the test fold by windows of the training crop: mIoU, OA and per-class IoU against steps."""
    from .data import PastisSplit, fold_splits
    from .synth import resolve_data
    from .task import evaluate_eo, train_eo
    from ...checkpoint import checkpoint_step, load_weights, resolve_checkpoint

    root = resolve_data(cfg.data_dir, progress=progress)
    rates = best_rates(cfg)
    steps = cfg.quality_steps * cfg.curve_factor
    every = max(1, steps // cfg.curve_points)
    rows = []
    for spec in cfg.curve_models:
        preset, overrides = parse_variant(spec)
        overrides = {**cfg.model_overrides, **overrides}
        lr = rates.get(spec, cfg.lr)
        slug = variant_slug(spec)
        out = Path(cfg.out) / "curves" / f"{slug}-lr{lr:g}-{steps}steps"
        # every checkpoint kept: one written when a run is interrupted must not push out a scheduled one
        tcfg = _train_cfg(cfg, out, lr, steps, every, steps, progress)
        with training_claim(out) as mine:
            if not mine:
                continue
            finished = resume_point(out, tcfg)
            t0 = time.perf_counter()
            res = train_eo(preset, tcfg, str(root), cfg.fold, cfg.crop, eval_limit=cfg.eval_limit or None,
                           progress=progress, **overrides)
            minutes = training_minutes(out, t0, finished, res["history"], cfg.quality_batch)
        model, stats = res["model"], res["stats"]
        test = PastisSplit(root, fold_splits(cfg.fold)["test"], model.config.num_bands, model.config.max_frames)
        points = []
        for ck in sorted((out / "checkpoints").glob("step_*")):
            step = checkpoint_step(ck)
            if step % every and step != steps:
                continue  # written when the run was interrupted, not a point of the curve
            load_weights(model, resolve_checkpoint(ck))
            m = evaluate_eo(model, test, stats, window=cfg.crop, limit=cfg.eval_limit or None, progress=False)
            points.append({"step": step, "miou": m["miou"], "oa": m["oa"], "matrix": m["matrix"],
                           "per_class_iou": {int(c["class"]): c["iou"] for c in m["per_class"]}})
        rows.append({"model": variant_name(spec), "spec": spec, "lr": lr, "lr_from": "quality sweep"
                     if spec in rates else "recipe (no sweep result)", "steps": steps, "train_min": minutes,
                     "points": points})
    # the curves of models not run again are kept (read after training: processes sharing the part keep each other's)
    path = Path(cfg.out) / "eo.json"
    earlier = read_json(path).get("curves", {}).get("rows", []) if path.is_file() else []
    done = {r["spec"] for r in rows}
    rows = [r for r in earlier if r["spec"] not in done] + rows
    order = {s: i for i, s in enumerate(SWEPT)}
    rows.sort(key=lambda r: order.get(r["spec"], len(order)))
    return {"rows": rows, "timing_classes": {k: list(v) for k, v in TIMING_CLASSES.items()}}


def quality_seed(payload: Dict[str, Any]) -> int:
    """The seed of a bench JSON's quality runs (0 for runs made before seeds were recorded)."""
    return int(payload.get("quality", {}).get("config", {}).get("seed", 0) or 0)


def seed_rows(payload: Dict[str, Any], seeds: List[Dict[str, Any]], row: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """``row`` on each seed: itself (under the seed of ``payload``) and the same model's runs at the same rate and
    steps in the other seeds' payloads (``seeds``: :func:`~polymixer.experiments.bench.common.seed_payloads`)."""
    found = {quality_seed(payload): row}
    for other in seeds:
        for r in other.get("quality", {}).get("rows", []):
            if r["spec"] == row["spec"] and same_rate(r["lr"], row["lr"]) and r["steps"] == row["steps"]:
                found[quality_seed(other)] = r
    return found


def _speed_verdicts(payload: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    rows = payload["speed"]["rows"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        pom = {r["side"]: r for r in rows if r.get("spec", r["preset"]) == "tsvipom" and r["dtype"] == dtype}
        if not pom:
            continue
        small, large = min(pom), max(pom)
        s = pom[small]["speedup"]
        out.append(f"{dtype}: TSViPoM ÷ TSViT at {small}×{small}: {s:.2f}× ({'met' if s >= 1.0 else 'MISSED'}: "
                   f"≥ 1×)")
        if large != small:
            s = pom[large]["speedup"]
            out.append(f"{dtype}: TSViPoM ÷ TSViT at {large}×{large}: {s:.2f}× "
                       f"({'met' if s >= 3.0 else 'MISSED'}: ≥ 3×; the paper: 3.65×)")
    return out


def _quality_verdicts(payload: Dict[str, Any], seeds: Optional[Any], main_json: Optional[Any]) -> List[str]:
    out: List[str] = []
    rows = best_rows(payload["quality"]["rows"])
    crop = str(payload["quality"].get("config", payload["config"])["crop"])
    out += verdict_lines("eo", payload, seeds, main_json)
    for r in rows:
        if f"miou_{crop}" in r and "miou_whole" in r:
            keep = [f"{k}: {100 * v['miou']:.1f}" for k, v in r["windows"].items()]
            out.append(f"{r['model']}: mIoU by evaluation window ({', '.join(keep)}) — whole patches "
                       f"{100 * (r['miou_whole'] - r[f'miou_{crop}']):+.1f} points vs {crop}×{crop} windows")
    return out


def verdicts(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
             main_json: Optional[Dict[str, Any]] = None) -> List[str]:
    """The satellite bench's verdicts (km²/s against TSViT, the quality targets), each met or MISSED with its
    figure, then the parity targets over the seeds (``seeds``, ``main_json``: see
    :func:`~polymixer.experiments.bench.parity.verdict_lines`)."""
    return section_lines(payload, {"speed": _speed_verdicts,
                                   "quality": lambda p: _quality_verdicts(p, seeds, main_json)})


def per_class_over_seeds(payload: Dict[str, Any], seeds: List[Dict[str, Any]]) -> List[str]:
    """Every class's test IoU, each model's mean over the seeds it ran at its best rate of this sweep (same steps),
    for the models run on more than one seed, beside TSViT's, classes ordered by the first such model's gap: which
    classes carry the gap between models, measured where one seed's noise does not decide it."""
    from .data import PASTIS_CLASSES

    best = {r["spec"]: r for r in best_rows(payload.get("quality", {}).get("rows", [])) if r.get("per_class_iou")}
    runs = {k: [r["per_class_iou"] for r in seed_rows(payload, seeds, b).values() if r.get("per_class_iou")]
            for k, b in best.items()}
    if "tiny-tsvit" not in runs or len(runs["tiny-tsvit"]) < 2:
        return []
    models = sorted((k for k in runs if k != "tiny-tsvit" and len(runs[k]) >= 2), key=lambda k: "+" in k)  # presets 1st
    if not models:
        return []
    classes = sorted({int(c) for ious in runs["tiny-tsvit"] for c in ious})
    mean = {k: {c: 100 * sum(i.get(str(c), 0.0) for i in v) / len(v) for c in classes} for k, v in runs.items()}
    order = sorted(classes, key=lambda c: mean[models[0]][c] - mean["tiny-tsvit"][c])
    timing = {c for group in TIMING_CLASSES.values() for c in group}
    table = [{"cls": PASTIS_CLASSES[c] + (" (weeks apart)" if c in timing else ""), "tsvit": mean["tiny-tsvit"][c],
              **{f"m{j}": mean[k][c] for j, k in enumerate(models)},
              **{f"g{j}": mean[k][c] - mean["tiny-tsvit"][c] for j, k in enumerate(models)}} for c in order]
    names = [variant_name(k) for k in models]
    n = {k: len(runs[k]) for k in runs}
    return [f"per-class test IoU % at the training crop, mean over seeds (TSViT {n['tiny-tsvit']}, "
            + ", ".join(f"{variant_name(k)} {n[k]}" for k in models) + "; each at its best rate, same steps), "
            f"classes ordered by the gap of {names[0]}",
            format_table(table, ["cls", "tsvit"] + [f"m{j}" for j in range(len(models))]
                         + [f"g{j}" for j in range(len(models))],
                         ["class", "TSViT"] + names + [f"{m} − TSViT" for m in names]), ""]


def _speed_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    p = payload["speed"]
    c = p.get("config", payload["config"])
    lines += [f"km²/s in evaluation (10 m pixels), T = {c['frames']} dates, ≈ {c['budget']:,} pixels per forward "
              f"call; speedup = TSViT's time ÷ the model's"
              + ("; glibc malloc set to recycle freed memory" if p.get("allocator_tuned") else ""),
              format_table(p["rows"], ["dtype", "side", "batch", "spatial_tokens", "model", "s_per_call",
                                       "km2_per_s", "speedup"],
                           ["dtype", "window", "batch", "spatial tokens", "model", "s / call", "km²/s",
                            "speedup"]),
              "params: " + ", ".join(f"{NAMES.get(k, k)} {v:,}" for k, v in p["params"].items()), ""]
    return lines


def _quality_report(payload: Dict[str, Any], seeds: Optional[Any], main_json: Optional[Any]) -> List[str]:
    lines: List[str] = []
    all_rows = payload["quality"]["rows"]
    rows = best_rows(all_rows)
    keys = list(dict.fromkeys(k for r in rows for k in r["windows"]))
    table = [{**r, **{f"o_{k}": 100 * r["windows"][k]["oa"] for k in keys if k in r["windows"]},
              **{f"m_{k}": 100 * r["windows"][k]["miou"] for k in keys if k in r["windows"]}} for r in rows]
    label = lambda k: "whole" if k == "whole" else f"{k}px"  # noqa: E731
    crop = payload["quality"].get("config", payload["config"])["crop"]
    lines += [f"equal budget (same steps, batch, seed; trained on {crop}×{crop} windows); OA / mIoU % on every "
              f"non-void pixel of the test fold, predicted by windows of each side covering the patch, or whole "
              f"patches in one call",
              f"each model at its best learning rate (highest validation mIoU; {len(all_rows)} runs)",
              format_table(table, ["model", "pattern", "params", "lr", "rates", "steps", "train_min"]
                           + [f"o_{k}" for k in keys] + [f"m_{k}" for k in keys],
                           ["model", "blocks (temporal, spatial)", "params", "best lr", "rates tried", "steps",
                            "train min"] + [f"OA {label(k)}" for k in keys]
                           + [f"mIoU {label(k)}" for k in keys]), "",
              "every rate: validation mIoU % (the selection; * = best) and test mIoU % at the training crop",
              sweep_table(all_rows, "val_miou", "val mIoU", scale=100),
              sweep_table(all_rows, f"miou_{crop}", "test mIoU", scale=100)]
    lines += [note for note in [edge_note(all_rows, name="model")] if note] + [""]
    timing = [r for r in rows if r.get("per_class_iou")]
    if timing:
        cls = [c for group in TIMING_CLASSES.values() for c in group]
        from .data import PASTIS_CLASSES

        lines += ["per-class test IoU % of the classes whose seasons differ by weeks "
                  "(winter cereals | corn, soybeans, sorghum)",
                  format_table([{"model": r["model"], **{str(c): _pct(r["per_class_iou"].get(str(c), r[
                      "per_class_iou"].get(c))) for c in cls}} for r in timing], ["model"] + [str(c) for c in cls],
                      ["model"] + [PASTIS_CLASSES[c] for c in cls]), ""]
    lines += per_class_over_seeds(main_json if main_json is not None else payload, seeds or [])
    return lines


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The satellite bench's text: km²/s per window side, the quality sweep, whole patches and per-class IoU over
    seeds, learning curves, then the verdicts (``seeds``, ``main_json``: as :func:`verdicts`)."""
    sections = {"speed": _speed_report, "quality": lambda p: _quality_report(p, seeds, main_json),
                "curves": lambda p: _curves_report(p["curves"])}
    return render_report(payload, sections, verdicts(payload, seeds, main_json))


def _pct(v: Any) -> Optional[float]:
    return None if v is None else 100 * v


def _curves_report(p: Dict[str, Any]) -> List[str]:
    """Test mIoU against steps for each curve model, the gap to attention at each point, and the classes whose
    seasons differ by weeks at the last point."""
    rows = p["rows"]
    if not rows:
        return []
    steps = sorted({pt["step"] for r in rows for pt in r["points"]})
    table = [{"model": r["model"], "lr": r["lr"], **{str(pt["step"]): 100 * pt["miou"] for pt in r["points"]}}
             for r in rows]
    lines = [f"learning curves: test mIoU % at the training crop against steps (each model at its best rate of the "
             f"quality sweep; {rows[0]['steps']} steps = {rows[0]['steps'] // max(1, steps[0]) if steps else 0} "
             f"checkpoints)",
             format_table(table, ["model", "lr"] + [str(s) for s in steps], ["model", "lr"] + [str(s) for s in steps])]
    att = next((r for r in rows if r["spec"] == "tiny-tsvit"), None)
    if att:
        a = {pt["step"]: pt["miou"] for pt in att["points"]}
        for r in rows:
            if r is att:
                continue
            b = {pt["step"]: pt["miou"] for pt in r["points"]}
            common = [s for s in steps if s in a and s in b]
            if len(common) >= 2:
                first, last = common[0], common[-1]
                lines.append(f"{r['model']} − TSViT: {100 * (b[first] - a[first]):+.1f} points at step {first}, "
                             f"{100 * (b[last] - a[last]):+.1f} at step {last}")
    from .data import PASTIS_CLASSES

    cls = [c for group in p["timing_classes"].values() for c in group]
    last = [{"model": r["model"], **{str(c): _pct(r["points"][-1]["per_class_iou"].get(str(c)))
                                     for c in cls}} for r in rows if r["points"]]
    lines += ["", "per-class test IoU % at the last step of the curves (classes whose seasons differ by weeks)",
              format_table(last, ["model"] + [str(c) for c in cls], ["model"] + [PASTIS_CLASSES[c] for c in cls]), ""]
    return lines + confusions_report(rows)


def confusions_report(rows: List[Dict[str, Any]], classes: int = 5, top: int = 3) -> List[str]:
    """What each curve model takes the pixels of the classes carrying its gap for, at the last step: for the
    ``classes`` classes with the largest IoU deficit against TSViT, each model's recall and the ``top`` classes the
    rest of those pixels go to (shares of the class's pixels) — the errors behind a gap, not just its size."""
    from .data import PASTIS_CLASSES

    att = next((r for r in rows if r["spec"] == "tiny-tsvit" and r["points"] and "matrix" in r["points"][-1]), None)
    if att is None:
        return []
    lines = []
    for r in rows:
        if r is att or not r["points"] or "matrix" not in r["points"][-1]:
            continue
        a, b = att["points"][-1], r["points"][-1]
        deficit = {int(c): (a["per_class_iou"].get(str(c)) or 0.0) - (v or 0.0)
                   for c, v in b["per_class_iou"].items()}
        worst = sorted(deficit, key=deficit.get, reverse=True)[:classes]
        table = []
        for c in worst:
            for who, pt in (("TSViT", a), (r["model"], b)):
                row = pt["matrix"][c]
                n = sum(row) or 1
                wrong = sorted((k for k in range(len(row)) if k != c and row[k]), key=lambda k: -row[k])[:top]
                table.append({"cls": PASTIS_CLASSES[c], "model": who, "recall": 100 * row[c] / n,
                              "as": ", ".join(f"{PASTIS_CLASSES[k]} {100 * row[k] / n:.0f}%" for k in wrong)})
        lines += [f"{r['model']} against TSViT at steps {b['step']} / {a['step']}: the {len(worst)} classes with the "
                  f"largest IoU deficit, recall % and where the other pixels go",
                  format_table(table, ["cls", "model", "recall", "as"], ["class", "model", "recall %",
                                                                          "taken for (share of the class's pixels)"]),
                  ""]
    return lines


def plot(payload: Dict[str, Any], path: Path) -> None:
    panels = [k for k in ("speed", "quality", "curves") if k in payload]
    if not panels:
        return
    fig, axes = new_figure(len(panels) + ("speed" in payload), width=5.0)
    k = 0
    if "speed" in payload:
        plot_speed_vs_baseline(axes[0], axes[1], payload["speed"]["rows"], "side", "km2_per_s", NAMES,
                               "window side (pixels of 10 m)", "km² / s (evaluation)", "TSViT")
        k = 2
    rows = best_rows(payload["quality"]["rows"]) if "quality" in payload else []
    curves = payload["curves"]["rows"] if "curves" in payload else []
    # one colour per model in both panels (matplotlib's 10-colour cycle, then tab20's)
    models = list(dict.fromkeys([r["model"] for r in rows] + [r["model"] for r in curves]))
    from matplotlib import colormaps

    color = {m: f"C{j}" if len(models) <= 10 else colormaps["tab20"](j % 20) for j, m in enumerate(models)}
    if "quality" in payload:
        ax = axes[k]
        k += 1
        for r in rows:
            keys = list(r["windows"])
            xs = [r["windows"][key]["side"] for key in keys]
            ax.plot(xs, [100 * r["windows"][key]["miou"] for key in keys], marker="o", color=color[r["model"]],
                    ls="--" if r["spatial_position"] == "rope" else "-", label=r["model"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation window side (the largest: whole patches)")
        ax.set_ylabel("test mIoU %")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    if "curves" in payload:
        ax = axes[k]
        for r in curves:
            ax.plot([pt["step"] for pt in r["points"]], [100 * pt["miou"] for pt in r["points"]], marker="o",
                    color=color[r["model"]], label=f"{r['model']} (lr {r['lr']:g})")
        ax.set_xlabel("training steps")
        ax.set_ylabel("test mIoU % (training-crop windows)")
        ax.set_title("learning curves")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"TSViT vs TSViPoM — {payload['machine']['cpu']}", fontsize=9)
    save_figure(fig, path)


BENCH = FamilyBench("eo", {"speed": run_speed, "quality": run_quality, "curves": run_curves}, plot, report,
                    models=("quality_models", "curve_models"), trained=("quality", "curves"))


def run(cfg: EOBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other part of an earlier run in the same folder."""
    return run_bench(BENCH, cfg, progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = EOBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of both parts")
    p.add_argument("--parts", nargs="+", choices=["speed", "quality", "curves"], default=list(d.parts),
                   help="curves: the learning curves of the quality models at their best rates (5× the steps)")
    p.add_argument("--presets", nargs="+", default=None,
                   help="models of the speed part (the first is the baseline), each optionally with +field=value "
                        "options (e.g. tsvit+date_rope=true)")
    p.add_argument("--sides", type=int_at_least(1), nargs="+", default=None, help="window sides of the speed part")
    p.add_argument("--frames", type=int_at_least(1), default=None, help="dates per series in the speed part")
    p.add_argument("--budget", type=int_at_least(1), default=None, help="pixels per forward call")
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=None)
    p.add_argument("--quality-models", nargs="+", default=None,
                   help="presets of the quality part, each optionally with +field=value overrides "
                        "(e.g. tiny-tsvipom+spatial_position=rope)")
    p.add_argument("--quality-steps", type=int_at_least(1), default=None)
    p.add_argument("--quality-batch", type=int_at_least(1), default=None)
    p.add_argument("--eval-windows", type=int_at_least(1), nargs="+", default=None,
                   help="evaluation window sides of the quality part (0: whole patches)")
    p.add_argument("--eval-limit", type=int_at_least(0), default=None, help="test patches scored (0: all)")
    p.add_argument("--curve-models", nargs="+", default=None, help="models of the curves part")
    p.add_argument("--curve-factor", type=int_at_least(1), default=None,
                   help="curves: this many times the quality steps")
    p.add_argument("--data", default=None, help="PASTIS folder for the quality part (default: the synthetic one)")
    add_sweep_arguments(p, "eo", d.lr, d.lr_factors, d.out, models="quality models",
                        sweep_note=f"default: {' '.join(d.sweep)}")


def main(args: argparse.Namespace) -> int:
    cfg = EOBenchConfig(parts=tuple(args.parts), out=args.out)
    if args.data is not None:
        cfg.data_dir = args.data
    return bench_main(BENCH, args, cfg, QUICK,
                      {n: n for n in ("presets", "sides", "frames", "budget", "repeats", "dtypes", "quality_models",
                                      "quality_steps", "quality_batch", "eval_windows", "eval_limit", "curve_models",
                                      "curve_factor")})
