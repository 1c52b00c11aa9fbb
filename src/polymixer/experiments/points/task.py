"""3-D semantic segmentation: the task the shared loop trains (PTv3's cross-entropy + Lovász-softmax over voxelised,
augmented scenes), evaluation as PTv3 computes it (intersection and union over the whole split, every original point
through its voxel), and the ``polymixer train points`` / ``eval points`` / ``segment3d`` commands."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.faults import SampleError, SampleFaults
from .data import (
    FORMATS, IGNORE, AugmentConfig, Batch, PointDataset, PointFormat, Scene, augment, collate, detect_format,
    labelled_split, load_ply, load_scannet_scene, load_semantickitti_scan, write_ply,
)
from .synth import resolve_data
from ..metrics import ConfusionMatrix
from ...models import create_model
from ...checkpoint import load_model, read_config, resolve_checkpoint
from ..train.loop import (
    TRAIN_FLAGS, TrainConfig, add_train_config_arguments, model_device, train, train_config_from_args,
)
from ...ranges import Range
from ..tasks.common import (
    add_preset_argument, add_set_argument, check_dataset, check_preset, config_overrides, float_in, int_at_least,
)

__all__ = ["PointTask", "lovasz_softmax", "segmentation_loss", "predict_scene",
           "evaluate_points", "train_points", "load_segmenter", "draw_scene", "class_colors", "read_scene"]

def _lovasz_grad(gt_sorted: Tensor) -> Tensor:
    """Gradient of the Lovász extension of the Jaccard loss w.r.t. sorted errors (Berman et al., CVPR 2018)."""
    gts = gt_sorted.sum()
    intersection = gts - gt_sorted.cumsum(0)
    union = gts + (1.0 - gt_sorted).cumsum(0)
    jaccard = 1.0 - intersection / union
    if len(gt_sorted) > 1:
        jaccard = torch.cat([jaccard[:1], jaccard[1:] - jaccard[:-1]])
    return jaccard


def lovasz_softmax(logits: Tensor, labels: Tensor, ignore: int = IGNORE) -> Tensor:
    """Lovász-softmax loss (the classes present in ``labels``), a surrogate of 1 − IoU optimised directly; PTv3 adds
    it to the cross-entropy. logits (N, K), labels (N,)."""
    valid = labels != ignore
    probs = logits.float().softmax(-1)[valid]
    labels = labels[valid]
    if labels.numel() == 0:
        return logits.sum() * 0.0
    losses = []
    for c in torch.unique(labels).tolist():
        fg = (labels == c).float()
        errors = (fg - probs[:, c]).abs()
        errors_sorted, perm = torch.sort(errors, descending=True)
        losses.append(torch.dot(errors_sorted, _lovasz_grad(fg[perm])))
    return torch.stack(losses).mean()


def segmentation_loss(logits: Tensor, labels: Tensor, lovasz: float = 1.0) -> Tensor:
    """Cross-entropy (ignore −1) + ``lovasz`` × Lovász-softmax, in float32 (PTv3's ScanNet criteria, weights 1, 1)."""
    valid = labels != IGNORE
    ce = F.cross_entropy(logits.float(), labels.masked_fill(~valid, 0), reduction="none")
    loss = (ce * valid).sum() / valid.sum().clamp(min=1)
    return loss + lovasz * lovasz_softmax(logits, labels) if lovasz else loss


class PointTask:
    """Training scenes drawn at random per step, augmented (``augment_cfg``: PTv3's pipeline for the format, None:
    none) and voxelised with a random point per voxel — all a pure function of (seed, step, sample), so resume and
    data-parallel shards are exact."""

    unit = "pts"

    def __init__(self, train_set: PointDataset, val_set: PointDataset, batch_size: int, seed: int,
                 augment_cfg: Optional[AugmentConfig] = None, lovasz: float = 1.0,
                 eval_limit: Optional[int] = None, eval_batch: int = 4, faults: Optional[SampleFaults] = None) -> None:
        self.faults = faults if faults is not None else SampleFaults()
        if len(train_set) == 0:
            raise ValueError(f"no training scenes in {train_set}")
        self.train_set, self.val_set = train_set, val_set
        self.batch_size, self.seed, self.augment_cfg, self.lovasz = batch_size, seed, augment_cfg, lovasz
        self.eval_limit, self.eval_batch = eval_limit, eval_batch
        self.grid_size = train_set.format.grid_size

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Batch:
        picks = np.random.default_rng([self.seed, step]).integers(0, len(self.train_set), self.batch_size)
        n = self.batch_size // shares
        scenes, rngs = [], []
        for k in range(share * n, (share + 1) * n):
            rng = np.random.default_rng([self.seed, step, k])
            s = self.faults.pick(int(picks[k]), len(self.train_set), self.train_set.__getitem__)
            if self.augment_cfg is not None:
                s = augment(s, rng, self.augment_cfg, self.train_set.format.name)
            scenes.append(s)
            rngs.append(rng)
        b = collate(scenes, self.grid_size, "train", rngs)
        return {k: b[k].to(device) for k in ("feat", "grid", "offset", "segment")}

    def count(self, batch: Batch) -> int:
        return int(batch["feat"].shape[0])

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return segmentation_loss(model(batch["feat"], batch["grid"], batch["offset"]), batch["segment"], self.lovasz)

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        m = evaluate_points(model, self.val_set, batch=self.eval_batch, limit=self.eval_limit, faults=self.faults)
        return {"miou": m["miou"], "oa": m["oa"]}


@torch.no_grad()
def predict_scene(model: nn.Module, scenes: Sequence[Scene], grid_size: float
                  ) -> Tuple[List[np.ndarray], float, int]:
    """Per-point class predictions of each scene (voxel predictions mapped back to every original point through the
    voxel's inverse index), the seconds the forward took and the voxels it read; the scenes go as one batch."""
    device = next(model.parameters()).device
    b = collate(scenes, grid_size, "test")
    dtype = next(model.parameters()).dtype
    t0 = time.perf_counter()
    logits = model(b["feat"].to(device, dtype), b["grid"].to(device), b["offset"].to(device))
    seconds = time.perf_counter() - t0
    voxel_pred = logits.float().argmax(-1).cpu()
    starts = [0] + b["offset"].tolist()[:-1]
    counts = torch.diff(b["offset"], prepend=torch.zeros(1, dtype=torch.long)).tolist()
    return [voxel_pred[s:s + n][inv].numpy() for s, n, inv in zip(starts, counts, b["inverse"])], seconds, b["voxels"]


@torch.no_grad()
def evaluate_points(model: nn.Module, dataset: PointDataset, batch: int = 4, limit: Optional[int] = None,
                progress: bool = False, keep_predictions: int = 0,
                faults: Optional[SampleFaults] = None) -> Dict[str, Any]:
    """mIoU as PTv3 computes it — intersection and union accumulated over every original point of the split (ignore
    −1), IoU per class, mean over the classes present — plus overall accuracy and throughput (voxels and original
    points per second of model forward). A bad scene stops with its file's name, unless ``faults`` skips bad
    samples."""
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    fmt = dataset.format
    cm = ConfusionMatrix(len(fmt.class_names), ignore_index=IGNORE, class_names=list(fmt.class_names))
    n = len(dataset) if limit is None else min(limit, len(dataset))
    seconds, points, voxels, kept = 0.0, 0, 0, []
    for s in tqdm(range(0, n, batch), disable=not progress, desc="eval points", dynamic_ncols=True):
        scenes = []
        for i in range(s, min(n, s + batch)):
            try:
                scenes.append(dataset[i])
            except SampleError as e:
                if faults is None:
                    raise
                faults.record(e)
        if not scenes:
            continue
        preds, sec, vox = predict_scene(model, scenes, fmt.grid_size)
        seconds += sec
        voxels += vox
        for scene, pred in zip(scenes, preds):
            points += len(pred)
            if scene.segment is not None:
                cm.update(pred, scene.segment)
            if len(kept) < keep_predictions:
                kept.append((scene, pred))
    model.train(was_training)
    scores = cm.as_dict()
    return {**scores, "scenes": n, "points": points, "voxels": voxels, "seconds": seconds,
            "mpts_per_s": points / max(seconds, 1e-9) / 1e6, "mvoxels_per_s": voxels / max(seconds, 1e-9) / 1e6,
            "confusion": cm, "predictions": kept}


def train_points(preset: str, train_cfg: TrainConfig, data: Optional[str] = None, format: Optional[str] = None,
             augment_data: Union[bool, AugmentConfig] = True, lovasz: float = 1.0, eval_limit: Optional[int] = None,
             progress: bool = True, max_points: Optional[int] = None, **overrides: Any) -> Dict[str, Any]:
    """Train ``preset`` on a point-cloud dataset (default: the offline synthetic rooms in ScanNet's layout) with the
    shared loop; the model's input channels and classes follow the format. ``augment_data``: PTv3's augmentations
    for the format (True), none (False), or a given :class:`AugmentConfig`."""
    check_preset("points", preset)
    root = resolve_data(data, progress=progress)
    if train_cfg.check_data:
        check_dataset("points", root, progress=progress, skip_bad_samples=train_cfg.skip_bad_samples,
                      format=format)
    fmt_name = format or detect_format(root)
    fmt = FORMATS[fmt_name]
    train_set = PointDataset(root, "train", fmt_name)
    val_set = PointDataset(root, "val", fmt_name)
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    overrides.setdefault("in_channels", fmt.in_channels)
    overrides.setdefault("num_classes", len(fmt.class_names))
    torch.manual_seed(train_cfg.seed)
    model = create_model(preset, device=model_device(train_cfg), **overrides)
    if isinstance(augment_data, AugmentConfig):
        augment_cfg: Optional[AugmentConfig] = augment_data
    else:
        augment_cfg = AugmentConfig.for_format(fmt_name) if augment_data else None
    if max_points is not None:  # the training crop; evaluation always reads whole scenes
        base = augment_cfg if augment_cfg is not None else AugmentConfig.off()
        augment_cfg = replace(base, max_points=max_points or None)
    task = PointTask(train_set, val_set, train_cfg.batch_size, train_cfg.seed, augment_cfg, lovasz, eval_limit,
                     faults=faults)
    meta = {"family": "points", "preset": preset, "model": asdict(model.config),
            "data": {"path": str(root), "name": data or "rooms", "format": fmt_name, "grid_size": fmt.grid_size,
                     "classes": list(fmt.class_names), "train_scenes": len(train_set), "val_scenes": len(val_set),
                     "augment": None if augment_cfg is None else augment_cfg.to_dict(), "lovasz": lovasz}}
    return {**train(model, task, train_cfg, meta), "model": model}


# ----------------------------------------------------------------------------------------------------------------
# plots and files
# ----------------------------------------------------------------------------------------------------------------

def class_colors(num_classes: int) -> np.ndarray:
    """(num_classes + 1, 3) uint8: one colour per class (tab20, then hsv), the last row grey for ignored points."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    cols = [cmap(i % 20)[:3] for i in range(num_classes)] + [(0.6, 0.6, 0.6)]
    return (np.asarray(cols) * 255).astype(np.uint8)


def draw_scene(scene: Scene, prediction: np.ndarray, class_names: Sequence[str], path: Union[str, Path],
               title: str = "") -> Path:
    """Top view of a scene: colour (when it has one), ground truth, prediction side by side."""
    from ..report import new_figure, save_figure

    colors = class_colors(len(class_names))
    order = np.argsort(scene.coord[:, 2])  # the highest points drawn last, as seen from above
    xy = scene.coord[order, :2]
    panels: List[Tuple[str, np.ndarray]] = []
    if scene.color is not None:
        panels.append(("input colour", scene.color[order] / 255.0))
    if scene.segment is not None:
        panels.append(("ground truth", colors[scene.segment[order]] / 255.0))
    panels.append(("prediction", colors[prediction[order]] / 255.0))
    fig, axes = new_figure(len(panels), width=4.2, height=4.6)
    size = max(0.2, min(3.0, 4e4 / max(len(xy), 1)))
    for ax, (name, c) in zip(axes, panels):
        ax.scatter(xy[:, 0], xy[:, 1], c=c, s=size, linewidths=0)
        ax.set_title(name)
        ax.set_aspect("equal")
        ax.axis("off")
    present = sorted(set(np.unique(prediction).tolist()) | (set(np.unique(scene.segment).tolist()) - {IGNORE}
                                                             if scene.segment is not None else set()))
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(color=colors[c] / 255.0, label=class_names[c]) for c in present]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 7), fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(bottom=0.12, top=0.9)
    path = Path(path)
    save_figure(fig, path)
    return path


def read_scene(path: Union[str, Path], format: str) -> Scene:
    """One scene from a path: a ScanNet-layout scene folder, a .ply, or a SemanticKITTI .bin (its .label beside it
    in ../labels/ when present)."""
    p = Path(path)
    if p.is_dir():
        return load_scannet_scene(p)
    if p.suffix == ".ply":
        return load_ply(p, format if format in ("scannet", "ply") else "scannet")
    if p.suffix == ".bin":
        label = p.parent.parent / "labels" / (p.stem + ".label")
        return load_semantickitti_scan(p, label if label.is_file() else None)
    raise ValueError(f"{p}: expected a ScanNet scene folder, a .ply or a SemanticKITTI .bin")


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------

TINY_MAX_POINTS = 12_000  # the tiny presets' training crop: PTv3's point budget scaled to 2 CPU cores


def train_defaults() -> TrainConfig:
    """PTv3's ScanNet recipe (AdamW lr 0.006, weight decay 0.05, blocks at 0.1× the rate, warm-up 5% then cosine)
    at 2-core CPU scale: 2 rooms per step (each sphere-cropped to 12,000 points for the tiny presets), 300 steps —
    the setting of ``bench points``' quality part."""
    return TrainConfig(steps=300, batch_size=2, lr=6e-3, min_lr=6e-5, warmup=15, weight_decay=0.05, beta2=0.999,
                       grad_clip=1.0, eval_every=300, ckpt_every=100)


def _patch_arg(value: str) -> Any:
    """A patch size: a positive int, or "scene" (kept as the string until the overrides are built)."""
    if value in ("scene", "none", "None", "0"):
        return "scene"
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"patch size must be positive or 'scene', got {value}")
    return n


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_preset_argument(p, "points")
    p.add_argument("--data", default=None, help="dataset folder, or 'rooms' (default): synthetic indoor rooms in "
                                                "ScanNet's layout, generated offline on first use")
    p.add_argument("--format", default=None, choices=sorted(FORMATS),
                   help="dataset format (default: detected from the folder)")
    p.add_argument("--mixer", default=None,
                   help="override the preset's blocks: attention, pom, hybrid or a pattern (default: the preset's)")
    p.add_argument("--patch-size", type=_patch_arg, default=None,
                   help="attention patch size, or 'scene': whole scenes (default: the preset's, 1,024 points)")
    p.add_argument("--pom-patch-size", type=_patch_arg, default=None,
                   help="PoM context in every stage, or 'scene': the whole scene (default: the preset's)")
    p.add_argument("--no-augment", action="store_true", help="no augmentation of the training scenes")
    p.add_argument("--lovasz", type=float_in(Range(0)), default=1.0,
                   help="weight of the Lovász-softmax term (0: cross-entropy)")
    p.add_argument("--eval-limit", type=int_at_least(1), default=None,
                   help="validate on the first N scenes only (default: every validation scene)")
    p.add_argument("--max-points", type=int_at_least(0), default=None, metavar="N",
                   help=f"sphere-crop each training scene to N points (0: whole scenes; default: "
                        f"{TINY_MAX_POINTS:,} for the tiny presets, the format's own — PTv3's 102,400 indoors — for "
                        f"the others); evaluation always reads whole scenes")
    add_set_argument(p, "points")
    add_train_config_arguments(p, train_defaults(), "run folder (default: runs/points/<preset>)", TRAIN_FLAGS)


def main_train(args: argparse.Namespace) -> int:
    overrides: Dict[str, Any] = {}
    if args.mixer is not None:
        overrides["mixer"] = args.mixer
    for name in ("patch_size", "pom_patch_size"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = None if value == "scene" else value
    overrides = config_overrides("points", args.preset, args.set_fields, overrides)
    tcfg = train_config_from_args(args, train_defaults(), f"runs/points/{args.preset}")
    max_points = args.max_points if args.max_points is not None else \
        (TINY_MAX_POINTS if args.preset.startswith("tiny-") else None)
    res = train_points(args.preset, tcfg, args.data, args.format, not args.no_augment, args.lovasz, args.eval_limit,
                       progress=not args.quiet, max_points=max_points, **overrides)
    if res["rank"] == 0:
        print(json.dumps({"run": tcfg.out, **res["metrics"]}, indent=2))
    return 0


def load_segmenter(ckpt: Union[str, Path], ema: Optional[bool] = None,
                   dtype: str = "fp32") -> Tuple[nn.Module, Dict[str, Any]]:
    """(model in evaluation mode, the checkpoint's config) — EMA weights when the checkpoint has them."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    cfg = read_config(ckpt)
    if cfg.get("family") != "points":
        raise ValueError(f"{ckpt} holds a {cfg.get('family')!r} model, not a point-cloud segmenter")
    model = load_model(ckpt, family="points", ema=ema).eval()
    if dtype == "bf16":
        model.to(torch.bfloat16)
    return model, cfg


def _format_of(cfg: Dict[str, Any]) -> PointFormat:
    return FORMATS[cfg.get("data", {}).get("format", "scannet")]


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--data", default=None, help="dataset folder (default: the one the model was trained on)")
    p.add_argument("--split", default=None, choices=["train", "val", "test"],
                   help="split to evaluate (default: the first labelled one, test else val — ScanNet's and "
                        "SemanticKITTI's test scenes carry no labels)")
    p.add_argument("--limit", type=int_at_least(1), default=None, help="the first N scenes only")
    p.add_argument("--batch", type=int_at_least(1), default=4, help="scenes per forward call")
    p.add_argument("--scenes", type=int_at_least(0), default=2, help="scenes drawn in the PNG (0: none)")
    p.add_argument("--png", default=None, help="prefix of the PNGs (default: <run>/eval_<split>)")
    p.add_argument("--json", default=None, help="also write the scores (per class, confusion matrix) to this file")
    p.add_argument("--no-ema", action="store_true", help="the raw weights even where the checkpoint has EMA weights")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="compute dtype of the forward pass")


def main_eval(args: argparse.Namespace) -> int:
    from ..report import per_class_table

    model, cfg = load_segmenter(args.ckpt, ema=False if args.no_ema else None, dtype=args.dtype)
    data = cfg.get("data", {})
    root = resolve_data(args.data or data.get("path"))
    fmt = data.get("format") or detect_format(root)
    if args.split is None:
        args.split = labelled_split(root, fmt)
        print(f"evaluating the {args.split} split (the first labelled one; --split to choose)", file=sys.stderr)
    dataset = PointDataset(root, args.split, fmt)
    m = evaluate_points(model, dataset, batch=args.batch, limit=args.limit, progress=True, keep_predictions=args.scenes)
    summary = {k: m[k] for k in ("miou", "oa", "mpts_per_s", "mvoxels_per_s", "scenes", "points", "voxels",
                                 "counted", "classes_present")}
    print(json.dumps({"ckpt": str(args.ckpt), "preset": cfg.get("preset"), "step": cfg.get("step"),
                      "data": str(root), "format": fmt, "split": args.split, **summary}, indent=2))
    print(per_class_table(m, "points"))
    prefix = Path(args.png) if args.png else resolve_checkpoint(args.ckpt).parent.parent / f"eval_{args.split}"
    written = []
    for i, (scene, pred) in enumerate(m["predictions"]):
        title = f"{cfg.get('preset')} — {scene.name}: split mIoU {100 * m['miou']:.1f}%"
        written.append(draw_scene(scene, pred, dataset.format.class_names, f"{prefix}_scene{i}.png", title))
    if written:
        print("wrote " + ", ".join(map(str, written)))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "per_class": m["per_class"], "matrix": m["matrix"]},
                                              indent=1))
    return 0


def add_segment3d_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("scene", nargs="+",
                   help="ScanNet-layout scene folder(s), .ply file(s) or SemanticKITTI .bin scan(s)")
    p.add_argument("--out", default=".", help="folder for <name>_labels.npy, <name>_labels.ply and <name>.png")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")


def main_segment3d(args: argparse.Namespace) -> int:
    model, cfg = load_segmenter(args.ckpt, dtype=args.dtype)
    fmt = _format_of(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    colors = class_colors(len(fmt.class_names))
    for path in args.scene:
        scene = read_scene(path, fmt.name)
        if scene.feat.shape[1] != model.config.in_channels:
            raise ValueError(f"{path}: {scene.feat.shape[1]} input features per point, the model takes "
                             f"{model.config.in_channels} ({fmt.feature_desc})")
        t0 = time.perf_counter()
        (pred,), _, _ = predict_scene(model, [scene], fmt.grid_size)
        seconds = time.perf_counter() - t0
        name = Path(path).stem if Path(path).is_file() else Path(path).name
        np.save(out / f"{name}_labels.npy", pred.astype(np.int64))
        write_ply(out / f"{name}_labels.ply", scene.coord, colors[pred], pred)
        draw_scene(scene, pred, fmt.class_names, out / f"{name}.png", f"{cfg.get('preset')} — {name}")
        print(f"{name}: {len(pred):,} points in {seconds:.2f} s → {out / f'{name}_labels.npy'}, "
              f"{out / f'{name}_labels.ply'}, {out / f'{name}.png'}")
    return 0
