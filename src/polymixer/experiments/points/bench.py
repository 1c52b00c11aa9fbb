"""``polymixer bench points``: PTv3 vs PPoMv3 (and the hybrid) on this CPU.

1. speed: 10⁶ points/s (voxels fed to the network) of the paper-sized models in evaluation under
   ``torch.inference_mode()``, round-robin in one run, on synthetic rooms cropped to 10k, 40k and 160k voxels
   (0.02 m grid) with patches of 1,024; then, on ``patch_scene`` voxels, attention and PoM with larger patches and
   PoM with the whole scene as context;
2. conv: the pure-PyTorch submanifold convolution, forward + backward, with the symmetric-map backward against
   plain autograd through the gather (scatter-adds);
3. quality at equal budget: the tiny presets (and PoM-context variants) trained with the same steps, batches and seed
   on the offline synthetic rooms, scored on the held-out test rooms: mIoU (PTv3's: over every original point),
   overall accuracy. The swept presets (PTv3, PPoMv3, value PPoMv3, the hybrid) are trained at every rate of a
   learning-rate sweep (0.5×, 1×, 2× the recipe's rate) and reported at their best rate, chosen on the validation
   mIoU; a variant of a swept preset takes that preset's best rate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ...models import count_parameters
from ..report import format_table, new_figure, save_figure
from ..bench.parity import verdict_lines
from ..bench.common import (
    BRACKET, edge_note, FamilyBench, add_sweep_arguments, bench_main, run_bench, LR_FACTORS, QualitySweep, Stage,
    SweepRun, best_rows, describe_variant, earlier_part, keep_freed_memory, mark_best, parse_variant, picture_owner,
    quality_rows, render_report, section_lines, stale_rate_notes, sweep_table, time_interleaved, variant_model,
)
from ..tasks.common import int_at_least

__all__ = ["PointBenchConfig", "make_scene", "run_speed", "run_conv", "run_quality", "verdicts", "report", "plot",
           "run", "main", "add_arguments"]

NAMES = {"ptv3": "PTv3", "ppomv3": "PPoMv3", "ppomv3-hybrid": "PPoMv3 Hybrid", "ppomv3-value": "PPoMv3 value",
         "tiny-ptv3": "tiny PTv3", "tiny-ppomv3": "tiny PPoMv3", "tiny-ppomv3-hybrid": "tiny hybrid",
         "tiny-ppomv3-value": "tiny PPoMv3 value"}
BASELINE = "tiny-ptv3"  # the attention model every difference is taken against
RECIPE_LR = 6e-3  # the rate of the runs made before sweeps existed (rows without an "lr")


@dataclass
class PointBenchConfig:
    presets: Tuple[str, ...] = ("ptv3", "ppomv3", "ppomv3-hybrid")  # the first is the baseline
    sizes: Tuple[int, ...] = (10_000, 40_000, 160_000)  # voxels per scene
    # larger contexts, timed on one scene of `patch_scene` voxels beside the patch-1,024 models
    patch_models: Tuple[str, ...] = ("ptv3+patch_size=4096", "ptv3+patch_size=16384", "ppomv3+pom_patch_size=4096",
                                     "ppomv3+pom_patch_size=16384", "ppomv3+pom_patch_size=scene")
    patch_scene: int = 40_000
    repeats: int = 3
    conv_points: int = 40_000
    conv_channels: Tuple[int, ...] = (32, 64, 128)
    quality_models: Tuple[str, ...] = ("tiny-ptv3", "tiny-ppomv3", "tiny-ppomv3-value", "tiny-ppomv3-hybrid",
                                       "tiny-ppomv3+pom_patch_size=1024", "tiny-ppomv3+pom_patch_size=4096",
                                       "tiny-ppomv3+pom_patch_size=scene")
    picture_model: str = "tiny-ppomv3"  # whose prediction of a test room is drawn (else the last quality model)
    quality_steps: int = 300
    quality_batch: int = 2
    quality_points: int = 12_000  # sphere crop of each training room (PTv3's point budget, scaled to 2 cores)
    lr: float = RECIPE_LR  # the recipe's rate: the middle of each sweep (cosine to lr / 100)
    lr_factors: Tuple[float, ...] = LR_FACTORS
    # models trained at every rate of the grid; another model takes the best rate of its preset when that is swept
    # (tiny-ppomv3+pom_patch_size=scene: tiny-ppomv3's), else the recipe's
    sweep: Tuple[str, ...] = ("tiny-ptv3", "tiny-ppomv3", "tiny-ppomv3-value", "tiny-ppomv3-hybrid")
    lrs: Tuple[float, ...] = ()  # run only these rates (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    eval_split: str = "test"
    eval_limit: int = 0
    parts: Tuple[str, ...] = ("speed", "conv", "quality")
    data_dir: Optional[str] = None
    model_overrides: Dict[str, Any] = field(default_factory=dict)  # applied to every model (tests: toy sizes)
    seed: int = 0
    out: str = "runs/bench/points"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(presets=("ptv3", "ppomv3"), sizes=(4_000, 10_000), patch_models=("ppomv3+pom_patch_size=scene",),
             patch_scene=10_000, repeats=2, conv_points=10_000, conv_channels=(32,),
             quality_models=("tiny-ptv3", "tiny-ppomv3"), quality_steps=20, quality_points=4_000, eval_limit=2)


def make_scene(voxels: int, seed: int = 0, grid_size: float = 0.02) -> Tuple[torch.Tensor, torch.Tensor]:
    """(feat (n, 6), grid (n, 3)) of a synthetic room voxelised on ``grid_size`` and cropped to the ``voxels``
    voxels nearest a random point (PTv3's sphere crop); rooms are generated until the scene is large enough."""
    from .data import voxelize
    from .synth import make_room

    rng = np.random.default_rng(seed)
    points = voxels * 2
    while True:
        coord, color, normal, _ = make_room(rng, points=points)
        grid, index, _ = voxelize(coord, grid_size, "test")
        if len(index) >= voxels:
            break
        points *= 2
    centre = grid[rng.integers(len(grid))]
    keep = np.argsort(((grid - centre) ** 2).sum(1), kind="stable")[:voxels]
    grid = grid[keep] - grid[keep].min(0)
    feat = np.concatenate([color[index[keep]] / 255.0, normal[index[keep]]], 1).astype(np.float32)
    return torch.from_numpy(feat), torch.from_numpy(grid.astype(np.int64))


@torch.inference_mode()
def run_speed(cfg: PointBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """10⁶ voxels/s of each model per scene size, round-robin (the first preset is the baseline)."""
    from tqdm.auto import tqdm

    allocator = keep_freed_memory()
    torch.manual_seed(cfg.seed)
    rows: List[Dict[str, Any]] = []
    params: Dict[str, int] = {}
    jobs = [(n, list(cfg.presets)) for n in cfg.sizes]
    if cfg.patch_models:
        jobs.append((cfg.patch_scene, list(cfg.presets[:2]) + list(cfg.patch_models)))
    bar = tqdm(total=sum(len(specs) for _, specs in jobs) * (cfg.repeats + 1), disable=not progress,
               desc="bench points speed", unit="call")
    for group, (n, specs) in enumerate(jobs):
        feat, grid = make_scene(n, cfg.seed + n)
        offset = torch.tensor([len(grid)])
        fns, configs = {}, {}
        for spec in specs:
            model = variant_model(spec, **cfg.model_overrides).eval()
            params[spec], configs[spec] = count_parameters(model), model.config
            fns[spec] = (lambda m=model: m(feat, grid, offset))
        timing = time_interleaved(fns, warmup=1, repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
        bar.update(len(fns))
        base = timing[specs[0]].median
        for spec in specs:
            model_cfg, t = configs[spec], timing[spec].median
            rows.append({"set": "contexts" if group == len(cfg.sizes) else "sizes", "voxels": n, "spec": spec,
                         "preset": spec.split("+")[0], "model": describe_variant(spec, NAMES),
                         "attn_patch": model_cfg.patch_size if "A" in model_cfg.pattern else None,
                         "pom_patch": "scene" if "P" in model_cfg.pattern and model_cfg.pom_patch(0) is None
                         else model_cfg.pom_patch(0) if "P" in model_cfg.pattern else None,
                         "s_per_call": t, "mpts_per_s": n / t / 1e6, "speedup": base / t,
                         "spread": timing[spec].spread})
    bar.close()
    return {"rows": rows, "params": params, "allocator_tuned": allocator}


def run_conv(cfg: PointBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Forward + backward of one 3×3×3 submanifold conv: symmetric-map backward vs plain autograd."""
    from ...models.points import neighbour_map, submconv3d

    _, grid = make_scene(cfg.conv_points, cfg.seed)
    nbr = neighbour_map(grid, torch.zeros(len(grid), dtype=torch.long), 3)
    rows = []
    for c in cfg.conv_channels:
        x = torch.randn(len(grid), c, requires_grad=True)
        w = torch.randn(27, c, c, requires_grad=True)
        g = torch.randn(len(grid), c)

        def step(kind: str) -> None:
            torch.autograd.grad(submconv3d(x, w, nbr, backward=kind), (x, w), g)

        timing = time_interleaved({k: (lambda k=k: step(k)) for k in ("symmetric", "autograd")}, warmup=1,
                                  repeats=cfg.repeats)
        a, b = timing["symmetric"].median, timing["autograd"].median
        rows.append({"voxels": len(grid), "channels": c, "symmetric_s": a, "autograd_s": b, "speedup": b / a,
                     "occupancy": float((nbr < len(grid)).float().mean())})
    return {"rows": rows}


def _select(rows: List[Dict[str, Any]], cfg: PointBenchConfig) -> List[Dict[str, Any]]:
    """Order the rows (model, rate), mark each model's best rate (the highest validation mIoU) and give each row its
    test mIoU minus PTv3's at PTv3's best rate."""
    default = PointBenchConfig().quality_models  # the default order first, whichever subset this process ran
    specs = list(dict.fromkeys(list(default) + list(cfg.quality_models) + sorted({r["spec"] for r in rows})))
    rows = sorted(rows, key=lambda r: (specs.index(r["spec"]), r["lr"]))
    mark_best(rows, "val_miou", higher=True, key="spec")
    att = next((r for r in best_rows(rows) if r["spec"] == BASELINE), None)
    for r in rows:
        r["miou_vs_ptv3"] = r["miou"] - att["miou"] if att else None
    return rows


def run_quality(cfg: PointBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Train the quality models with the same steps, batch and seed: each swept model at every rate of the grid, then
    the others at the best rate of their preset where it is swept (among the runs known then), else the recipe's.
    Finished runs are only evaluated again; runs of an earlier points.json not redone keep their rows."""
    from .data import AugmentConfig, PointDataset
    from .synth import resolve_data
    from .task import draw_scene, evaluate_points, train_points
    from ..train.loop import TrainConfig

    root = resolve_data(cfg.data_dir, progress=progress)
    test_set = PointDataset(root, cfg.eval_split, "scannet")
    augment = replace(AugmentConfig.for_format("scannet"), max_points=cfg.quality_points)
    pictures: Dict[str, str] = dict(earlier_part(Path(cfg.out) / "points.json").get("pictures", {}))
    drawn = picture_owner(cfg.picture_model, cfg.quality_models, (Path(cfg.out) / "points_scene.png").is_file())
    parent = {spec: parse_variant(spec)[0] for spec in cfg.quality_models}
    derived = tuple(s for s in cfg.quality_models if s not in cfg.sweep and parent[s] in cfg.sweep)
    first = tuple(s for s in cfg.quality_models if s not in derived)

    def recipe(cfg: PointBenchConfig, job: SweepRun, stage: Stage) -> Any:
        return TrainConfig(steps=cfg.quality_steps, batch_size=cfg.quality_batch, lr=job.lr, min_lr=job.lr / 100,
                           warmup=max(1, cfg.quality_steps // 20), weight_decay=0.05, beta2=0.999,
                           grad_clip=1.0, eval_every=cfg.quality_steps, ckpt_every=cfg.quality_steps,
                           out=str(job.out), progress=progress, seed=cfg.seed + 11)

    def evaluate(cfg: PointBenchConfig, job: SweepRun, stage: Stage,
                 tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        res = train_points(job.preset, tcfg, str(root), "scannet", augment, eval_limit=cfg.eval_limit or None,
                           progress=progress, **job.overrides)
        model = res["model"]
        m = evaluate_points(model, test_set, limit=cfg.eval_limit or None, progress=progress,
                            keep_predictions=1 if job.spec == drawn else 0)
        if m["predictions"]:  # one picture per rate of the drawn model ("" suffix at the recipe's rate)
            scene, pred = m["predictions"][0]
            title = (f"{describe_variant(job.spec, NAMES)}, lr {job.lr:g}, {scene.name}: {cfg.eval_split} mIoU "
                     f"{100 * m['miou']:.1f}%")
            name = "points_scene" + job.out.name[len(job.slug):].replace("-", "_") + ".png"
            pictures["scene"] = draw_scene(scene, pred, test_set.format.class_names, Path(cfg.out) / name,
                                           title).name
        val = res["metrics"]  # the training loop's final evaluation: the validation rooms
        return res, {"model": describe_variant(job.spec, NAMES), "spec": job.spec, "preset": job.preset,
                     "params": count_parameters(model), "pattern": model.config.pattern,
                     "steps": cfg.quality_steps, "batch": cfg.quality_batch,
                     "final_loss": next((h["loss"] for h in reversed(res["history"]) if "loss" in h), None),
                     "val_miou": val.get("miou"), "val_oa": val.get("oa"),
                     "miou": m["miou"], "oa": m["oa"], "scenes": m["scenes"], "points": m["points"],
                     "per_class": {r["name"]: r["iou"] for r in m["per_class"] if r["iou"] is not None}}

    def preset_rates(rows: List[Dict[str, Any]]) -> Dict[str, float]:
        """The best rate of each derived model's preset among the runs known now."""
        best = {r["spec"]: r["lr"] for r in rows if r.get("best_lr")}
        return {s: best[parent[s]] for s in derived if parent[s] in best}

    sweep = QualitySweep("points", RECIPE_LR, ("spec",), recipe, evaluate, _select, lambda rows: "val_miou",
                         model="spec")
    stages = [Stage(first), Stage(derived, rates=preset_rates, rates_label=lambda s: f"best {parent[s]}")]
    return {**sweep.run(cfg, stages), "data": str(root), "split": cfg.eval_split, "pictures": pictures}


def _speed_verdicts(payload: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    rows = [r for r in payload["speed"]["rows"] if r["set"] == "sizes"]
    pom = {r["voxels"]: r for r in rows if r["preset"] == "ppomv3" and r["spec"] == "ppomv3"}
    for n, r in sorted(pom.items()):
        out.append(f"PPoMv3 ÷ PTv3 at {n:,} voxels, patch 1,024: {r['speedup']:.2f}× "
                   f"({'met' if r['speedup'] >= 1.0 else 'MISSED'}: ≥ 1×; the paper: 1.10×)")
    ctx = [r for r in payload["speed"]["rows"] if r["set"] == "contexts"]
    if ctx:
        by = {r["spec"]: r for r in ctx}
        for size in (4096, 16384):
            a, p = by.get(f"ptv3+patch_size={size}"), by.get(f"ppomv3+pom_patch_size={size}")
            if a and p:
                out.append(f"patch {size:,} at {a['voxels']:,} voxels: PPoMv3 {p['mpts_per_s']:.4f} vs PTv3 "
                           f"{a['mpts_per_s']:.4f} 10⁶ pts/s → {a['s_per_call'] / p['s_per_call']:.2f}×")
        whole = by.get("ppomv3+pom_patch_size=scene")
        if whole:
            out.append(f"PPoMv3 with the whole scene as context: {whole['speedup']:.2f}× PTv3 (patch 1,024)")
    return out


def _quality_verdicts(payload: Dict[str, Any], seeds: Optional[Any], main_json: Optional[Any]) -> List[str]:
    out: List[str] = []
    rows = best_rows(quality_rows(payload["quality"], RECIPE_LR))
    by = {r["spec"]: r for r in rows}
    a, p, h = by.get(BASELINE), by.get("tiny-ppomv3"), by.get("tiny-ppomv3-hybrid")
    if a and p:
        d = 100 * (p["miou"] - a["miou"])
        out.append(f"test mIoU: tiny PTv3 {100 * a['miou']:.1f}, tiny PPoMv3 {100 * p['miou']:.1f} ({d:+.1f} "
                   f"points; {'met' if d >= -2 else 'MISSED'}: within 2 points, the paper: −0.8)")
    if a and h:
        d = 100 * (h["miou"] - a["miou"])
        out.append(f"test mIoU: tiny hybrid {100 * h['miou']:.1f} ({d:+.1f} points vs PTv3; "
                   f"{'met' if d >= -1 else 'MISSED'}: level, i.e. within 1 point; the paper: +0.1)")
    out += verdict_lines("points", payload, seeds, main_json)
    out += stale_rate_notes(rows, lambda r: by.get(r["lr_from"][5:]) if r["lr_from"].startswith("best ") else None,
                            lambda r: f"--quality-models {r['spec']}", lambda r: r["model"], lambda p: p["spec"])
    return out


def verdicts(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
             main_json: Optional[Dict[str, Any]] = None) -> List[str]:
    """The point-cloud bench's verdicts (speed against PTv3, the mIoU targets), each met or MISSED with its
    figure, then the parity targets over the seeds (``seeds``, ``main_json``: see
    :func:`~polymixer.experiments.bench.parity.verdict_lines`)."""
    return section_lines(payload, {"speed": _speed_verdicts,
                                   "quality": lambda p: _quality_verdicts(p, seeds, main_json)})


def _speed_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    p = payload["speed"]
    lines += ["10⁶ voxels/s in evaluation (one synthetic room per call, 0.02 m voxels); speedup = the first "
              "model's time (PTv3, patch 1,024) ÷ the model's"
              + ("; glibc malloc set to recycle freed memory" if p.get("allocator_tuned") else ""),
              format_table(p["rows"], ["voxels", "model", "attn_patch", "pom_patch", "s_per_call", "mpts_per_s",
                                       "speedup"],
                           ["voxels", "model", "attention patch", "PoM context", "s / call", "10⁶ pts/s",
                            "speedup"]),
              "params: " + ", ".join(f"{describe_variant(k, NAMES)} {v:,}" for k, v in p["params"].items()
                                     if "+" not in k), ""]
    return lines


def _conv_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    lines += ["submanifold conv 3×3×3, forward + backward: symmetric-map backward vs autograd (scatter-adds)",
              format_table(payload["conv"]["rows"], ["voxels", "channels", "occupancy", "symmetric_s",
                                                     "autograd_s", "speedup"],
                           ["voxels", "channels", "neighbours present", "symmetric s", "autograd s",
                            "speedup"]), ""]
    return lines


def _quality_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    q = payload["quality"]
    all_rows = quality_rows(q, RECIPE_LR)
    table = [{**r, "miou_pct": 100 * r["miou"], "oa_pct": 100 * r["oa"],
              "val_pct": None if r.get("val_miou") is None else 100 * r["val_miou"],
              "diff": None if r.get("miou_vs_ptv3") is None else 100 * r["miou_vs_ptv3"]}
             for r in best_rows(all_rows)]
    split = q.get("split", "test")
    lines += [f"equal budget (same steps, batch, seed) on the synthetic rooms; mIoU / OA % over every point of "
              f"the {split} rooms, each model at its best learning rate: the highest validation mIoU (the "
              f"training loop's final evaluation on the val rooms); models not swept take the best rate of their "
              f"preset (lr from: best <preset>) or the recipe's",
              format_table(table, ["model", "params", "lr", "rates", "lr_from", "steps", "train_min",
                                   "final_loss", "val_pct", "miou_pct", "diff", "oa_pct"],
                           ["model", "params", "best lr", "rates tried", "lr from", "steps", "train min",
                            "final loss", "val mIoU %", "mIoU %", "− PTv3 (points)", "OA %"]),
              "", "every rate (AdamW, warm-up then cosine to lr / 100; * = best by validation mIoU): validation "
                  f"mIoU %, then {split} mIoU %",
              sweep_table(all_rows, "val_miou", "val mIoU %", scale=100),
              sweep_table(all_rows, "miou", f"{split} mIoU %", scale=100)]
    lines += [note for note in [edge_note(all_rows, name="model")] if note] + [""]
    return lines


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The point-cloud bench's text: voxels/s per scene and patch size, the sparse convolution, the quality sweep,
    then the verdicts (``seeds``, ``main_json``: as :func:`verdicts`)."""
    sections = {"speed": _speed_report, "conv": _conv_report, "quality": _quality_report}
    return render_report(payload, sections, verdicts(payload, seeds, main_json))


def plot(payload: Dict[str, Any], path: Path) -> None:
    panels = [k for k in ("speed", "quality") if k in payload]
    if not panels:
        return
    fig, axes = new_figure(len(panels) + ("speed" in payload), width=5.0)
    k = 0
    if "speed" in payload:
        rows = payload["speed"]["rows"]
        ax = axes[0]
        for j, preset in enumerate(dict.fromkeys(r["spec"] for r in rows if r["set"] == "sizes")):
            pts = [r for r in rows if r["spec"] == preset and r["set"] == "sizes"]
            ax.plot([r["voxels"] for r in pts], [r["mpts_per_s"] for r in pts], marker="o", color=f"C{j}",
                    label=NAMES.get(preset, preset))
        ax.set_xscale("log")
        ax.set_xlabel("voxels per scene (patch 1,024)")
        ax.set_ylabel("10⁶ points / s (evaluation)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ctx = [r for r in rows if r["set"] == "contexts"]
        ax = axes[1]
        if ctx:
            ax.barh([r["model"] for r in ctx], [r["mpts_per_s"] for r in ctx],
                    color=["C0" if r["preset"] == "ptv3" else "C1" for r in ctx])
            ax.set_xlabel(f"10⁶ points / s at {ctx[0]['voxels']:,} voxels")
            ax.tick_params(axis="y", labelsize=6)
        k = 2
    if "quality" in payload:
        ax = axes[k]
        rows = best_rows(quality_rows(payload["quality"], RECIPE_LR))  # each model at its best rate
        ax.bar(range(len(rows)), [100 * r["miou"] for r in rows], color=[f"C{j}" for j in range(len(rows))])
        ax.set_xticks(range(len(rows)), [r["model"] for r in rows], rotation=20, ha="right", fontsize=6)
        ax.set_ylabel(f"{payload['quality'].get('split', 'test')} mIoU %")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"PTv3 vs PPoMv3 — {payload['machine']['cpu']}", fontsize=9)
    save_figure(fig, path)


BENCH = FamilyBench("points", {"speed": run_speed, "conv": run_conv, "quality": run_quality}, plot, report,
                    models=("quality_models", "patch_models"))


def run(cfg: PointBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other parts of an earlier run in the same folder."""
    return run_bench(BENCH, cfg, progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PointBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of every part")
    p.add_argument("--parts", nargs="+", choices=["speed", "conv", "quality"], default=list(d.parts))
    p.add_argument("--presets", nargs="+", default=None,
                   help="models of the speed part (the first is the baseline), each optionally with +field=value "
                        "options (e.g. ptv3+attention_shift=2)")
    p.add_argument("--sizes", type=int_at_least(1), nargs="+", default=None, help="voxels per scene in the speed part")
    p.add_argument("--patch-models", nargs="*", default=None,
                   help="context variants timed at --patch-scene voxels (preset+field=value, 'scene' = whole scene; "
                        "none given: none)")
    p.add_argument("--patch-scene", type=int_at_least(1), default=None)
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--quality-models", nargs="+", default=None,
                   help="presets of the quality part, each optionally with +field=value overrides "
                        "(e.g. tiny-ppomv3+pom_patch_size=scene)")
    p.add_argument("--quality-steps", type=int_at_least(1), default=None)
    p.add_argument("--quality-batch", type=int_at_least(1), default=None)
    p.add_argument("--quality-points", type=int_at_least(1), default=None,
                   help="sphere-crop budget of each training room")
    p.add_argument("--eval-limit", type=int_at_least(0), default=None, help="test rooms scored (0: all)")
    p.add_argument("--data", default=None, help="a ScanNet-layout folder for the quality part (default: the "
                                                "synthetic rooms)")
    add_sweep_arguments(p, "points", d.lr, d.lr_factors, d.out, models="quality models",
                        sweep_note="a variant of a swept preset takes that preset's best rate",
                        seed_note="it also seeds the speed scenes")


def main(args: argparse.Namespace) -> int:
    cfg = PointBenchConfig(parts=tuple(args.parts), out=args.out)
    if args.data is not None:
        cfg.data_dir = args.data
    return bench_main(BENCH, args, cfg, QUICK,
                      {n: n for n in ("presets", "sizes", "patch_models", "patch_scene", "repeats", "quality_models",
                                      "quality_steps", "quality_batch", "quality_points", "eval_limit")})
