"""Crop-type segmentation of satellite image time series: the task the shared loop trains (cross-entropy over the
non-void pixels of 24 × 24 windows or whole patches), evaluation (overall accuracy, per-class IoU, mIoU, km²/s, a
confusion-matrix PNG and a PNG of tiles), whole-patch prediction, and the ``polymixer train eo`` / ``eval eo`` /
``segment`` commands."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data import (
    NUM_CLASSES, PASTIS_CLASSES, PASTIS_COLORS, PIXEL_KM2, RGB_BANDS, VOID, BandStats, PastisSplit, band_stats,
    collate, fold_splits, read_metadata, windows,
)
from .synth import resolve_data
from ..data.faults import SampleError, SampleFaults
from ..metrics import ConfusionMatrix
from ...models import create_model, model_config
from ...checkpoint import load_model, read_config, resolve_checkpoint
from ..train.loop import (
    TRAIN_FLAGS, TrainConfig, add_train_config_arguments, model_device, train, train_config_from_args,
)
from ..tasks.common import (
    add_preset_argument, add_set_argument, check_dataset, check_preset, config_overrides, int_at_least,
)

__all__ = ["EOTask", "masked_cross_entropy", "predict_patch", "evaluate_eo", "train_eo", "load_segmenter",
           "rgb_composite", "draw_confusion", "draw_tiles", "colorize"]


def masked_cross_entropy(logits: Tensor, labels: Tensor, void: int = VOID) -> Tensor:
    """Mean cross-entropy over the pixels whose label is not ``void`` (0 when a batch has none), in float32."""
    valid = labels != void
    n = valid.sum()
    loss = F.cross_entropy(logits.float(), labels.masked_fill(~valid, 0), reduction="none")
    return (loss * valid).sum() / n.clamp(min=1)


def _flip(x: np.ndarray, y: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """One of the 8 symmetries of the square (k = 0 … 7) applied to bands (T, H, W, C) and labels (H, W); a
    rectangle is only flipped or turned by 180°, which keep its shape."""
    if k & 4:
        x, y = x[:, :, ::-1], y[:, ::-1]
    r = k & 3 if x.shape[1] == x.shape[2] else k & 2
    return np.ascontiguousarray(np.rot90(x, r, axes=(1, 2))), np.ascontiguousarray(np.rot90(y, r))


class EOTask:
    """Cross-entropy over non-void pixels of training windows drawn at random — the ``crop`` × ``crop`` windows of
    every training patch (TSViT's 25 per PASTIS patch), or whole patches with ``crop=None`` — with, when ``augment``,
    one of the 8 flips / rotations of the square per window. Batches are a pure function of (seed, step): resume and
    data-parallel shards are exact. Series of different lengths are padded and masked."""

    unit = "px"

    def __init__(self, train_split: PastisSplit, val_split: PastisSplit, stats: BandStats, batch_size: int,
                 seed: int, crop: Optional[int] = 24, augment: bool = True, eval_limit: Optional[int] = None,
                 eval_batch: int = 16, faults: Optional[SampleFaults] = None) -> None:
        self.train_split, self.val_split, self.stats = train_split, val_split, stats
        self.faults = faults if faults is not None else SampleFaults()
        self.batch_size, self.seed, self.crop, self.augment = batch_size, seed, crop, augment
        self.windows = windows(train_split, crop)
        if crop is None and len(set(train_split.sizes)) > 1:
            raise ValueError(f"whole-patch training needs patches of one size, got {sorted(set(train_split.sizes))}")
        self.eval_limit, self.eval_batch = eval_limit, eval_batch

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Dict[str, Any]:
        g = np.random.default_rng([self.seed, step])
        picks = g.integers(0, len(self.windows), self.batch_size)
        flips = g.integers(0, 8, self.batch_size) if self.augment else np.zeros(self.batch_size, int)
        n = self.batch_size // shares
        samples = []
        for k in range(share * n, (share + 1) * n):
            x, doy, y = self.faults.pick(int(picks[k]), len(self.windows), self._window)
            x, y = _flip(x, y, int(flips[k]))
            samples.append((x, doy, y))
        x, doy, mask, labels = collate(samples)
        return {"x": x.to(device), "doy": doy.to(device), "mask": mask.to(device), "labels": labels.to(device),
                "pixels": int(labels.numel())}

    def _window(self, j: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        i, top, left = self.windows[j]
        return self.train_split.sample(i, top, left, self.crop, self.stats)

    def count(self, batch: Dict[str, Any]) -> int:
        return batch["pixels"]

    def split(self, batch: Any, part: int, parts: int) -> Any:
        """Context parallelism: every rank of a group takes the whole batch share; the model splits
        the frames of its temporal encoder (each rank an equal share)."""
        return batch

    def loss(self, model: nn.Module, batch: Dict[str, Any]) -> Tensor:
        return masked_cross_entropy(model(batch["x"], batch["doy"], batch["mask"]), batch["labels"])

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        m = evaluate_eo(model, self.val_split, self.stats, window=self.crop, batch=self.eval_batch,
                        limit=self.eval_limit, faults=self.faults)
        return {"loss": m["loss"], "oa": m["oa"], "miou": m["miou"]}


def _starts(length: int, window: int) -> List[int]:
    """Window starts covering [0, length): every ``window`` pixels, the last one moved back to end at ``length``."""
    starts = list(range(0, length - window + 1, window))
    if starts[-1] + window < length:
        starts.append(length - window)
    return starts


@torch.no_grad()
def predict_patch(model: nn.Module, x: Tensor, doy: Tensor, mask: Optional[Tensor] = None,
                  window: Optional[int] = None, batch: int = 16) -> Tensor:
    """Class logits (num_classes, H, W) float32 of one series ``x`` (T, H, W, C): in one call (``window`` None or at
    least the patch), or by ``window`` × ``window`` windows covering every pixel (edge windows moved inward;
    overlapping logits averaged), ``batch`` windows per call. ``window`` must be a multiple of the model's patch."""
    device = next(model.parameters()).device
    x, doy = x.to(device), doy.to(device)
    mask = None if mask is None else mask.to(device)[None]
    T, H, W, _ = x.shape
    if window is None or (window >= H and window >= W):
        return model(x[None], doy[None], mask)[0].float()
    wh, ww = min(window, H), min(window, W)  # a side shorter than the window is taken whole
    boxes = [(t, c) for t in _starts(H, wh) for c in _starts(W, ww)]
    out = torch.zeros(model.config.num_classes, H, W, device=device)
    hits = torch.zeros(1, H, W, device=device)
    for s in range(0, len(boxes), batch):
        chunk = boxes[s:s + batch]
        xs = torch.stack([x[:, t:t + wh, c:c + ww] for t, c in chunk])
        n = len(chunk)
        logits = model(xs, doy[None].expand(n, -1), None if mask is None else mask.expand(n, -1)).float()
        for (t, c), y in zip(chunk, logits):
            out[:, t:t + wh, c:c + ww] += y
            hits[:, t:t + wh, c:c + ww] += 1
    return out / hits


@torch.no_grad()
def evaluate_eo(model: nn.Module, split: PastisSplit, stats: BandStats, window: Optional[int] = 24, batch: int = 16,
                limit: Optional[int] = None, progress: bool = False, keep_predictions: int = 0,
                faults: Optional[SampleFaults] = None) -> Dict[str, Any]:
    """Scores over every pixel of the first ``limit`` patches of ``split`` whose label is not void: overall accuracy,
    per-class IoU, mIoU (classes absent from both truth and prediction excluded), the confusion matrix, the mean
    cross-entropy, and the model's throughput in km²/s (10 m pixels; model time only, data loading excluded).
    Patches are predicted whole (``window=None``) or by windows covering them (:func:`predict_patch`). The first
    ``keep_predictions`` patches' predictions are returned too (for pictures). A bad patch stops with its file's
    name, unless ``faults`` skips bad samples."""
    from tqdm.auto import tqdm

    was = model.training
    model.eval()
    cm = ConfusionMatrix(NUM_CLASSES, ignore_index=VOID, class_names=PASTIS_CLASSES[:NUM_CLASSES])
    n = len(split) if limit is None else min(limit, len(split))
    loss_sum, valid, seconds, pixels = 0.0, 0, 0.0, 0
    kept: List[Dict[str, Any]] = []
    for i in tqdm(range(n), desc="eval eo", disable=not progress, unit="patch"):
        try:
            x, doy, y = split.sample(i, stats=stats)
        except SampleError as e:
            if faults is None:
                raise
            faults.record(e)
            continue
        t0 = time.perf_counter()
        logits = predict_patch(model, torch.from_numpy(x), torch.from_numpy(doy), window=window, batch=batch)
        seconds += time.perf_counter() - t0
        labels = torch.from_numpy(y).to(logits.device)
        pred = logits.argmax(0)
        cm.update(pred, labels)
        v = int((labels != VOID).sum())
        loss_sum += float(masked_cross_entropy(logits[None], labels[None])) * v
        valid += v
        pixels += y.size
        if len(kept) < keep_predictions:
            kept.append({"patch": split.records[i].patch_id, "index": i, "prediction": pred.cpu().numpy(),
                         "labels": y})
    model.train(was)
    scores = cm.as_dict()
    return {**scores, "loss": loss_sum / max(valid, 1), "patches": n, "pixels": pixels, "seconds": seconds,
            "km2_per_s": pixels * PIXEL_KM2 / max(seconds, 1e-9), "window": window, "confusion": cm,
            "predictions": kept}


# ----------------------------------------------------------------------------------------------------------------
# Pictures
# ----------------------------------------------------------------------------------------------------------------


def colorize(classes: np.ndarray) -> np.ndarray:
    """(H, W) class ids 0–19 → (H, W, 3) uint8 in the PASTIS colour map (void white)."""
    return PASTIS_COLORS[np.clip(classes, 0, VOID)]


def rgb_composite(split: PastisSplit, i: int) -> Tuple[np.ndarray, str]:
    """A true-colour picture (B4, B3, B2) of patch i at mid-season — of the dates in the middle third of the
    series, the one with the darkest blue band (the least cloud) — and its date."""
    a = np.load(split.records[i].s2_path, mmap_mode="r")
    order = split.frames(i)
    T = len(order)
    middle = order[T // 3: max(T // 3 + 1, 2 * T // 3)]
    best = min(middle, key=lambda f: float(np.asarray(a[f, 0, ::4, ::4]).mean()))
    rgb = np.asarray(a[best, list(RGB_BANDS)], dtype=np.float32).transpose(1, 2, 0)
    rgb = np.clip(rgb / 3000.0, 0, 1) ** (1 / 1.8)
    return (rgb * 255).astype(np.uint8), split.records[i].dates[best].isoformat()


def draw_confusion(cm: ConfusionMatrix, path: Union[str, Path], title: str = "") -> Path:
    """A PNG of the row-normalised confusion matrix (each true class's pixels spread over the predictions)."""
    from ..report import new_figure, save_figure

    m = cm.matrix.astype(np.float64)
    rows = m / np.maximum(m.sum(1, keepdims=True), 1)
    names = cm.class_names or [str(c) for c in range(cm.num_classes)]
    iou = cm.iou
    fig, (ax,) = new_figure(1, width=9.0, height=8.0)
    im = ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    ticks = range(cm.num_classes)
    ax.set_xticks(ticks)
    ax.set_xticklabels(names, rotation=90, fontsize=7)
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{n} ({'—' if np.isnan(v) else f'{100 * v:.0f}'})" for n, v in zip(names, iou)],
                       fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true class (IoU %)")
    for t in ticks:
        for p in ticks:
            if rows[t, p] >= 0.05:
                ax.text(p, t, f"{100 * rows[t, p]:.0f}", ha="center", va="center", fontsize=5,
                        color="white" if rows[t, p] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title or f"OA {100 * cm.overall_accuracy:.1f}%, mIoU {100 * cm.miou:.1f}%", fontsize=9)
    save_figure(fig, Path(path))
    return Path(path)


def draw_tiles(split: PastisSplit, predictions: Sequence[Dict[str, Any]], path: Union[str, Path],
               title: str = "") -> Path:
    """A PNG with one row per patch: the true-colour composite at mid-season, the ground truth and the prediction
    in the PASTIS colour map (void white), and a legend of the classes shown."""
    from matplotlib.patches import Patch

    from ..report import new_figure, save_figure

    if not predictions:
        raise ValueError("no predictions to draw")
    fig, axes = new_figure(4, width=3.2, height=3.3, nrows=len(predictions))
    shown = set()
    for r, p in enumerate(predictions):
        axes[4 * r + 3].axis("off")
        rgb, date = rgb_composite(split, p["index"])
        truth, pred = p["labels"], p["prediction"]
        shown |= set(np.unique(truth).tolist()) | set(np.unique(pred).tolist())
        valid = truth != VOID
        acc = float((pred[valid] == truth[valid]).mean()) if valid.any() else float("nan")
        panels = ((rgb, f"patch {p['patch']}, {date}"), (colorize(truth), "ground truth"),
                  (colorize(pred), f"prediction ({100 * acc:.0f}% of labelled pixels)"))
        for ax, (im, label) in zip(axes[4 * r:4 * r + 3], panels):
            ax.imshow(im, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(label, fontsize=8)
    handles = [Patch(facecolor=PASTIS_COLORS[c] / 255.0, edgecolor="gray", label=f"{c} {PASTIS_CLASSES[c]}")
               for c in sorted(shown)]
    axes[3].legend(handles=handles, loc="upper left", fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(fig, Path(path))
    return Path(path)


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def train_eo(preset: str, train_cfg: TrainConfig, data: Optional[str] = None, fold: int = 1,
             crop: Optional[int] = 24, norm: str = "auto", augment: bool = True, eval_limit: Optional[int] = None,
             progress: bool = True, **overrides: Any) -> Dict[str, Any]:
    """Load a PASTIS-layout dataset (default: the offline synthetic one), normalise with ``norm`` statistics (see
    :func:`~polymixer.experiments.eo.data.band_stats`; a resumed run keeps its checkpoint's), build ``preset`` for its
    bands and
    crop size, and train on the training folds of ``fold`` with the shared loop, validating on its validation
    fold."""
    check_preset("eo", preset)
    root = resolve_data(data, progress=progress)
    if train_cfg.check_data:
        check_dataset("eo", root, progress=progress, skip_bad_samples=train_cfg.skip_bad_samples)
    splits = fold_splits(fold)
    records = read_metadata(root)
    base = model_config(preset, **overrides)
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    train_split = PastisSplit(root, splits["train"], base.num_bands, base.max_frames, records, faults=faults)
    val_split = PastisSplit(root, splits["val"], base.num_bands, base.max_frames, records, faults=faults)
    size = crop if crop is not None else train_split.sizes[0][0]
    if "image_size" in overrides and overrides["image_size"] != size:
        raise ValueError(f"image_size={overrides['image_size']} differs from the training windows ({size} pixels)")
    overrides["image_size"] = size
    cfg = model_config(preset, **overrides)
    if cfg.num_classes != NUM_CLASSES:
        raise ValueError(f"PASTIS labels hold {NUM_CLASSES} classes (+ void), the model has {cfg.num_classes}")
    saved, trained_on = None, None
    if train_cfg.resume and (Path(train_cfg.out) / "checkpoints").exists():
        try:
            done = read_config(train_cfg.out)
            saved, trained_on = done.get("normalization"), done.get("data", {}).get("path")
        except FileNotFoundError:
            pass
    if trained_on is not None and Path(trained_on).resolve() != root.resolve():
        raise ValueError(f"{train_cfg.out} holds a run trained on {trained_on}, not {root}: resume it with that "
                         f"--data, or train in another folder")
    # a resumed run keeps the statistics its weights were trained with
    stats = BandStats.from_dict(saved) if saved is not None else band_stats(train_split, norm)
    torch.manual_seed(train_cfg.seed)
    model = create_model(preset, device=model_device(train_cfg), **overrides)
    task = EOTask(train_split, val_split, stats, train_cfg.batch_size, train_cfg.seed, crop, augment, eval_limit,
                  faults=faults)
    meta = {"family": "eo", "preset": preset, "model": asdict(cfg), "normalization": stats.to_dict(),
            "classes": list(PASTIS_CLASSES[:NUM_CLASSES]), "void": VOID,
            "data": {"path": str(root), "name": data or "synthetic", "fold": fold, "folds": splits,
                     "train_patches": len(train_split), "val_patches": len(val_split), "windows": len(task.windows),
                     "crop": crop, "augment": augment}}
    return {**train(model, task, train_cfg, meta), "model": model, "stats": stats}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def train_defaults() -> TrainConfig:
    """TSViT's recipe (AdamW, lr 1e-3, no weight decay, warm-up then cosine) at 2-core CPU scale."""
    return TrainConfig(steps=800, batch_size=8, lr=1e-3, min_lr=1e-5, warmup=75, weight_decay=0.0, beta2=0.999,
                       grad_clip=1.0, eval_every=400, ckpt_every=400)


def _crop_arg(value: str) -> Optional[int]:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"crop must be ≥ 0 (0 = whole patches), got {n}")
    return n or None


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    t = train_defaults()
    add_preset_argument(p, "eo")
    p.add_argument("--data", default=None, help="PASTIS folder (metadata.geojson, DATA_S2/, ANNOTATIONS/), or "
                                                "'synthetic' (default) — the offline set, generated on first use")
    p.add_argument("--fold", type=int, choices=range(1, 6), default=1,
                   help="PASTIS fold: train on folds f…f+2, validate on f+3")
    p.add_argument("--crop", type=_crop_arg, default=24, help="training window side in pixels (0: whole patches)")
    p.add_argument("--norm", default="auto", choices=["auto", "file", "computed", "tsvit"],
                   help="band statistics: NORM_S2_patch.json's training folds if present else computed (auto), "
                        "or TSViT's published PASTIS fold-1 values (tsvit)")
    p.add_argument("--mixer", default=None, help="override the preset's blocks (attention, pom, hybrid, a pattern)")
    p.add_argument("--hybrid-pom", default=None, choices=["temporal", "spatial"],
                   help="with --mixer hybrid: the encoder made of PoM blocks")
    p.add_argument("--spatial-position", default=None, choices=["learned", "rope"])
    p.add_argument("--max-frames", type=int_at_least(1), default=None, help="keep the first N dates of longer series")
    p.add_argument("--no-augment", action="store_true", help="no flips / rotations of the training windows")
    p.add_argument("--eval-limit", type=int_at_least(1), default=None, help="validate on the first N patches only")
    add_set_argument(p, "eo")
    add_train_config_arguments(p, t, "run folder (default: runs/eo/<preset>)", TRAIN_FLAGS)


def main_train(args: argparse.Namespace) -> int:
    overrides: Dict[str, Any] = {}
    for name in ("mixer", "hybrid_pom", "spatial_position", "max_frames"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    overrides = config_overrides("eo", args.preset, args.set_fields, overrides)
    tcfg = train_config_from_args(args, train_defaults(), f"runs/eo/{args.preset}")
    res = train_eo(args.preset, tcfg, args.data, args.fold, args.crop, args.norm, not args.no_augment,
                   args.eval_limit, progress=not args.quiet, **overrides)
    if res["rank"] == 0:
        print(json.dumps({"run": tcfg.out, **res["metrics"]}, indent=2))
    return 0


def load_segmenter(ckpt: Union[str, Path], ema: Optional[bool] = None,
                   dtype: str = "fp32") -> Tuple[nn.Module, BandStats, Dict[str, Any]]:
    """(model in evaluation mode, the band statistics it was trained with, the checkpoint's config) — the EMA
    weights when the checkpoint has them; ``dtype="bf16"`` runs the model in bf16 (logits are read in float32)."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    cfg = read_config(ckpt)
    if cfg.get("family") != "eo":
        raise ValueError(f"{ckpt} holds a {cfg.get('family')!r} model, not a time-series segmenter")
    if "normalization" not in cfg:
        raise ValueError(f"{ckpt} has no band normalisation in its config.json")
    model = load_model(ckpt, family="eo", ema=ema).eval()
    if dtype == "bf16":
        model.to(torch.bfloat16)
    return model, BandStats.from_dict(cfg["normalization"]), cfg


def _window_arg(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"window must be ≥ 0 (0 = whole patches), got {n}")
    return n


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--data", default=None, help="PASTIS folder (default: the one the model was trained on)")
    p.add_argument("--fold", type=int, choices=range(1, 6), default=None,
                   help="PASTIS fold (default: the training fold)")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--window", type=_window_arg, default=None,
                   help="predict by windows of this side covering each patch (0: whole patches in one call; "
                        "default: the training window)")
    p.add_argument("--limit", type=int_at_least(1), default=None, help="the first N patches only")
    p.add_argument("--batch", type=int_at_least(1), default=16, help="windows per forward call")
    p.add_argument("--tiles", type=int_at_least(0), default=4, help="patches drawn in the tiles PNG (0: none)")
    p.add_argument("--png", default=None, help="prefix of the PNGs (default: <run>/eval_<split>)")
    p.add_argument("--json", default=None, help="also write the scores (per-class, confusion matrix) to this file")
    p.add_argument("--no-ema", action="store_true")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")


def main_eval(args: argparse.Namespace) -> int:
    from ..report import per_class_table

    model, stats, cfg = load_segmenter(args.ckpt, ema=False if args.no_ema else None, dtype=args.dtype)
    data = cfg.get("data", {})
    root = resolve_data(args.data or data.get("path"))
    fold = args.fold if args.fold is not None else int(data.get("fold", 1))
    folds = fold_splits(fold)[args.split]
    split = PastisSplit(root, folds, model.config.num_bands, model.config.max_frames)
    window = data.get("crop") if args.window is None else (args.window or None)
    m = evaluate_eo(model, split, stats, window=window, batch=args.batch, limit=args.limit, progress=True,
                    keep_predictions=args.tiles)
    summary = {k: m[k] for k in ("oa", "miou", "loss", "km2_per_s", "patches", "pixels", "counted",
                                 "classes_present")}
    print(json.dumps({"ckpt": str(args.ckpt), "preset": cfg.get("preset"), "step": cfg.get("step"), "data": str(root),
                      "fold": fold, "split": args.split, "folds": list(folds),
                      "window": window or "whole patches", **summary}, indent=2))
    print(per_class_table(m, "pixels"))
    prefix = Path(args.png) if args.png else resolve_checkpoint(args.ckpt).parent.parent / f"eval_{args.split}"
    title = (f"{cfg.get('preset')} — {root.name} fold {fold} {args.split}: OA {100 * m['oa']:.1f}%, "
             f"mIoU {100 * m['miou']:.1f}%")
    written = [draw_confusion(m["confusion"], f"{prefix}_confusion.png", title)]
    if m["predictions"]:
        written.append(draw_tiles(split, m["predictions"], f"{prefix}_tiles.png", title))
    print("wrote " + ", ".join(map(str, written)))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "per_class": m["per_class"], "matrix": m["matrix"],
                                               "window": window}, indent=1))
    return 0


def add_segment_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--data", required=True, help="PASTIS folder holding the patch ('synthetic': the offline set)")
    p.add_argument("--patch", type=int, required=True, nargs="+", help="ID_PATCH of the patch(es) to segment")
    p.add_argument("--window", type=_window_arg, default=0,
                   help="0 (default): the whole patch in one call; N: windows of N pixels covering it")
    p.add_argument("--out", default=".", help="folder for <ID>_classes.npy and <ID>_classes.png")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")


def main_segment(args: argparse.Namespace) -> int:
    model, stats, _ = load_segmenter(args.ckpt, dtype=args.dtype)
    root = resolve_data(args.data)
    split = PastisSplit(root, range(1, 6), model.config.num_bands, model.config.max_frames, patches=args.patch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    for pid in args.patch:
        i = split.index_of(pid)
        x, doy, _ = split.sample(i, stats=stats)
        t0 = time.perf_counter()
        classes = predict_patch(model, torch.from_numpy(x), torch.from_numpy(doy), window=args.window or None)
        classes = classes.argmax(0)
        seconds = time.perf_counter() - t0
        classes = classes.cpu().numpy().astype(np.uint8)
        np.save(out / f"{pid}_classes.npy", classes)
        Image.fromarray(colorize(classes)).save(out / f"{pid}_classes.png")
        H, W = classes.shape
        print(f"{pid}: {H}×{W} pixels ({H * W * PIXEL_KM2:.4g} km²) in {seconds:.2f} s → "
              f"{out / f'{pid}_classes.npy'}, {out / f'{pid}_classes.png'}")
    return 0
